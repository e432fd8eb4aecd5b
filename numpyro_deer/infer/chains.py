"""Chains side by side, initial values and the initial potential."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def map_chains(fn: Callable, state: Any) -> Any:
    """``fn`` over the leading chain axis: ``vmap``, or ``lax.map`` on the CPU.

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


def check_initial_potential(potential_energy) -> None:
    if isinstance(potential_energy, jax.core.Tracer):
        return
    if not bool(jnp.all(jnp.isfinite(potential_energy))):
        raise ValueError(
            "The potential energy at the initial parameters is not "
            "finite. Check the model's data and priors, or pass valid "
            "`init_params` (unconstrained values) or another `init_strategy`."
        )
