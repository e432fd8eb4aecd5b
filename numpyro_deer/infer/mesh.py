"""A kernel's blocks solved over several devices (``DEERMALA(model, mesh=...)``).

With a :class:`jax.sharding.Mesh` the kernel solves each block with
:func:`~numpyro_deer.core.sharded_deer_solve`: the block's ``B`` steps are split
over the ``n`` devices of the mesh's time axis, ``B / n`` consecutive steps per
device, and the devices exchange ``O(D)`` numbers per Newton iteration (see
:mod:`numpyro_deer.core.sharded`). Everything else of a chain's state lives
replicated on the devices of its time axis: :func:`TimeMesh.place` puts the
initial state there, so warmup runs as the same computation on each of them (no
communication: it takes what it takes on one), and :func:`TimeMesh.gather`
makes the solved block replicated again, so the buffer and the collection of
draws can be read on every device and every host.

Chains:

* a one-axis mesh (or a mesh of several axes, one named ``"time"``, run with
  one chain or with ``chain_method="sequential"``) runs one chain over the
  whole mesh; several chains run one after the other, each over the mesh;
* a mesh of two axes, ``"time"`` and one other (the *chain axis*, e.g.
  ``Mesh(devices.reshape(2, 4), ("chain", "time"))``), runs vectorized chains
  (``chain_method="vectorized"``) split over the chain axis:
  ``num_chains / c`` chains on each of its ``c`` rows of devices, each chain's
  blocks over its row's time axis (:func:`TimeMesh.map_chains`). Warmup and
  the buffers are split the same way: each chain is warmed up on its own row.

Limits, each checked with an error that names ``mesh``:

* ``chain_method="parallel"`` is refused (``"vectorized"`` with a chain axis
  runs the chains on separate devices); vectorized chains need a mesh of two
  axes whose chain axis' device count divides ``num_chains``;
* ``block_size`` must be a multiple of the time axis' device count
  (:class:`numpyro_deer.MCMC` keeps the blocks it fits to the run multiples
  of it);
* blocks are DEER solves: ``method="auto"`` means ``"deer"``, and
  ``method="sequential"`` is refused (a sequential scan cannot be split
  over devices).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..core.newton import NewtonInfo
from ..core.sharded import sharded_deer_solve
from ..core.transition import StepFn
from .method import MethodChoice

TIME_AXIS = "time"
"""The mesh axis a block's time axis is split over, when the mesh has several."""

MESH_CHOICE = MethodChoice(
    "deer", "mesh: DEER's solve with the block's time axis over the mesh", {}
)
"""What ``method="auto"`` is with a mesh (nothing is measured)."""


