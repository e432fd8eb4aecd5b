r"""What a parallel warmup reports, and its cost in gradient evaluations.

On an accelerator a small model's transition is bound by launch latency, so a
sampler's wall time is about (dependent gradient evaluations on its longest
path) x latency + (all gradient evaluations) / throughput. Both are counted
here per window of :mod:`numpyro_deer.core.parallel_warmup`, in units of one
gradient of the potential; a Hessian-vector product (the tangent of a
gradient in a forward-mode product) counts as one more.

With ``g`` the gradients of one sequential transition (MALA 1, HMC ``L``) and
``g_f = g + 1`` those of the step the solver evaluates (it recomputes the
gradient at its input), a window of ``W`` transitions costs on the critical
path

* sequential scan: ``1 + W g`` (the gradient at the start, then ``W`` steps);
* DEER: ``k (2 g_f + s_0) + max(0, k - a) s g + [F > 0] (1 + F g)`` with
  ``k`` the Newton iterations of the slowest chain (the chains run in
  lockstep), ``2 g_f`` the step and its Jacobian products (evaluated side by
  side, so several probes add no depth), ``s = sweep`` and ``a =
  sweep_after`` of the solver (``s_0 = 1`` when ``s > 0``: the sweep's
  starting gradients, evaluated every iteration) and ``F`` the sequential
  fallback steps of the slowest chain, whether the solve stopped at the
  iteration cap or at a front stall
  (:func:`~numpyro_deer.core.warmup_window.lockstep_solve`; the stall test
  itself evaluates no gradient);
* the adaptation after it: ``n g_f`` (``n`` consecutive transitions, the
  step size curve's ``curve_transitions``, at every candidate step size from
  every pooled point, the points and candidates side by side) and, for the
  Hessian metric, ``2`` (the gradient and its forward derivative at the
  points).

The associative scan adds ``ceil(log2 W)`` cheap levels per iteration,
counted apart (``scan_levels``). The totals count every chain's own
iterations and fallback steps (a chain whose block passed stops; the masked
lanes ``vmap`` still computes are not counted, as in the race's count).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from .jacobian import StochasticDiagonalJacobian
from .newton import DEERSolver

CURVE_TRANSITIONS = 4
"""Transitions from each point of a parallel warmup's acceptance curve
(:func:`~.warmup_adapt.acceptance_curve`), counted by :func:`window_costs`."""


class WindowInfo(NamedTuple):
    """One window of a parallel warmup (stacked over windows in
    :class:`WarmupInfo`: each field then has a leading window axis).

    Attributes:
        num_steps: transitions in the window (``W``).
        sequential: computed by the sequential scan instead of DEER.
        newton_iterations: Newton iterations of the slowest chain (0 for a
            sequential window).
        num_converged: chains whose DEER solve passed every step.
        fallback_steps: sequential steps after the solve, slowest chain
            (``W - front``; ``W`` for a sequential window).
        residual: largest certified residual over the chains.
        mean_accept_prob: acceptance pooled over chains and draws.
        num_diverging: draws with a non-finite proposal, all chains.
        num_restarted: chains that accepted no proposal in the window and
            continue from another chain's draws
            (:func:`~.warmup_adapt.restart_stuck`).
        step_size: the window's (fixed) step size.
        metric_updated: the metric was estimated after this window.
        critical_path_gradients: dependent gradients of the window and the
            adaptation after it (module docstring).
        total_gradients: all gradients computed for them.
        scan_levels: ``iterations * ceil(log2 W)`` associative scan levels.
    """

    num_steps: Array
    sequential: Array
    newton_iterations: Array
    num_converged: Array
    fallback_steps: Array
    residual: Array
    mean_accept_prob: Array
    num_diverging: Array
    num_restarted: Array
    step_size: Array
    metric_updated: Array
    critical_path_gradients: Array
    total_gradients: Array
    scan_levels: Array


class WarmupInfo(NamedTuple):
    """A parallel warmup's report.

    Attributes:
        windows: :class:`WindowInfo` with a leading window axis.
        initial_step_size: the step size of the initial search.
        critical_path_gradients: the windows' sum plus the initial search's
            ``g_f`` and, with a trajectory length choice, ``max(L) + 1`` per
            choice (all candidates side by side).
        total_gradients: all gradients, the initial search's and the
            choices' included.
        num_steps: leapfrog steps of each window's transition (0 without).
        final_num_steps: those after the last choice (the sampling phase's).
    """

    windows: WindowInfo
    initial_step_size: Array
    critical_path_gradients: Array
    total_gradients: Array
    num_steps: Array
    final_num_steps: int


def gradients_per_transition(transition) -> int | Array:
    """``g``: gradients of one sequential transition (``num_steps`` leapfrog
    steps for HMC, 1 otherwise); an array where the leapfrog count is traced
    (:class:`~numpyro_deer.core.hmc.TracedHMC`)."""
    g = getattr(transition, "num_steps", 1)
    return g if isinstance(g, Array) else int(g)


def tangent_directions(solver: DEERSolver, dim: int) -> int:
    """Forward-mode products per step and iteration of the solver's Jacobian."""
    strategy = solver.jacobian_for(dim)
    if isinstance(strategy, StochasticDiagonalJacobian):
        return strategy.num_probes
    return dim


def break_even_iterations(transition, num_steps: int) -> int:
    """Newton iterations that cost as much critical path as the sequential
    scan of ``num_steps`` transitions: ``max(1, W g // (2 g_f))``."""
    g = gradients_per_transition(transition)
    return max(1, (num_steps * g) // (2 * (g + 1)))


def iteration_cost(
    solver: DEERSolver, g: int, first: Array, count: Array, xp=jnp
) -> Array:
    """Critical-path gradients of Newton iterations ``first .. first+count-1``:
    ``2 (g + 1)`` each, ``+ 1`` with a sweep, ``+ sweep g`` from
    ``sweep_after`` on (the module docstring). ``xp``: ``jax.numpy`` or
    ``numpy`` (the benchmarks count on the host, compiling nothing)."""
    s = solver.sweep
    cost = count * (2 * (g + 1) + (1 if s else 0))
    if s:
        swept = xp.clip(first + count - solver.sweep_after, 0, count)
        cost = cost + swept * s * g
    return cost


def solve_costs(
    solver: DEERSolver, g, num_steps, iterations, fallback, directions, xp=jnp
) -> tuple[Array, Array]:
    """``(critical path, all gradients)`` of DEER solves of ``num_steps``
    transitions, elementwise in ``iterations`` (Newton iterations) and
    ``fallback`` (sequential steps after the solve): the module docstring's
    count for one chain, with ``directions`` tangents per step and iteration
    (:func:`tangent_directions`); ``xp`` as for :func:`iteration_cost`."""
    s = solver.sweep
    tail = xp.where(fallback > 0, 1 + fallback * g, 0)
    critical = iteration_cost(solver, g, 0, iterations, xp) + tail
    total = iterations * num_steps * (g + 1) * (1 + directions) + tail
    if s:
        segments = xp.maximum(1, xp.minimum(num_steps // s, num_steps))
        swept = xp.maximum(iterations - solver.sweep_after, 0)
        total = total + iterations * segments + swept * segments * s * g
    return critical, total


def ceil_log2(n: int | Array) -> int | Array:
    """``ceil(log2 n)`` for ``n >= 1``, of an integer or an int32 array."""
    if isinstance(n, Array):
        return 32 - jax.lax.clz(jnp.asarray(n, jnp.int32) - 1)
    return math.ceil(math.log2(n))


def window_costs(
    transition,
    solver: DEERSolver,
    num_steps: int,
    sequential: bool,
    iterations: Array,
    fallback: Array,
    num_chains: int,
    dim: int,
    curve_evaluations: int,
    hessian_points: int,
    metric_estimated: Array | bool,
    adaptation: bool = True,
    curve_transitions: int = CURVE_TRANSITIONS,
) -> tuple[Array, Array, Array]:
    """``(critical path, total, scan levels)`` of one window and the adaptation
    after it, in gradients (see the module docstring). ``iterations`` and
    ``fallback`` are per chain, ``(C,)`` (the critical path takes their
    maxima: the chains run in lockstep and the fallback starts after the
    solve); ``curve_evaluations`` is points x candidate step sizes, each
    followed for ``curve_transitions`` transitions (``adaptation=False``: a
    window without the adaptation after it, a sampling block);
    ``hessian_points`` 0 unless the metric is the Hessian
    one, counted where ``metric_estimated``. ``num_steps`` may be traced (a
    padded window's length)."""
    g = gradients_per_transition(transition)
    g_f = g + 1
    levels = jnp.zeros((), jnp.int32)
    if sequential:
        critical = jnp.asarray(1 + num_steps * g)
        total = num_chains * jnp.asarray(critical, float)
    else:
        directions = tangent_directions(solver, dim)
        # the chains run in lockstep: the slowest chain's iterations, then
        # the longest fallback; per chain in floating point for the totals
        # (those of many chains and long windows overflow int32)
        k = jnp.max(iterations)
        critical, _ = solve_costs(
            solver, g, num_steps, k, jnp.max(fallback), directions
        )
        _, per_chain = solve_costs(
            solver, g, num_steps, jnp.asarray(iterations, float),
            jnp.asarray(fallback, float), directions,
        )  # fmt: skip
        total = jnp.sum(per_chain)
        levels = k * ceil_log2(num_steps)
    if not adaptation:
        return critical, total, jnp.asarray(levels, jnp.int32)
    hessian = jnp.where(metric_estimated, 1, 0) if hessian_points else 0
    curve = curve_transitions * g_f
    critical = critical + curve + 2 * hessian
    total = total + curve_evaluations * curve + 2 * hessian_points * dim * hessian
    return critical, total, jnp.asarray(levels, jnp.int32)
