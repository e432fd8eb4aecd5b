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

from .gates import HardGate
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


class WindowPlan(NamedTuple):
    """The settings of one window that may be traced, so that one compiled
    program serves windows of every length up to its padded length, every
    leapfrog count and both kinds (:func:`padded_window_draws`).

    Attributes:
        length: transitions of the window (``W``); the tape's entries past
            it are padding, frozen steps that neither move a state nor run
            in the sequential finish.
        leapfrog: the leapfrog count of a transition with leapfrog steps
            (:func:`~numpyro_deer.core.hmc.with_leapfrog`; unused otherwise).
        max_iter: Newton iterations before the sequential finish; 0: the
            window is the sequential scan (no iteration, then the finish from
            the start, the same chain at the same cost).
        stall: the front-stall look-back of a lockstep solve (0: none).
    """

    length: Array | int
    leapfrog: Array | int
    max_iter: Array | int
    stall: Array | int


class _Frozen(NamedTuple):
    """``transition`` on tape entries ``(tape_t, active_t)``: where
    ``active_t`` is false (a padded step) the state stays, so the step is
    the identity and its Jacobian the identity matrix."""

    transition: Transition

    def step(
        self, potential_fn, step_size, carry, tape_t, mass_sqrt=None, gate=HardGate()
    ):
        inner, active = tape_t
        new, info = self.transition.step(
            potential_fn, step_size, carry, inner, mass_sqrt, gate
        )
        return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, carry), info


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
    plan: WindowPlan | None = None,
) -> tuple[Array, StepInfo, Array, Array, Array]:
    """The chains of one window from ``w0`` (``(C, D)``), identity metric.

    DEER (``vmap`` of :func:`deer_solve` over the chains; with ``stall > 0``
    :func:`lockstep_solve`, one solve of at most ``solver.max_iter``
    iterations stopped at a front stall), and every chain whose solve did
    not pass finished sequentially from its front; or, with ``sequential``,
    the sequential scan. Either way the states are the taped chains of the
    same kernel. ``plan`` (:class:`WindowPlan`) replaces ``sequential`` and
    ``stall`` with values that may be traced (``plan.max_iter`` then caps
    the iterations; a lockstep solve where ``plan.stall`` is traced or
    positive), and gives the window's length within the tapes; the states
    past it are not the chain.

    Returns:
        ``(states (C, W, D), step infos, iterations (C,), fronts (C,),
        residuals (C,))``; for the sequential scan iterations, fronts and
        residuals are 0.
    """
    num_chains = w0.shape[0]
    num_steps = jax.tree.leaves(tapes)[0].shape[1]
    if plan is None:
        max_iter = 0 if sequential else solver.max_iter
        plan = WindowPlan(num_steps, 0, max_iter, stall)
    length = plan.length
    gate = solver.gate
    frozen = _Frozen(transition)
    padded = (
        tapes,
        jnp.broadcast_to(jnp.arange(num_steps) < length, (num_chains, num_steps)),
    )
    step_fn = make_step_fn(frozen, potential_fn, step_size, None, gate)
    fast = make_sequential_step(frozen, potential_fn, step_size, None, gate)
    keys = jax.random.split(key, num_chains)

    def unsolved(_):  # no iteration: the finish runs the whole window
        states = jnp.broadcast_to(w0[:, None], (num_chains, num_steps) + w0.shape[1:])
        _, aux = jax.eval_shape(step_fn, w0[0], jax.tree.map(lambda a: a[0, 0], padded))
        infos = jax.tree.map(
            lambda s: jnp.zeros((num_chains, num_steps) + s.shape, s.dtype), aux
        )
        zero = jnp.zeros((num_chains,), jnp.int32)
        return (
            states,
            infos,
            LockstepInfo(zero, zero, jnp.zeros((num_chains,), w0.dtype)),
        )

    def solve(_):
        states, infos, info = jax.vmap(
            lambda x, t, k: deer_solve(step_fn, x, t, k, solver, None, fast)
        )(w0, padded, keys)
        front = jnp.minimum(info.front, length)
        return states, infos, LockstepInfo(info.iterations, front, info.residual)

    if isinstance(plan.max_iter, int) and plan.max_iter == 0:
        states, infos, info = unsolved(None)
    elif not isinstance(plan.stall, int) or plan.stall > 0:
        g = gradients_per_transition(transition)
        states, infos, info = lockstep_solve(
            step_fn,
            fast,
            w0,
            padded,
            keys,
            solver,
            g,
            plan.stall,
            plan.max_iter,
            length,
        )
    elif isinstance(plan.max_iter, int):
        states, infos, info = solve(None)
    else:
        states, infos, info = jax.lax.cond(plan.max_iter > 0, solve, unsolved, None)

    def finish(args):
        states, infos = args
        return jax.vmap(
            lambda x, t, s, i, f: finish_chain(
                transition, potential_fn, x, t, step_size, s, i, f, None, length
            )
        )(w0, tapes, states, infos, info.front)

    # a cond outside vmap: the fallback runs only when some chain needs it
    states, infos = jax.lax.cond(
        jnp.all(info.front >= length), lambda a: a, finish, (states, infos)
    )
    return states, infos, info.iterations, info.front, info.residual