class TimeMesh:
    """A mesh and the name of its axis that the blocks' time axis is split over.

    Hashable (it is part of the kernel's compile key) and picklable: it pickles
    as device ids, which the unpickling process must have.
    """

    def __init__(self, mesh: Mesh, axis_name: str):
        self.mesh = mesh
        self.axis_name = axis_name

    @property
    def size(self) -> int:
        """Devices on the time axis: the shards of a block."""
        return int(self.mesh.shape[self.axis_name])

    def _key(self) -> tuple:
        return (self.mesh, self.axis_name)

    def __eq__(self, other) -> bool:
        return isinstance(other, TimeMesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        shape = dict(self.mesh.shape)
        return f"TimeMesh({shape}, axis_name={self.axis_name!r})"

    def __reduce__(self):
        ids = np.vectorize(lambda d: d.id, otypes=[int])(self.mesh.devices)
        return (_rebuild, (ids.tolist(), tuple(self.mesh.axis_names), self.axis_name))

    @property
    def chain_axis(self) -> str | None:
        """The mesh axis vectorized chains are split over: the one axis that
        is not the time axis (``None`` unless the mesh has exactly two)."""
        others = [name for name in self.mesh.axis_names if name != self.axis_name]
        return others[0] if len(others) == 1 else None

    @property
    def chain_size(self) -> int:
        """Devices on the chain axis (1 without one)."""
        axis = self.chain_axis
        return 1 if axis is None else int(self.mesh.shape[axis])

    def place(self, tree: Any, chains: bool = False) -> Any:
        """``tree`` replicated on every device of the mesh; with ``chains``,
        its leading (chain) axis split over the chain axis."""
        spec = PartitionSpec(self.chain_axis) if chains else PartitionSpec()
        return jax.device_put(tree, NamedSharding(self.mesh, spec))

    def split_chains(self, tree: Any) -> Any:
        """Inside ``jit``: ``tree``'s leading (chain) axis split over the chain
        axis, replicated over the time axis."""
        sharding = NamedSharding(self.mesh, PartitionSpec(self.chain_axis))
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
        )

    def map_chains(self, fn, tree: Any) -> Any:
        """Inside ``jit``: ``fn`` over the leading chain axis of ``tree``.

        :func:`jax.vmap` with the chain axis as ``spmd_axis_name``: the chains
        are split over the chain axis, and the ``shard_map`` of each chain's
        solve (:meth:`solve`) runs on its row of devices, its time axis over
        them.
        """
        mapped = jax.vmap(fn, spmd_axis_name=self.chain_axis)
        return self.split_chains(mapped(self.split_chains(tree)))

    def gather(self, tree: Any) -> Any:
        """Inside ``jit``: ``tree`` replicated on every device of the mesh."""
        sharding = NamedSharding(self.mesh, PartitionSpec())
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
        )

    def solve(
        self,
        make_step: Callable[[Any], StepFn],
        x0: jax.Array,
        tape: Any,
        key: jax.Array,
        solver,
        params: Any,
    ) -> tuple[jax.Array, Any, NewtonInfo]:
        """:func:`~numpyro_deer.core.sharded_deer_solve` of the step
        ``make_step(params)`` over the time axis, its states and step infos
        gathered (replicated on the devices of the time axis)."""
        # the tape split along time where it is drawn, not drawn whole on
        # every device and then sliced
        split = NamedSharding(self.mesh, PartitionSpec(self.axis_name))
        tape = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, split), tape)
        states, aux, info = sharded_deer_solve(
            make_step,
            x0,
            tape,
            key,
            solver,
            self.mesh,
            self.axis_name,
            step_params=params,
            # (vmapped over the chain axis: see sharded_deer_solve)
            check_vma=self.chain_axis is None,
        )
        return self.gather(states), self.gather(aux), info


def _rebuild(ids: list, axis_names: tuple, axis_name: str) -> TimeMesh:
    by_id = {d.id: d for d in jax.devices()}
    missing = sorted(set(np.ravel(ids).tolist()) - set(by_id))
    if missing:
        raise ValueError(
            f"The kernel's mesh was built on devices {missing}, which this process "
            "does not have: build the kernel again with a mesh of its devices."
        )
    devices = np.vectorize(by_id.get, otypes=[object])(np.asarray(ids))
    return TimeMesh(Mesh(devices, axis_names), axis_name)


