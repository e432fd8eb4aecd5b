r"""DEER with one block's time axis sharded over several devices.

:func:`~numpyro_deer.core.deer_solve` puts the whole block of ``T`` steps on one
device. :func:`sharded_deer_solve` splits the time axis over the ``n`` devices
of a one-dimensional :class:`jax.sharding.Mesh`: device ``d`` holds the steps
``d L + 1 .. (d + 1) L`` (``L = T / n``) and runs, inside
:func:`jax.shard_map`, the same Newton iteration on its slice:

1. **Shift.** Step ``t`` needs ``s_{t-1}``; the first step of a slice takes the
   last state of the previous device (:func:`jax.lax.ppermute`), device 0 takes
   ``s_0``.
2. **Linearise.** The slice's ``f_t`` and ``J_t`` come from the solver's own
   :meth:`linearize`, so every Jacobian strategy works. A stochastic
   strategy's probe key is folded with the iteration and the device index, so
   no two global steps share a probe.
3. **Stopping test and front.** Each device counts its leading passed steps;
   the global front is the minimum (:func:`jax.lax.pmin`) of ``d L + passed_d``
   over the devices whose slice does not pass entirely (``T`` if all pass). The
   certificate (the largest residual of the newly frozen steps) is reduced
   with :func:`jax.lax.pmax`. Frozen steps map to themselves
   (``A = 0, b = s_t``) and the first unfrozen step is ``F_t`` exactly, as in
   :func:`~numpyro_deer.core.deer_solve`, so the front grows by at
   least one step per iteration and the first ``k`` states are exact after
   ``k`` iterations.
4. **Linear step.** The strategy's own Newton step (``newton_step``, the one
   ``deer_solve`` uses) with a two-level scan of the affine recursion
   ``s_t = A_t s_{t-1} + b_t``. Each device scans its slice from a zero
   incoming state (the strategy's scan, as in ``deer_solve``), giving
   ``c_t``; its whole slice is the affine map ``(P, c_L)`` with
   ``P = A_L ... A_1``. These ``n`` maps are all-gathered and scanned over the
   devices, which gives each device its incoming state ``s_in`` (the end state
   of device ``d - 1``); a second scan of the slice adds the response
   ``A_t ... A_1 s_in``. Global step 1 always has ``A = 0`` (it is frozen or
   the first unfrozen step), so ``s_0`` never enters the scan, as in the
   unsharded solver. On a one-device mesh only the first scan runs.

Devices exchange ``O(D)`` (diagonal) or ``O(D^2)`` (dense) numbers per
iteration, whatever ``T``, in six small collectives; the work per device is
that of a block of ``L`` steps with two scans instead of one, plus a scan of
length ``n``.

``solver.sweep`` is ignored (no sequential segments: the iteration counts are
those of ``sweep=0``; the chain is the same). Everything else -- tolerances,
``max_iter``, ``max_solves``, :class:`~numpyro_deer.core.NewtonInfo` and its
result code -- is that of :func:`~numpyro_deer.core.deer_solve`.

The same function runs on several hosts: after :func:`jax.distributed.initialize`
:func:`jax.devices` lists the devices of all processes and :func:`time_mesh`
builds the global mesh (see ``docs/scaling.md``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Mesh, PartitionSpec

from .iteration import IterationCarry, Layout, newton_iteration
from .jacobian import JacobianStrategy
from .newton import DEERSolver, NewtonInfo, solve_loop
from .transition import StepFn

try:  # jax >= 0.6.1
    _shard_map_fn = jax.shard_map

    def _check(check_vma: bool) -> dict:
        return {"check_vma": check_vma}

except AttributeError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map as _shard_map_fn

    def _check(check_vma: bool) -> dict:
        return {"check_rep": False}


def _to_varying(x: Array, axis_name: str) -> Array:
    """Mark a value that is equal on all devices as per-device (for loop carries)."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axis_name, to="varying")
    if hasattr(jax.lax, "pvary"):  # pragma: no cover - jax 0.6 / 0.7
        return jax.lax.pvary(x, axis_name)
    return x  # pragma: no cover - no varying-axis checks


_DEFAULT_SOLVER = DEERSolver()


def time_mesh(devices: Any = None, axis_name: str = "time") -> Mesh:
    """A one-dimensional mesh over ``devices`` for :func:`sharded_deer_solve`.

    Args:
        devices: a sequence of devices; default all devices of all processes
            (:func:`jax.devices`), ordered by process and then by id, so each
            host holds a contiguous stretch of the time axis and only
            ``num_hosts - 1`` slice boundaries cross hosts.
        axis_name: name of the mesh axis.

    Returns:
        ``Mesh(devices, (axis_name,))``.
    """
    if devices is None:
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    devices = list(devices)
    if not devices:
        raise ValueError("time_mesh(devices=[]): give at least one device.")
    return Mesh(np.array(devices, dtype=object), (axis_name,))


