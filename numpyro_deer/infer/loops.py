"""The compiled loops of :class:`numpyro_deer.MCMC`, built on a block kernel's run.

A run (:class:`~numpyro_deer.infer.program.BlockProgram`) offers ``warmup``
(one warmup step), ``refill`` (a new block where the buffer is used up) and
``emit`` (the state after handing out one buffer entry). The loops here run
warmup as a ``fori_loop`` of ``warmup``, and each sampling iteration as one
refill whose draws are
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
from . import compile_cache, lowering
from . import numpyro_compat as compat
from .block import needs_refill

__all__ = [
    "LoopFns",
    "LoopSettings",
    "all_need_refill",
    "buffer_size",
    "loop_fns",
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


class LoopSettings(NamedTuple):
    """The driver's settings the loops are traced with (hashable: part of
    their compile-cache keys).

    Attributes:
        collect_fields: the state fields collected (NumPyro's).
        remove_sites: sites left out of the collection (NumPyro's).
        batched: vectorized chains (a leading chain axis on the state).
        size: draws collected.
        thinning: NumPyro's thinning.
        static: the model arguments' structure and non-array leaves
            (:func:`~numpyro_deer.infer.compile_cache.split_model_args`).
        postprocess_fn: the ``MCMC`` object's own ``postprocess_fn``, or
            ``None`` for the kernel's.
        collect_warmup: whether a warmup step falls in the collection
            (NumPyro's ``collect_warmup``); without, the warmup loop
            postprocesses no state (the model's deterministic sites are
            computed for collected draws only).
    """

    collect_fields: tuple
    remove_sites: tuple
    batched: bool
    size: int
    thinning: int
    static: Any
    postprocess_fn: Callable | None
    collect_warmup: bool = True


class LoopFns(NamedTuple):
    """The driver's functions for one run (:func:`loop_fns`).

    Attributes:
        warmup: ``(state, collection, trace, n0, n1, start_idx, dynamic)``,
            warmup steps ``n0`` to ``n1`` as one ``fori_loop``, jitted,
            without the Hessian window ends: the host runs ``window_end``
            then ``step_size`` at the program's ``window_ends``, programs that
            compile beside this loop.
        step_size: ``(state, use, dynamic) -> state``, the program's
            ``step_size`` (after the initial state and each window end),
            jitted.
        window_end: ``(state, dynamic) -> (state, finite)``, the program's
            ``window_end``, jitted.
        block_step: one block refilled by the run's method and scattered
            into the collection, jitted.
        run_all: warmup (window ends inside its steps) and every block in one
            function, not jitted: it runs inside the chains' ``pmap``.
        collected: ``(state, dynamic)``, the postprocessed fields of a state,
            jitted (the driver takes its output's shapes with
            :func:`jax.eval_shape`, which then traces it once per shape).
        checked: the set the driver records the block program's memory
            check in (once per compiled program).
    """

    warmup: Callable
    step_size: Callable
    window_end: Callable
    block_step: Callable
    run_all: Callable
    collected: Callable
    checked: set


def loop_fns(program, method: str, settings: LoopSettings) -> LoopFns:
    """The driver's loops over ``program``'s steps, blocks by ``method``.

    The model's array arguments (``dynamic``) are arguments of the loops,
    the rest (``settings.static``) is closed over, so new data of the same
    shape reuses them and is read afresh. The warmup programs and the block
    step are kept in :mod:`~numpyro_deer.infer.compile_cache` under the
    program's :meth:`~numpyro_deer.infer.program.BlockProgram.key` and
    ``settings``: warmup's without the method (``method="auto"`` measures
    both methods after one warmup), so a second ``MCMC`` object for the same
    model, settings and shapes compiles none of them again.
    """
    traced = _Traced(program, settings)
    warm = compile_cache.cached(
        ("warmup", program.key(None), settings), lambda: _warmup_fns(traced)
    )
    block = compile_cache.cached(
        ("blocks", program.key(method), settings),
        lambda: _block_fns(traced, method),
    )
    collected = compile_cache.cached(
        ("collected", program.key(None), settings),
        lambda: jax.jit(traced.collected_dynamic),
    )
    return LoopFns(
        warmup=warm[0],
        step_size=warm[1],
        window_end=warm[2],
        block_step=block[0],
        run_all=partial(_run_all, traced, method),
        collected=collected,
        checked=block[1],
    )


class _Traced(NamedTuple):
    """What the loops close over: the program and the driver's settings."""

    program: Any
    settings: LoopSettings

    def unflatten(self, dynamic):
        return compile_cache.join_model_args(self.settings.static, dynamic)

    def collected(self, state, args, kwargs):
        s = self.settings

        def postprocess(z, args, kwargs):
            # NumPyro's postprocessing (MCMC._get_cached_fns), without the
            # MCMC object: the functions may serve other MCMC objects
            body = s.postprocess_fn
            if body is None:
                body = self.program.postprocess(args, kwargs)
            return jax.vmap(body)(z) if s.batched else body(z)

        transform = compat.collect_transform(
            postprocess, s.collect_fields, s.remove_sites
        )
        return transform((state, args, kwargs))

    def collected_dynamic(self, state, dynamic):
        return self.collected(state, *self.unflatten(dynamic))

    def warmup_steps(self, state, collection, trace, n0, n1, start_idx, dynamic, ends):
        """Warmup steps ``n0`` to ``n1``; ``trace[n]`` is step ``n``'s
        potential energy (for the warmup check). ``ends=False``: without
        the Hessian window ends (see ``LoopFns.window_end``)."""
        args, kwargs = self.unflatten(dynamic)
        s = self.settings

        def body(n, carry):
            state, collection, trace = carry
            state = self.program.warmup(state, args, kwargs, s.batched, ends)
            trace = trace.at[n].set(state.potential_energy, mode="drop")
            if not s.collect_warmup:
                return state, collection, trace
            slot = collection_slots(n, start_idx, s.thinning, True, s.size)
            value = jax.tree.map(lambda x: x[None], self.collected(state, args, kwargs))
            return state, scatter(collection, slot[None], value), trace

        return jax.lax.fori_loop(n0, n1, body, (state, collection, trace))

    def block_step(
        self,
        method,
        state,
        collection,
        done,
        stats,
        n_offset,
        total,
        start_idx,
        dynamic,
    ):
        args, kwargs = self.unflatten(dynamic)
        s, program = self.settings, self.program
        state = program.refill(state, args, kwargs, method, s.batched)
        # the buffer's own size: a post_warmup_state may come from a kernel
        # with another block_size
        block_size = buffer_size(state, s.batched)
        index = state.block.index[0] if s.batched else state.block.index
        k = jnp.arange(block_size)
        draws = jax.vmap(
            lambda k: self.collected(program.emit(state, k, s.batched), args, kwargs)
        )(k)
        sample_n = done + k - index
        valid = (k >= index) & (sample_n < total)
        slots = collection_slots(
            n_offset + sample_n, start_idx, s.thinning, valid, s.size
        )
        collection = scatter(collection, slots, draws)
        consumed = jnp.minimum(block_size - index, total - done)
        state = program.emit(state, index + consumed - 1, s.batched)
        info = state.block.info
        failed = (index == 0) & ~info.converged
        fresh = jnp.broadcast_to(index == 0, failed.shape)  # a block per chain
        stats = (
            stats[0] + jnp.sum(fresh, dtype=jnp.int32),
            stats[1] + jnp.sum(failed, dtype=jnp.int32),
            # bit c for every result code c of a failed block
            stats[2] | result_bits(failed, info.result),
        )
        return state, collection, done + consumed, stats


def _donate() -> tuple:
    # the collection is updated in place where the backend can donate
    return () if jax.default_backend() == "cpu" else (1,)


def _warmup_fns(traced: _Traced) -> tuple:
    """``(warmup loop, step size, window end)``, jitted."""
    batched = traced.settings.batched

    def warmup_loop(state, collection, trace, n0, n1, start_idx, dynamic):
        return traced.warmup_steps(
            state, collection, trace, n0, n1, start_idx, dynamic, ends=False
        )

    def step_size(state, use, dynamic):
        args, kwargs = traced.unflatten(dynamic)
        return traced.program.step_size(state, use, args, kwargs, batched)

    def window_end(state, dynamic):
        args, kwargs = traced.unflatten(dynamic)
        return traced.program.window_end(state, args, kwargs, batched)

    return (
        lowering.jit(warmup_loop, donate_argnums=_donate()),
        lowering.jit(step_size, runs_briefly=True),
        lowering.jit(window_end),
    )


def _block_fns(traced: _Traced, method: str) -> tuple:
    """``(block step, memory-check record)``, the step jitted."""

    def block_step(*args):
        return traced.block_step(method, *args)

    return lowering.jit(block_step, donate_argnums=_donate()), set()


def _run_all(
    traced: _Traced,
    method,
    state,
    collection,
    trace,
    n_warmup,
    total,
    start_idx,
    dynamic,
):
    state, collection, trace = traced.warmup_steps(
        state, collection, trace, 0, n_warmup, start_idx, dynamic, ends=True
    )
    zero = jnp.zeros((), jnp.int32)
    limit = max_block_steps(total, buffer_size(state, traced.settings.batched))

    def body(carry):
        *carry, steps = carry
        carry = traced.block_step(method, *carry, n_warmup, total, start_idx, dynamic)
        return (*carry, steps + 1)

    def cond(carry):
        return (carry[2] < total) & (carry[4] < limit)

    state, collection, done, stats, _ = jax.lax.while_loop(
        cond, body, (state, collection, zero, (zero, zero, zero), zero)
    )
    return state, collection, stats, done, trace


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
