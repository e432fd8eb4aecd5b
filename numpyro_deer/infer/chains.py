"""Chains side by side, initial values and the initial potential."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree


def on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def map_chains(fn: Callable, state: Any, group: int | None = None) -> Any:
    """``fn`` over the leading chain axis: ``vmap``, or ``lax.map`` on the CPU.

    With ``group``, ``vmap`` over groups of at most ``group`` chains and
    ``lax.map`` over the groups (:func:`map_chain_groups`): what a device
    holds at once is one group's, not every chain's.

    On the CPU, batched LAPACK kernels (Cholesky, ``eigh``, triangular solves
    of a dense mass matrix, one per chain) split their batch over XLA's
    intra-op thread pool and wait for it from a thread of that pool; two such
    kernels running at once can wait on each other forever when the pool is
    small (observed: 4 chains, ``D = 64``, 2 cores, every thread asleep in
    ``ParallelBatchMap``). Mapping the chains one after the other keeps each
    kernel unbatched; on the CPU it costs about what sequential chains do.
    """
    if on_cpu():
        return jax.lax.map(fn, state)
    if group is not None:
        return map_chain_groups(fn, state, group)
    return jax.vmap(fn)(state)


def has_chain_axis(params: Any, num_chains: int) -> bool:
    leaves = jax.tree.leaves(params)
    return bool(leaves) and all(
        jnp.ndim(x) >= 1 and jnp.shape(x)[0] == num_chains for x in leaves
    )


def float_params(params: Any) -> Any:
    """Integer or boolean initial values as floats (the latent space is real)."""

    def to_float(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(jnp.result_type(float))

    return jax.tree.map(to_float, params)


def latent_layout(params: Any, batched: bool) -> tuple[Any, Callable]:
    """``(flat, unravel)`` of one chain's latent values, compiling nothing.

    ``flat`` is the shape and dtype (a ``jax.ShapeDtypeStruct``) of
    ``ravel_pytree`` of one chain's values (the first along the leading chain
    axis when ``batched``), ``unravel`` its inverse: the same as ``ravel_pytree``
    gives, traced abstractly with ``jax.eval_shape`` rather than run, which
    would compile a program per reshape and per concatenation.
    """
    unravels = []

    def ravel_one(tree):
        one = jax.tree.map(lambda x: x[0], tree) if batched else tree
        flat, unravel = ravel_pytree(one)
        unravels.append(unravel)
        return flat

    flat = jax.eval_shape(ravel_one, params)
    return flat, unravels[0]


def check_initial_potential(potential_energy) -> None:
    """Raise ``ValueError`` if a chain's initial potential is not finite.

    Checked with numpy on the host (one scalar per chain): eager ``jnp``
    operations would each compile a program the first time.
    """
    if isinstance(potential_energy, jax.core.Tracer):
        return
    if not np.all(np.isfinite(np.asarray(potential_energy))):
        raise ValueError(
            "The potential energy at the initial parameters is not "
            "finite. Check the model's data and priors, or pass valid "
            "`init_params` (unconstrained values) or another `init_strategy`."
        )


def map_chain_groups(fn: Callable, state: Any, group: int) -> Any:
    """``fn`` over the leading chain axis, ``vmap`` within groups of chains and
    ``lax.map`` over the groups, one after the other (:func:`map_groups`)."""
    return map_groups(jax.vmap(fn), state, group)


def map_groups(batch_fn: Callable, state: Any, group: int) -> Any:
    """``batch_fn`` (a function of a batch of chains) over groups of chains,
    one group after the other (``lax.map``).

    ``C`` chains make ``n = ceil(C / group)`` groups of ``g = ceil(C / n) <=
    group`` chains each (as even as ``n`` groups can be); the ``n g - C``
    slots left over in the last group repeat the first chains, and their
    results are dropped. Each chain's result is the one ``batch_fn`` of all
    chains gives where the chains do not interact.
    """
    chains = jax.tree.leaves(state)[0].shape[0]
    groups = -(-chains // group)
    if groups <= 1:
        return batch_fn(state)
    size = -(-chains // groups)
    pad = groups * size - chains

    def split(x):
        if pad:
            x = jnp.concatenate([x, x[:pad]])
        return x.reshape((groups, size) + x.shape[1:])

    def join(y):
        return y.reshape((groups * size,) + y.shape[2:])[:chains]

    out = jax.lax.map(batch_fn, jax.tree.map(split, state))
    return jax.tree.map(join, out)