def check_mesh(name: str, mesh: Any, block_size: int, method: str) -> TimeMesh | None:
    """The kernel's ``mesh`` argument as a :class:`TimeMesh`, or ``None``.

    Raises ``ValueError`` naming ``mesh`` for a value that is not a mesh, a
    mesh of several axes none of which is named ``"time"``, a time axis whose
    device count does not divide ``block_size``, or ``method="sequential"``.
    """
    if mesh is None:
        return None
    if not isinstance(mesh, Mesh):
        raise ValueError(
            f"{name}(mesh={mesh!r}): pass a jax.sharding.Mesh, e.g. "
            "numpyro_deer.core.time_mesh() (all devices on one axis named 'time')."
        )
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        axis_name = names[0]
    elif TIME_AXIS in names:
        axis_name = TIME_AXIS
    else:
        raise ValueError(
            f"{name}(mesh=...): the mesh has axes {names}; name the axis the blocks' "
            f"time axis is split over {TIME_AXIS!r}, or pass a one-axis mesh "
            "(numpyro_deer.core.time_mesh(devices))."
        )
    # axes of automatic sharding (jax.make_mesh's may be explicit, which
    # shard_map would refuse for the unsharded values of the kernel's state)
    time_mesh = TimeMesh(Mesh(mesh.devices, names), axis_name)
    if block_size % time_mesh.size:
        lower = block_size - block_size % time_mesh.size
        raise ValueError(
            f"{name}(block_size={block_size}, mesh=...): the block is split over "
            f"the {time_mesh.size} devices of the mesh's axis {axis_name!r}, so "
            f"block_size must be a multiple of {time_mesh.size}: use e.g. "
            f"block_size={lower or time_mesh.size} or {lower + time_mesh.size}, "
            f"or a mesh whose device count divides {block_size}."
        )
    if method == "sequential":
        raise ValueError(
            f"{name}(method='sequential', mesh=...): a sequential scan runs on one "
            "device; the mesh splits DEER's solve. Use method='deer' or 'auto' "
            "(which means 'deer' with a mesh), or drop `mesh` for the sequential "
            "scan."
        )
    return time_mesh


def fit_to_mesh(block_size: int, mesh: TimeMesh | None) -> int:
    """``block_size`` rounded up to a multiple of the mesh's time axis.

    A block size fitted to the run (at most the kernel's ``block_size``, which
    is a multiple of the device count) stays at most ``block_size``.
    """
    if mesh is None:
        return block_size
    return -(-block_size // mesh.size) * mesh.size


def check_chains(
    name: str, mesh: TimeMesh | None, num_chains: int | None, rng_key
) -> None:
    """Check the chains of ``init`` against the mesh.

    ``num_chains`` is the number of vectorized chains (``None``: one chain).
    Raises ``ValueError`` naming ``mesh`` for chains inside ``pmap`` or
    ``jit`` (``chain_method="parallel"``), vectorized chains on a mesh
    without a chain axis, and a chain axis whose device count does not divide
    ``num_chains``.
    """
    if mesh is None:
        return
    axes = tuple(mesh.mesh.axis_names)
    if isinstance(rng_key, jax.core.Tracer):
        raise ValueError(
            f"{name}(mesh=...) splits each block over the mesh, so chains cannot "
            "run on separate devices through chain_method='parallel' (or init "
            "inside jit): use MCMC(..., chain_method='vectorized') with a mesh of "
            f"two axes, {TIME_AXIS!r} and one for the chains (e.g. "
            "Mesh(devices.reshape(2, 4), ('chain', 'time'))), or "
            "chain_method='sequential' (each chain over the whole mesh in turn)."
        )
    if num_chains is None:
        return
    if mesh.chain_axis is None:
        raise ValueError(
            f"{name}(mesh=...): the mesh has axes {axes} and runs one chain over "
            "the whole mesh, so chains cannot run side by side "
            "(chain_method='vectorized'): use MCMC(..., "
            "chain_method='sequential') for several chains (each over the mesh "
            f"in turn), a mesh of two axes, {TIME_AXIS!r} and one for the chains "
            "(e.g. Mesh(devices.reshape(2, 4), ('chain', 'time'))), or drop "
            "`mesh` to run chains on separate devices."
        )
    size = mesh.chain_size
    if num_chains % size:
        axis = mesh.chain_axis
        raise ValueError(
            f"{name}(mesh=...) with MCMC(num_chains={num_chains}, "
            f"chain_method='vectorized'): the chains are split over the "
            f"{size} devices of the mesh's chain axis {axis!r}, so num_chains "
            f"must be a multiple of {size}: use num_chains={size} (or another "
            f"multiple of {size}), or a mesh whose axis {axis!r} has "
            f"{num_chains} devices (or a divisor of {num_chains})."
        )
