"""The compiled loops of :class:`numpyro_deer.MCMC`, built on a block kernel.

A block kernel offers ``block_warmup`` (one warmup step), ``block_refill`` (a
new block where the buffer is used up) and ``block_emit`` (the state after
handing out one buffer entry). The loops here run warmup as a ``fori_loop`` of
``block_warmup``, and each sampling iteration as one refill whose draws are
postprocessed with :func:`jax.vmap` and scattered into the collection at the
slots NumPyro's ``fori_collect`` would use, thinning included.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..core.newton import RESULTS
from . import compile_cache
from . import numpyro_compat as compat
from .block import needs_refill

__all__ = [
    "LoopFns",
    "all_need_refill",
    "buffer_size",
    "build_loop_fns",
    "max_block_steps",
    "zeros",
]


def collection_slots(n, start_idx, thinning, valid, size):
    """Slot of loop iteration ``n`` in the collection, as ``fori_collect`` places it.

    ``fori_collect`` writes iteration ``n`` to slot ``(n - start_idx) // thinning``
    and later iterations overwrite earlier ones, so a slot keeps the last
    iteration of its thinning group. Anything else goes to ``size`` (dropped).
    """
    offset = n - start_idx
    keep = valid & (offset >= 0) & (offset % thinning == thinning - 1)
    return jnp.where(keep, offset // thinning, size)


def scatter(collection, slots, values):
    return jax.tree.map(
        lambda c, v: c.at[slots].set(v.astype(c.dtype), mode="drop"), collection, values
    )


class LoopFns(NamedTuple):
    """The driver's functions for one model, kernel and run settings.

    Attributes:
        warmup: ``(state, collection, trace, n0, n1, start_idx, dynamic)``,
            warmup steps ``n0`` to ``n1`` as one ``fori_loop``, jitted,
            without the Hessian window ends: the host runs ``window_end``
            then ``step_size`` at the kernel's ``window_ends``, programs that
            compile beside this loop.
        step_size: ``(state, use, dynamic) -> state``, the kernel's
            ``block_step_size`` (after the initial state and each window
            end), jitted.
        window_end: ``(state, dynamic) -> (state, finite)``, the kernel's
            ``block_window_end``, jitted.
        block_step: one block refilled and scattered into the collection,
            jitted.
        run_all: warmup (window ends inside its steps) and every block in one
            function, not jitted: it runs inside the chains' ``pmap``.
        collected: ``(state, dynamic)``, the postprocessed fields of a state.
        checked: the set the driver records its memory check in.
    """

    warmup: Callable
    step_size: Callable
    window_end: Callable
    block_step: Callable
    run_all: Callable
    collected: Callable
    checked: set


def build_loop_fns(
    sampler, collect_fields, remove_sites, batched, size, thinning, static, user_post
):
    """The driver's loops over ``sampler``'s block protocol (:class:`LoopFns`).

    The model's array arguments (``dynamic``) are arguments, its static ones
    (``static``) are closed over, so the loops serve every ``MCMC`` object
    with the same model, settings and shapes.
    """
    # a snapshot: changing or re-initialising the kernel later cannot
    # change what these functions compute
    kernel = compile_cache.snapshot(sampler)

    def postprocess(z, args, kwargs):
        # NumPyro's postprocessing (MCMC._get_cached_fns), without the
        # MCMC object: the functions may serve other MCMC objects
        body = user_post
        if body is None:
            body = kernel.postprocess_fn(args, kwargs)
        return jax.vmap(body)(z) if batched else body(z)

    transform = compat.collect_transform(postprocess, collect_fields, remove_sites)

    def unflatten(dynamic):
        return compile_cache.join_model_args(static, dynamic)

    def collected(state, args, kwargs):
        return transform((state, args, kwargs))

    def warmup_steps(state, collection, trace, n0, n1, start_idx, dynamic, ends):
        """Warmup steps ``n0`` to ``n1``; ``trace[n]`` is step ``n``'s
        potential energy (for the warmup check). ``ends=False``: without
        the Hessian window ends (see ``LoopFns.window_end``)."""
        args, kwargs = unflatten(dynamic)

        def body(n, carry):
            state, collection, trace = carry
            state = kernel.block_warmup(
                state, args, kwargs, batched=batched, window_end=ends
            )
            slot = collection_slots(n, start_idx, thinning, True, size)
            value = jax.tree.map(lambda x: x[None], collected(state, args, kwargs))
            trace = trace.at[n].set(state.potential_energy, mode="drop")
            return state, scatter(collection, slot[None], value), trace

        return jax.lax.fori_loop(n0, n1, body, (state, collection, trace))

    def warmup_loop(state, collection, trace, n0, n1, start_idx, dynamic):
        return warmup_steps(
            state, collection, trace, n0, n1, start_idx, dynamic, ends=False
        )

    def step_size(state, use, dynamic):
        return kernel.block_step_size(state, use, *unflatten(dynamic), batched=batched)

    def window_end(state, dynamic):
        return kernel.block_window_end(state, *unflatten(dynamic), batched=batched)

    def block_step(state, collection, done, stats, n_offset, total, start_idx, dynamic):
        args, kwargs = unflatten(dynamic)
        state = kernel.block_refill(state, args, kwargs, batched=batched)
        # the buffer's own size: a post_warmup_state may come from a kernel
        # with another block_size
        block_size = buffer_size(state, batched)
        index = state.block.index[0] if batched else state.block.index
        k = jnp.arange(block_size)
        draws = jax.vmap(
            lambda k: collected(
                kernel.block_emit(state, k, batched=batched), args, kwargs
            )
        )(k)
        sample_n = done + k - index
        valid = (k >= index) & (sample_n < total)
        slots = collection_slots(n_offset + sample_n, start_idx, thinning, valid, size)
        collection = scatter(collection, slots, draws)
        consumed = jnp.minimum(block_size - index, total - done)
        state = kernel.block_emit(state, index + consumed - 1, batched=batched)
        info = state.block.info
        failed = (index == 0) & ~info.converged
        stats = (
            stats[0] + (index == 0).astype(jnp.int32),
            stats[1] + jnp.sum(failed, dtype=jnp.int32),
            # bit c for every result code c of a failed block
            stats[2] | result_bits(failed, info.result),
        )
        return state, collection, done + consumed, stats

    def run_all(state, collection, trace, n_warmup, total, start_idx, dynamic):
        state, collection, trace = warmup_steps(
            state, collection, trace, 0, n_warmup, start_idx, dynamic, ends=True
        )
        zero = jnp.zeros((), jnp.int32)
        limit = max_block_steps(total, buffer_size(state, batched))

        def body(carry):
            *carry, steps = carry
            carry = block_step(*carry, n_warmup, total, start_idx, dynamic)
            return (*carry, steps + 1)

        def cond(carry):
            return (carry[2] < total) & (carry[4] < limit)

        state, collection, done, stats, _ = jax.lax.while_loop(
            cond, body, (state, collection, zero, (zero, zero, zero), zero)
        )
        return state, collection, stats, done, trace

    # the collection is updated in place where the backend can donate
    donate = () if jax.default_backend() == "cpu" else (1,)
    return LoopFns(
        warmup=compile_cache.jit(warmup_loop, donate_argnums=donate),
        step_size=compile_cache.jit(step_size),
        window_end=compile_cache.jit(window_end),
        block_step=compile_cache.jit(block_step, donate_argnums=donate),
        run_all=run_all,
        collected=lambda state, dynamic: collected(state, *unflatten(dynamic)),
        checked=set(),
    )


def zeros(avals: Any) -> Any:
    """Zero arrays of the shapes and dtypes of ``avals`` (a pytree of
    ``jax.ShapeDtypeStruct``), made on the device by one compiled program per
    layout: ``jnp.zeros`` per leaf would compile a program per shape and dtype
    the first time."""
    leaves, treedef = jax.tree.flatten(avals)
    layout = tuple((tuple(a.shape), jnp.dtype(a.dtype)) for a in leaves)
    return jax.tree.unflatten(treedef, _zeros(layout))


@partial(jax.jit, static_argnums=0)
def _zeros(layout: tuple) -> list:
    return [jnp.zeros(shape, dtype) for shape, dtype in layout]


@partial(jax.jit, static_argnums=1)
def all_need_refill(state, batched: bool) -> jax.Array:
    """Whether every chain's buffer needs a refill (:func:`needs_refill`), in
    one compiled program rather than its operations one by one."""
    fresh = jax.vmap(needs_refill)(state) if batched else needs_refill(state)
    return jnp.all(fresh)


def buffer_size(state, batched: bool) -> int:
    """Draws per block of the state's buffer (its own, not the kernel's)."""
    return state.block.z.shape[1 if batched else 0]


def max_block_steps(total, block_size: int):
    """Most loop iterations ``total`` draws can take: each iteration after the
    first (which may start in a partly used buffer) hands out a whole block."""
    return total // block_size + 2


def result_bits(failed, result) -> jax.Array:
    """Bit ``c`` set for every result code ``c`` of a failed block (any chain).

    With maxima over the chains, not a bitwise-or reduction: chains split over
    a mesh reduce across devices, and the CPU's collectives have no
    bitwise-or.
    """
    codes = jnp.asarray(tuple(RESULTS), dtype=jnp.int32)
    hit = failed[..., None] & (result[..., None] == codes)
    seen = jnp.max(hit.astype(jnp.int32).reshape(-1, codes.size), axis=0)
    return jnp.sum(seen << codes, dtype=jnp.int32)