def _sharded_affine_scan(
    strategy: JacobianStrategy,
    axis_name: str,
    device: Array,
    num_devices: int,
    A: Array,
    b: Array,
) -> Array:
    """The recursion ``s_t = A_t s_{t-1} + b_t`` (``s_0 = 0``) over all devices."""
    # The slice's states from a zero incoming state; the same scan as deer_solve.
    local = strategy.scan(A, b)
    if num_devices == 1:
        return local
    totals_A = jax.lax.all_gather(strategy.compose(A), axis_name)  # (n, D[, D])
    totals_b = jax.lax.all_gather(local[-1], axis_name)  # (n, D)
    ends = strategy.scan(totals_A, totals_b)  # the end state of each slice
    incoming = jnp.concatenate([jnp.zeros_like(ends[:1]), ends[:-1]])[device]
    # Add the response to the incoming state, s_t += A_t ... A_1 s_in, with a
    # second scan of the same kind. (Returning every prefix product A_t ... A_1
    # from one scan is the same arithmetic, but XLA fused that scan into a single
    # kernel that ran 3x slower than the whole unsharded iteration on an H200.)
    first = strategy.matvec(A[0], incoming)
    return local + strategy.scan(A, jnp.zeros_like(b).at[0].set(first))


def _slice_layout(
    solver: DEERSolver,
    x0: Array,
    axis_name: str,
    num_devices: int,
    local_steps: int,
) -> Layout:
    """This device's slice of the block (inside ``shard_map``), for
    :func:`~numpyro_deer.core.iteration.newton_iteration`."""
    device = jax.lax.axis_index(axis_name)

    def rows(cur):
        # step t needs s_{t-1}: the first row's comes from the previous device
        from_left = jax.lax.ppermute(
            cur[-1], axis_name, [(i, i + 1) for i in range(num_devices - 1)]
        )
        prev = jnp.concatenate([jnp.where(device == 0, x0, from_left)[None], cur[:-1]])
        return prev, cur

    def probe_key(key, iteration):
        key = jax.random.fold_in(key, iteration)
        return jax.random.fold_in(key, device) if num_devices > 1 else key

    return Layout(
        rows=rows,
        write=lambda states, new_cur: new_cur,
        probe_key=probe_key,
        offset=device * local_steps,
        num_steps=local_steps * num_devices,
        reduce_min=partial(jax.lax.pmin, axis_name=axis_name),
        reduce_max=partial(jax.lax.pmax, axis_name=axis_name),
        scan=partial(
            _sharded_affine_scan,
            solver.jacobian_for(x0.shape[-1]),
            axis_name,
            device,
            num_devices,
        ),
    )


def _check_mesh(mesh: Mesh, axis_name: str, num_steps: int) -> int:
    if axis_name not in mesh.axis_names:
        raise ValueError(
            f"sharded_deer_solve(axis_name={axis_name!r}): the mesh has axes "
            f"{tuple(mesh.axis_names)}; pass axis_name= one of them or build the "
            "mesh with time_mesh()."
        )
    num_devices = mesh.shape[axis_name]
    if num_steps % num_devices:
        lower = num_steps - num_steps % num_devices
        raise ValueError(
            f"sharded_deer_solve: the block has T={num_steps} steps, which is not "
            f"divisible by the {num_devices} devices of mesh axis {axis_name!r}. "
            f"Set the block size to a multiple of {num_devices} (e.g. "
            f"{lower or num_devices} or {lower + num_devices}) or use a mesh whose "
            f"device count divides {num_steps}."
        )
    return num_devices