class LockstepInfo(NamedTuple):
    """Per chain: Newton iterations, front and certified residual."""

    iterations: Array
    front: Array
    residual: Array


def lockstep_solve(
    step_fn,
    sequential,
    w0: Array,
    tapes,
    keys: Array,
    solver,
    g: int | Array,
    stall: int | Array,
    max_iter: int | Array | None = None,
    stop: int | Array | None = None,
) -> tuple[Array, StepInfo, LockstepInfo]:
    """Newton iterations of all chains under one loop, stopped at a stall.

    One :func:`~numpyro_deer.core.iteration.newton_iteration` per chain
    (``vmap``) per trip; a chain whose front reached ``stop`` (default the
    tapes' length ``T``; the steps past it are a padded window's frozen ones)
    or turned non-finite keeps its carry. The loop ends when every chain got
    there, after ``max_iter`` iterations (default ``solver.max_iter``; 0: no
    iteration), or when the smallest front over the chains gained fewer than
    ``iteration_cost / g`` steps over the last ``stall`` iterations (module
    docstring; 0: no such stop). ``g``, ``stall``, ``max_iter`` and ``stop``
    may be traced; a traced ``stall`` is at most ``solver.max_iter *
    solver.max_solves``. Returns ``(states (C, T, D), step infos,
    LockstepInfo)``; only ``states[c, :front[c]]`` are the chain.
    """
    num_steps = jax.tree.leaves(tapes)[0].shape[1]
    stop = num_steps if stop is None else stop
    max_iter = solver.max_iter if max_iter is None else max_iter
    if isinstance(stall, int):
        ring = max(stall, 1)
    else:
        ring = solver.max_iter * solver.max_solves
    look_back = jnp.maximum(stall, 1)
    layout = whole_block(num_steps)
    carry = jax.vmap(lambda x, t: _initial_carry(step_fn, x, t, None))(w0, tapes)
    iterate = jax.vmap(
        lambda c, t, k: newton_iteration(step_fn, solver, t, k, c, layout, sequential)
    )

    def slowest(c):
        return jnp.min(jnp.where(c.nonfinite, stop, jnp.minimum(c.front, stop)))

    def go_on(state):
        c, fronts, k = state
        front = slowest(c)
        gained = front - fronts[k % look_back]  # f_k - f_{k-m}
        cost = iteration_cost(solver, g, k - stall, stall)
        stalled = (stall > 0) & (k >= stall) & (gained * g < cost)
        return (front < stop) & (k < max_iter) & ~stalled

    def body(state):
        c, fronts, k = state
        fronts = fronts.at[k % look_back].set(slowest(c))
        live = (c.front < stop) & ~c.nonfinite
        new = iterate(c, tapes, keys)
        c = jax.tree.map(
            lambda a, b: jnp.where(live.reshape((-1,) + (1,) * (a.ndim - 1)), a, b),
            new,
            c,
        )
        return c, fronts, k + 1

    fronts = jnp.zeros((ring,), jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    carry, *_ = jax.lax.while_loop(go_on, body, (carry, fronts, zero))
    front = jnp.minimum(carry.front, stop)
    info = LockstepInfo(carry.iteration, front, carry.residual)
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
    plan: WindowPlan | None = None,
) -> tuple[Array, StepInfo, Array, Array, Array]:
    """:func:`solve_window` from positions ``x`` (``(C, D)``) in the metric
    ``L = mass_sqrt``: fresh tapes of ``num_steps`` from ``key``, the solve
    in whitened coordinates ``w = L^{-1} x``, the draws ``(C, num_steps, D)``
    mapped back (with ``plan``, the first ``plan.length`` of them are the
    window's). The window of a warmup and a sampling block alike."""
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
        plan,
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
