r"""Sequential segments that start each Newton iteration: the sweep.

Where the chain's Jacobian changes faster than ``J`` follows it (a
funnel's neck, a run of accept decisions near their threshold) a stretch of
failing steps shrinks from its left end by a few steps per iteration, and
every iteration pays for the whole block. Such stretches start at the front
and at *local fronts*: failing steps whose predecessor passed. With
``sweep = k > 0`` an iteration first computes ``k`` steps one after the other
from each of them (up to ``T / k`` of them, side by side as one batch, so a
sweep evaluates about as many steps as the Newton iteration) and writes them
into the iterate. The parallel evaluation then tests them
like any other step, so the certificate is unchanged, and where a stretch's
input is already right it shrinks by up to ``k + 1`` steps per iteration.
The segment at the front starts one step past it, at the first unfrozen
step, which the previous iteration set to its exact ``F_t``: a sequential and
a batched evaluation that round an accept decision differently can therefore
never undo each other there, and the front still grows every iteration.

The cost is ``k`` steps per iteration, each a batched step over ``T / k``
segments (one gradient evaluation per step with
:func:`~numpyro_deer.core.make_sequential_step`).
``DEERSolver(sweep_after=n)`` holds the sweep back for the first ``n``
iterations of a block, so blocks that converge sooner never pay for it; the
defaults are ``sweep=8, sweep_after=20``. The hold-back is the loop's step
count (``0`` before, ``k`` after): one loop body in the compiled graph, and
under ``vmap`` (chains solved together) it runs as many steps as the chain
that needs most, none while no chain does.

The segments are what a parareal-style method would call fine propagators
started from the current iterate; unlike there, nothing here is trusted: the
Newton iteration that follows tests every swept step against the step
function, so the solver's certificate is the same with or without a sweep.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from .certificate import where_rows
from .transition import SequentialStep, sequential_steps


def sweep_starts(front: Array, iteration: Array, passed: Array, count: int) -> Array:
    """Step indices the sweep's segments start from, shape ``(count,)``.

    The first is one step past the front (at the front in the first
    iteration): step ``front`` was set to its exact ``F_t`` by the previous
    iteration, so it is never recomputed, and a sequential and a batched
    evaluation that round an accept decision differently cannot undo each
    other there. The others are the *local fronts* of the previous iteration's
    test: failing steps whose predecessor passed, in order. Unused slots hold
    ``passed.shape[0]`` (past the block).
    """
    size = passed.shape[0]
    first = front + jnp.where(iteration > 0, 1, 0).astype(front.dtype)
    step = jnp.arange(size)
    local = ~passed & jnp.concatenate([jnp.zeros((1,), bool), passed[:-1]])
    local = local & (step > first)
    (rest,) = jnp.nonzero(local, size=count - 1, fill_value=size)
    return jnp.concatenate([first[None], rest.astype(front.dtype)])


def sweep_segments(
    sequential: SequentialStep,
    states: Array,
    tape: Any,
    starts: Array,
    num_steps: int,
    length: int,
    passes: Array | int,
) -> Array:
    """``states`` with ``length`` sequential steps from each start.

    ``states[t]`` is ``s_t`` (``states[0] = s_0``). The segment from start
    ``b`` sets ``s_{b+j+1} = f_{b+j}(s_{b+j})`` for ``j < length``, stopping
    before the next start and at the end of the block; the segments run side
    by side (one batch of ``len(starts)`` per sequential step). ``passes``
    (at most ``length``, traced or not) stops all segments after that many
    steps: the loop over the steps
    (:func:`~numpyro_deer.core.transition.sequential_steps`) has that trip
    count and one body, not an unrolled one (a static, unrolled loop made
    the compiled block 1.9 times larger on the CPU,
    ``benchmarks/results/compile_profile_cpu.md``).
    """
    next_start = jnp.concatenate([starts[1:], jnp.full((1,), num_steps, starts.dtype)])
    stop = jnp.minimum(next_start, num_steps)  # a segment computes steps < stop
    steps = starts[:, None] + jnp.arange(length)  # (segments, length)
    live = steps < stop[:, None]
    live = live & (jnp.arange(length) < passes)
    # by sequential step j (the loop's index): every segment's tape entry
    tape_seg = jax.tree.map(
        lambda leaf: jnp.take(leaf, steps.T, axis=0, mode="clip"), tape
    )

    def step(carry, entry):
        c, x = carry
        tape_j, live_j = entry
        new_c, new_x = jax.vmap(sequential.step)(c, tape_j)
        ok = live_j & jnp.all(jnp.isfinite(new_x), axis=-1)
        x = where_rows(ok, new_x, x)
        return (where_rows(ok, new_c, c), x), x

    x0 = jnp.take(states, starts, axis=0, mode="clip")
    out = jnp.zeros((length,) + x0.shape, states.dtype)  # (length, segments, D)
    init = (jax.vmap(sequential.init)(x0), x0)
    _, out = sequential_steps(step, init, (tape_seg, live.T), out, 0, passes)
    # step t writes s_{t+1}; steps not computed go nowhere
    target = jnp.where(live, steps + 1, states.shape[0])
    return states.at[target.reshape(-1)].set(
        jnp.swapaxes(out, 0, 1).reshape((-1,) + states.shape[1:]), mode="drop"
    )