def sharded_deer_solve(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    key: Array,
    solver: DEERSolver = _DEFAULT_SOLVER,
    mesh: Mesh | None = None,
    axis_name: str = "time",
    *,
    init_states: Array | None = None,
    step_params: Any = None,
    check_vma: bool = True,
) -> tuple[Array, Any, NewtonInfo]:
    """Solve a block of ``T`` taped steps in parallel, its time axis over a mesh.

    The contract is that of :func:`~numpyro_deer.core.deer_solve`: the same result
    (the same chain, up to the certified tolerance), the same
    :class:`~numpyro_deer.core.NewtonInfo` (front, certificate, result
    code), the same ``max_iter`` / ``max_solves`` loop. A stochastic
    Jacobian draws other probes than the unsharded solve, so the iteration
    counts may differ; the chain does not. ``solver.sweep`` is ignored (no
    sequential segments).

    Call it under :func:`jax.jit`; the returned ``states`` and ``aux`` are
    sharded along the time axis, the ``info`` fields are replicated.

    Args:
        step_fn: ``(x, tape_t) -> (x_new, aux)``, the taped step.
        x0: the fixed state ``s_0``, shape ``(D,)``.
        tape: the tape, a pytree of arrays with leading axis ``T``; ``T`` must
            be divisible by the number of devices on ``axis_name``.
        key: key for stochastic Jacobian strategies (kept apart from the tape).
        solver: the solver settings.
        mesh: a mesh with an axis ``axis_name``; default :func:`time_mesh`
            over all devices. Other mesh axes, if any, hold replicas, or
            other chains' solves under ``jax.vmap(..., spmd_axis_name=...)``;
            the Newton loops then run in lockstep over them (the slowest
            solve's iterations, the others keeping their iterate), since a
            collective of the time axis is one operation of all devices.
        axis_name: the mesh axis the time axis is split over.
        init_states: initial guess ``(T, D)``; default ``x0`` repeated.
        step_params: a pytree of arrays the step depends on (e.g. a chain's
            mass matrix and step size); then ``step_fn(step_params)`` is the
            taped step. They enter ``shard_map`` as replicated arguments, so
            the solve can be mapped over chains with
            ``jax.vmap(..., spmd_axis_name=...)``: per-chain values a plain
            ``step_fn`` closes over would not be split with the chains.
        check_vma: ``shard_map``'s check of the values' varying mesh axes.
            Pass ``False`` under ``jax.vmap(..., spmd_axis_name=...)``, where
            JAX 0.10's check refuses the solve (values created inside the
            step vary over the time axis only).

    Returns:
        ``(states, aux, info)`` as for :func:`~numpyro_deer.core.deer_solve`. Only
        ``states[:front]`` is exact when ``info.converged`` is false.

    Raises:
        ValueError: ``T`` is not divisible by the device count, or the mesh has
            no axis ``axis_name``.
    """
    num_steps = jax.tree.leaves(tape)[0].shape[0]
    mesh = time_mesh(axis_name=axis_name) if mesh is None else mesh
    num_devices = _check_mesh(mesh, axis_name, num_steps)
    local_steps = num_steps // num_devices
    x0 = jnp.asarray(x0)
    make_step = (lambda _: step_fn) if step_params is None else step_fn
    _, aux_shape = jax.eval_shape(
        lambda p, x, t: make_step(p)(x, t),
        step_params,
        x0,
        jax.tree.map(lambda x: x[0], tape),
    )

    # Other mesh axes hold replicas or other chains' solves (under
    # jax.vmap(..., spmd_axis_name=...)). A collective of the time axis is
    # one operation of all devices, so every loop takes the trips of the
    # slowest solve (the others keep their carry).
    others = tuple(name for name in mesh.axis_names if name != axis_name)
    sync = None
    if others:

        def sync(flag):
            return jax.lax.pmax(flag.astype(jnp.int32), others) > 0

    def solve(x0, tape, key, init_states, step_params):
        step_fn = make_step(step_params)
        if init_states is None:
            init_states = _to_varying(
                jnp.broadcast_to(x0, (local_steps,) + x0.shape), axis_name
            )
        aux = jax.tree.map(
            lambda s: _to_varying(
                jnp.zeros((local_steps,) + s.shape, s.dtype), axis_name
            ),
            aux_shape,
        )
        zero = jnp.zeros((), jnp.int32)
        passed = _to_varying(jnp.zeros((local_steps,), bool), axis_name)
        carry = IterationCarry(
            init_states,
            aux,
            zero,
            zero,
            jnp.zeros((), x0.dtype),
            jnp.zeros((), bool),
            passed,
        )
        layout = _slice_layout(solver, x0, axis_name, num_devices, local_steps)

        def iteration(c):
            return newton_iteration(step_fn, solver, tape, key, c, layout)

        carry, info = solve_loop(iteration, carry, num_steps, solver, sync)
        return carry.states, carry.aux, info

    time, replicated = PartitionSpec(axis_name), PartitionSpec()
    in_specs = (
        replicated,
        time,
        replicated,
        None if init_states is None else time,
        replicated,
    )
    sharded = _shard_map_fn(
        solve,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=(time, time, replicated),
        **_check(check_vma),
    )
    return sharded(x0, tape, key, init_states, step_params)
