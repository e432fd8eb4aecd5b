r"""Sequential segments that start each Newton iteration: the sweep.

Where the chain's Jacobian changes faster than ``J`` follows it (a
funnel's neck, a run of accept decisions near their threshold) a stretch of
failing steps shrinks from its left end by a few steps per iteration, and
every iteration pays for the whole block. Such stretches start at the front
and at *local fronts*: failing steps whose predecessor passed. With
``sweep = k > 0`` an iteration first computes ``k`` steps one after the other
from each of them (up to ``segments``, by default ``T / k``, side by side as
one batch, so a sweep evaluates about as many steps as the Newton iteration)
and writes them into the iterate. The parallel evaluation then tests them
like any other step, so the certificate is unchanged, and where a stretch's
input is already right it shrinks by up to ``k + 1`` steps per iteration.
The segment at the front starts one step past it, at the first unfrozen
step, which the previous iteration set to its exact ``F_t``: a sequential and
a batched evaluation that round an accept decision differently can therefore
never undo each other there, and the front still grows every iteration.

The cost is ``k`` steps per iteration, each a batched step over ``T / k``
segments (one gradient evaluation per step with
:func:`~numpyro_deer.make_sequential_step`); on the H200 about 30 us on eight
schools and 150 us on the D = 91 hierarchical model (ninth ablation run,
``docs/ablation.md``). ``DEERSolver(sweep_after=n)`` holds the sweep back for
the first ``n`` iterations of a block, so blocks that converge sooner never
pay for it; the kernel's default is ``sweep=8, sweep_after=20``. Outside
``vmap`` the hold-back is a :func:`jax.lax.cond` around a static, unrolled
loop; with ``DEERSolver(vmapped=True)`` (chains solved together, where a
``cond`` would be a select) it is a traced step count instead.

The segments are what a parareal-style method would call fine propagators
started from the current iterate; unlike there, nothing here is trusted: the
Newton iteration that follows tests every swept step against the step
function, so the solver's certificate is the same with or without a sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ._certificate import leading_passed, step_passes
from ._jacobian import StepFn


class SequentialStep(NamedTuple):
    """A faster form of the same step for the sweep's sequential segments.

    ``init(x) -> c`` and ``step(c, tape_t) -> (c, x_new)``, where the carry
    ``c`` may hold what the next step reuses (MALA: the potential and gradient
    at the current state, so a step costs one gradient evaluation instead of
    two; :func:`~numpyro_deer.make_sequential_step`). It must compute the same
    ``x_new`` as the step function up to rounding: its values are only a
    guess, tested by the step function like every other step.
    """

    init: Callable[[Array], Any]
    step: Callable[[Any, Any], tuple[Any, Array]]


def plain_sequential_step(step_fn: StepFn) -> SequentialStep:
    """The step function itself as a :class:`SequentialStep` (carry ``= x``)."""

    def step(x, tape_t):
        x_new, _ = step_fn(x, tape_t)
        return x_new, x_new

    return SequentialStep(lambda x: x, step)


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
    passes: Array | None = None,
) -> Array:
    """``states`` with ``length`` sequential steps from each start.

    ``states[t]`` is ``s_t`` (``states[0] = s_0``). The segment from start
    ``b`` sets ``s_{b+j+1} = f_{b+j}(s_{b+j})`` for ``j < length``, stopping
    before the next start and at the end of the block; the segments run side
    by side (one batch of ``len(starts)`` per sequential step). The loop over
    the steps has a static trip count and is unrolled (up to 8 steps a loop
    body), which on the H200 made a step about 26 us cheaper than a loop with
    a traced trip count (eight schools). ``passes`` (traced, at most
    ``length``) stops all segments after that many steps instead: a loop with
    a traced trip count, so under ``vmap`` it runs as many steps as the
    largest ``passes`` of the batch, none if all are zero.
    """
    next_start = jnp.concatenate([starts[1:], jnp.full((1,), num_steps, starts.dtype)])
    stop = jnp.minimum(next_start, num_steps)  # a segment computes steps < stop
    steps = starts[:, None] + jnp.arange(length)  # (segments, length)
    live = steps < stop[:, None]
    if passes is not None:
        live = live & (jnp.arange(length) < passes)
    tape_seg = jax.tree.map(
        lambda leaf: jnp.take(leaf, steps, axis=0, mode="clip"), tape
    )

    def body(j, carry):
        c, x, out = carry
        tape_j = jax.tree.map(lambda leaf: leaf[:, j], tape_seg)
        new_c, new_x = jax.vmap(sequential.step)(c, tape_j)
        ok = live[:, j] & jnp.all(jnp.isfinite(new_x), axis=-1)

        def keep(new, old):
            return jnp.where(ok.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

        x = keep(new_x, x)
        out = jax.lax.dynamic_update_index_in_dim(out, x, j, 1)
        return jax.tree.map(keep, new_c, c), x, out

    x0 = jnp.take(states, starts, axis=0, mode="clip")
    out = jnp.zeros(steps.shape + states.shape[1:], states.dtype)
    init = (jax.vmap(sequential.init)(x0), x0, out)
    if passes is None:
        _, _, out = jax.lax.fori_loop(0, length, body, init, unroll=min(length, 8))
    else:
        _, _, out = jax.lax.fori_loop(0, passes, body, init)
    # step t writes s_{t+1}; steps not computed go nowhere
    target = jnp.where(live, steps + 1, states.shape[0])
    return states.at[target.reshape(-1)].set(
        out.reshape((-1,) + states.shape[1:]), mode="drop"
    )


def coupled_segments(
    step_fn: StepFn,
    sequential: SequentialStep,
    x0: Array,
    tape: Any,
    init_states: Array,
    num_segments: int,
    max_passes: int,
    atol: float,
    rtol: float,
) -> tuple[Array, Array]:
    """An initial guess from sequential segments run until they *couple*.

    The block of ``T`` steps is cut into ``num_segments`` segments of ``L``
    steps (the last may be shorter). Pass 1 runs every segment one step after
    the other from ``init_states`` at its start, side by side (one batch per
    step, :func:`sweep_segments`); pass ``p + 1`` starts segment ``j`` from
    the state in which segment ``j - 1`` of pass ``p`` ended. Two MALA chains
    driven by the same tape from different states meet (they *couple*, as in
    Jacob, O'Leary and Atchadé 2020, "Unbiased Markov chain Monte Carlo
    methods with couplings"): a perturbation shrinks through the contracting
    steps, and once the accept decisions agree the paths merge. A segment that
    met the chain before its last step hands its successor the chain's exact
    state, so after two passes every segment whose predecessor coupled within
    ``L`` steps *is* the chain, up to rounding. These passes stop when no
    segment's start moved by more than ``atol + rtol |x|``.

    *Up to rounding* matters in float32: an accept decision within rounding
    of its threshold can come out one way in a sequential segment and the
    other in the batched evaluation that tests the block, and on a chain that
    forgets slowly the two paths then differ for hundreds of steps. So the
    later passes *repair*: they test the guess with ``step_fn`` batched, as
    the Newton iteration does, set the first failing step to its tested value
    ``F_t``, and run the segments of ``L`` steps from there and from each
    later failing step whose predecessor passed (:func:`sweep_starts`), until
    every step passes. All passes together are at most ``max_passes``; each
    costs ``L`` sequential, latency-bound steps, and the guess is tested (one
    batched evaluation of the block) once after the coupling passes and after
    every repair pass; when nothing fails, that test repeats the evaluation
    the Newton solve's first iteration makes. Nothing is trusted: the Newton
    solve that follows tests every step, so the guess changes the cost of a
    block, never its chain.

    Returns:
        ``(states, passes)``: the guess ``s_1 .. s_T`` and the passes run.
    """
    num_steps = init_states.shape[0]
    length = -(-num_steps // min(num_segments, num_steps))
    even_starts = jnp.arange(0, num_steps, length)
    count = even_starts.shape[0]
    zero = jnp.zeros((), jnp.int32)

    def settling(c):
        _, moving, passes = c
        return moving & (passes < max_passes)

    def couple(c):
        states, _, passes = c
        before = states[even_starts]
        states = sweep_segments(
            sequential, states, tape, even_starts, num_steps, length
        )
        after = states[even_starts]
        moving = jnp.any(jnp.abs(after - before) > atol + rtol * jnp.abs(after))
        return states, moving, passes + 1

    def test(states):
        values, _ = jax.vmap(step_fn)(states[:-1], tape)
        return values, step_passes(states[1:], values, atol, rtol)[0]

    def failing(c):
        passed, passes = c[2:]
        return ~jnp.all(passed) & (passes < max_passes)

    def repair(c):
        states, values, passed, passes = c
        front = leading_passed(passed)
        states = states.at[front + 1].set(values[front])
        starts = sweep_starts(front, jnp.ones((), jnp.int32), passed, count)
        states = sweep_segments(sequential, states, tape, starts, num_steps, length)
        return states, *test(states), passes + 1

    states = jnp.concatenate([x0[None], init_states])
    states, _, passes = jax.lax.while_loop(
        settling, couple, (states, jnp.ones((), bool), zero)
    )
    states, _, _, passes = jax.lax.while_loop(
        failing, repair, (states, *test(states), passes)
    )
    return states[1:], passes
