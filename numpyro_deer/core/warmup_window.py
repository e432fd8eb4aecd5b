r"""One window of a parallel warmup: all chains' taped transitions at a fixed kernel.

:func:`solve_window` computes the window by DEER (:func:`deer_solve`
``vmap``-ped over the chains, a tape per chain from :func:`window_tapes`) and
finishes every chain whose solve did not pass sequentially from its front
(:func:`~numpyro_deer.core.transition.finish_chain`), or by the sequential
scan; either way the states are the taped chains of that kernel.
:func:`window_solver` caps a window's Newton iterations at the break-even
count (:func:`~numpyro_deer.core.warmup_cost.break_even_iterations`).

**Front-stall stop.** The chains move in lockstep, so a window's critical
path is ``k c + g (W - f_k)`` (plus constants): ``k`` Newton iterations of
``c`` dependent gradients each (``c = 2 (g + 1)``, plus the sweep's), then
the sequential steps past ``f_k``, the smallest front over the chains, of
``g`` gradients each. An iteration pays only if it moves ``f`` by more than
``c / g`` steps. With ``stall = m > 0`` (:func:`lockstep_solve`) the solve
stops as soon as the slowest front gained fewer steps over the last ``m``
iterations than those iterations cost, ``g (f_k - f_{k-m}) < sum c``, and
the chains are finished sequentially from their fronts, so the draws are
the chains whatever the stop. The look-back must not be short: where the
dynamics contract, Newton's error falls over the whole window at once and
the slowest front moves a few steps per iteration before it jumps to the
end (eight schools and logistic regression, MALA: 3 steps in the first 4
iterations of windows that converged in 40). :func:`stall_iterations`
takes ``m`` as a fraction of the break-even iteration count, so a window
that converges within that fraction of it is never stopped, and one that
does not costs at most that fraction of its sequential scan more.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from .iteration import newton_iteration, whole_block
from .metric import mul_sqrt, solve_sqrt, whiten
from .newton import DEERSolver, _initial_carry, deer_solve
from .transition import (
    PotentialFn,
    StepInfo,
    Transition,
    finish_chain,
    make_sequential_step,
    make_step_fn,
    sequential_chain,
)
from .warmup_cost import (
    break_even_iterations,
    gradients_per_transition,
    iteration_cost,
)


def window_tapes(
    transition: Transition, key: Array, num_chains: int, num_steps: int, dim: int, dtype
) -> object:
    """One tape of ``num_steps`` transitions per chain (leading axis ``C``)."""
    keys = jax.random.split(key, num_chains)
    return jax.vmap(lambda k: transition.make_tape(k, num_steps, dim, dtype))(keys)


def solve_window(
    transition: Transition,
    potential_fn: PotentialFn,
    w0: Array,
    tapes: object,
    key: Array,
    step_size: Array,
    solver: DEERSolver,
    sequential: bool = False,
    stall: int = 0,
) -> tuple[Array, StepInfo, Array, Array, Array]:
    """The chains of one window from ``w0`` (``(C, D)``), identity metric.

    DEER (``vmap`` of :func:`deer_solve` over the chains; with ``stall > 0``
    :func:`lockstep_solve`, one solve of at most ``solver.max_iter``
    iterations stopped at a front stall), and every chain whose solve did
    not pass finished sequentially from its front; or, with ``sequential``,
    the sequential scan. Either way the states are the taped chains of the
    same kernel.

    Returns:
        ``(states (C, W, D), step infos, iterations (C,), fronts (C,),
        residuals (C,))``; for the sequential scan iterations, fronts and
        residuals are 0.
    """
    num_chains = w0.shape[0]
    num_steps = jax.tree.leaves(tapes)[0].shape[1]
    if sequential:
        chain = partial(sequential_chain, transition, potential_fn)
        states, infos = jax.vmap(lambda x, t: chain(x, t, step_size))(w0, tapes)
        zero = jnp.zeros((num_chains,), jnp.int32)
        return states, infos, zero, zero, jnp.zeros((num_chains,), w0.dtype)
    gate = solver.gate
    step_fn = make_step_fn(transition, potential_fn, step_size, None, gate)
    fast = make_sequential_step(transition, potential_fn, step_size, None, gate)
    keys = jax.random.split(key, num_chains)
    if stall:
        g = gradients_per_transition(transition)
        states, infos, info = lockstep_solve(
            step_fn, fast, w0, tapes, keys, solver, g, stall
        )
    else:
        states, infos, info = jax.vmap(
            lambda x, t, k: deer_solve(step_fn, x, t, k, solver, None, fast)
        )(w0, tapes, keys)

    def finish(args):
        states, infos = args
        return jax.vmap(
            lambda x, t, s, i, f: finish_chain(
                transition, potential_fn, x, t, step_size, s, i, f
            )
        )(w0, tapes, states, infos, info.front)

    # a cond outside vmap: the fallback runs only when some chain needs it
    states, infos = jax.lax.cond(
        jnp.all(info.front >= num_steps), lambda a: a, finish, (states, infos)
    )
    return states, infos, info.iterations, info.front, info.residual


class LockstepInfo(NamedTuple):
    """Per chain: Newton iterations, front and certified residual."""

    iterations: Array
    front: Array
    residual: Array


def lockstep_solve(
    step_fn, sequential, w0: Array, tapes, keys: Array, solver, g: int, stall: int
) -> tuple[Array, StepInfo, LockstepInfo]:
    """Newton iterations of all chains under one loop, stopped at a stall.

    One :func:`~numpyro_deer.core.iteration.newton_iteration` per chain
    (``vmap``) per trip; a chain whose block passed (or turned non-finite)
    keeps its carry. The loop ends when every chain passed, after
    ``solver.max_iter`` iterations, or when the smallest front over the
    chains gained fewer than ``iteration_cost / g`` steps over the last
    ``stall`` iterations (module docstring). Returns ``(states (C, W, D),
    step infos, LockstepInfo)``; only ``states[c, :front[c]]`` are the chain.
    """
    num_steps = jax.tree.leaves(tapes)[0].shape[1]
    layout = whole_block(num_steps)
    carry = jax.vmap(lambda x, t: _initial_carry(step_fn, x, t, None))(w0, tapes)
    iterate = jax.vmap(
        lambda c, t, k: newton_iteration(step_fn, solver, t, k, c, layout, sequential)
    )

    def slowest(c):
        return jnp.min(jnp.where(c.nonfinite, num_steps, c.front))

    def go_on(state):
        c, fronts, k = state
        front = slowest(c)
        gained = front - fronts[k % stall]  # f_k - f_{k-m}
        cost = iteration_cost(solver, g, k - stall, stall)
        stalled = (k >= stall) & (gained * g < cost)
        return (front < num_steps) & (k < solver.max_iter) & ~stalled

    def body(state):
        c, fronts, k = state
        fronts = fronts.at[k % stall].set(slowest(c))
        live = (c.front < num_steps) & ~c.nonfinite
        new = iterate(c, tapes, keys)
        c = jax.tree.map(
            lambda a, b: jnp.where(live.reshape((-1,) + (1,) * (a.ndim - 1)), a, b),
            new,
            c,
        )
        return c, fronts, k + 1

    fronts = jnp.zeros((stall,), jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    carry, *_ = jax.lax.while_loop(go_on, body, (carry, fronts, zero))
    info = LockstepInfo(carry.iteration, carry.front, carry.residual)
    return carry.states[:, 1:], carry.aux, info


def stall_iterations(solver: DEERSolver, fraction: float) -> int:
    """The look-back ``m`` of the front-stall stop: ``fraction`` of the
    window solver's iteration limit (the break-even count when capped), at
    least 1; 0 when ``fraction`` is 0 (no stop)."""
    if fraction <= 0:
        return 0
    return max(1, round(fraction * solver.max_iter))


def window_draws(
    transition: Transition,
    potential_fn: PotentialFn,
    solver: DEERSolver,
    num_steps: int,
    sequential: bool,
    x: Array,
    step_size: Array,
    mass_sqrt: Array,
    key: Array,
    stall: int = 0,
) -> tuple[Array, StepInfo, Array, Array, Array]:
    """:func:`solve_window` from positions ``x`` (``(C, D)``) in the metric
    ``L = mass_sqrt``: fresh tapes from ``key``, the solve in whitened
    coordinates ``w = L^{-1} x``, the draws ``(C, W, D)`` mapped back. The
    window of a warmup and a sampling block alike."""
    num_chains, dim = x.shape
    k_tape, k_solve = jax.random.split(key)
    tapes = window_tapes(transition, k_tape, num_chains, num_steps, dim, x.dtype)
    w0 = jax.vmap(lambda v: solve_sqrt(mass_sqrt, v))(x)
    potential_w = whiten(potential_fn, mass_sqrt)
    states, infos, iterations, fronts, residuals = solve_window(
        transition,
        potential_w,
        w0,
        tapes,
        k_solve,
        step_size,
        solver,
        sequential,
        stall,
    )
    draws = jax.vmap(jax.vmap(lambda w: mul_sqrt(mass_sqrt, w)))(states)
    return draws, infos, iterations, fronts, residuals


@partial(jax.jit, static_argnums=(0, 1, 2, 3), static_argnames="stall")
def sample_window(
    transition: Transition,
    potential_fn: PotentialFn,
    solver: DEERSolver,
    num_steps: int,
    x: Array,
    step_size: Array,
    mass_sqrt: Array,
    key: Array,
    *,
    stall: int = 0,
) -> tuple[Array, StepInfo, Array, Array]:
    """A sampling block after a parallel warmup: one more window of
    :func:`window_draws` at the adapted kernel, without adaptation.

    Returns ``(draws (C, W, D), step infos, iterations (C,), fronts (C,))``;
    the chains' next positions are ``draws[:, -1]``. Costs: the window part of
    :func:`~.warmup_cost.window_costs` (``adaptation=False``).
    """
    draws, infos, iterations, fronts, _ = window_draws(
        transition,
        potential_fn,
        solver,
        num_steps,
        False,
        x,
        step_size,
        mass_sqrt,
        key,
        stall,
    )
    return draws, infos, iterations, fronts


def window_solver(
    solver: DEERSolver, transition: Transition, num_steps: int, cap: bool
) -> DEERSolver:
    """``solver`` for a window of ``num_steps``; with ``cap``, one solve of at
    most the break-even iterations (:func:`~.warmup_cost.break_even_iterations`)
    before the sequential fallback."""
    if not cap:
        return solver
    budget = min(
        solver.max_iter * solver.max_solves,
        break_even_iterations(transition, num_steps),
    )
    return DEERSolver(
        jacobian=solver.jacobian,
        gate=solver.gate,
        solve_basis=solver.solve_basis,
        atol=solver.atol,
        rtol=solver.rtol,
        max_iter=budget,
        max_solves=1,
        sweep=solver.sweep,
        sweep_after=solver.sweep_after,
    )
