r"""One warmup window of all chains at a fixed kernel, then the adaptation.

The unit :func:`~numpyro_deer.core.parallel_warmup.parallel_warmup` repeats:
the window's ``C x W`` transitions (:func:`padded_window_draws`: the
sequential scan, or one DEER solve of all chains with a tape per chain), then
chains that accepted no proposal restarted from another chain's draws
(:func:`~.warmup_adapt.restart_stuck`), then from the second half of its
draws pooled over chains the new metric
(:func:`~.warmup_adapt.pooled_inverse_mass` or the inverse mean Hessian) and
the new step size, where the pooled acceptance curve (a few transitions from
each point) falls through the target times its plateau
(:func:`~.warmup_adapt.acceptance_curve`, :func:`~.warmup_adapt.choose_step_size`),
and the window's counts (:func:`~.warmup_cost.window_costs`).

**One program for all windows.** :func:`padded_window_draws` compiles once
for every window of a warmup: the settings that differ between windows are
traced (:class:`~.warmup_window.WindowPlan`: the window's length, HMC's
leapfrog count, :class:`~numpyro_deer.core.hmc.TracedHMC`, the iteration
cap, the stall look-back), and the tapes are as long as the longest window.
A tape entry past a window's length is a frozen step, ``s_t = s_{t-1}``:
its Jacobian is the identity, so the Newton update copies the last state
along, it passes with the steps before it, and the sequential finish stops
at the window's length. The first ``W`` entries of a longer tape are the
tape of ``W`` (JAX's partitionable threefry draws element by element), so
the window's draws are those of an unpadded window. A sequential window is
a solve of zero iterations finished sequentially from its start: the same
chain at the same cost, ``1 + W g``. The adaptation after it is part of the
same program (:func:`warmup_window`): it pools the second half of the
window's draws through masks, and takes the acceptance curve's points by
traced indices.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array

from .hmc import with_leapfrog
from .metric import mass_matrix_sqrt
from .newton import DEERSolver
from .transition import PotentialFn, StepInfo, Transition
from .warmup_adapt import (
    CURVE_TRANSITIONS,
    acceptance_curve,
    choose_step_size,
    hessian_inverse_mass,
    pooled_inverse_mass,
    restart_stuck,
    window_points,
)
from .warmup_cost import WindowInfo, window_costs
from .warmup_window import WindowPlan, window_draws

__all__ = ["WINDOW_FACTORS", "padded_window_draws", "warmup_window"]

WINDOW_FACTORS = tuple(2.0 ** (k / 2) for k in range(-16, 9))
"""Step size factors of the acceptance curve between windows (``2^(k/2)``,
1/256 to 16: a new metric can move the step size far)."""


@partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def padded_window_draws(
    transition: Transition,
    potential_fn: PotentialFn,
    solver: DEERSolver,
    padded_length: int,
    lockstep: bool,
    x: Array,
    step_size: Array,
    inverse_mass: Array,
    key: Array,
    plan: WindowPlan,
) -> tuple[Array, StepInfo, Array, Array, Array]:
    """:func:`~.warmup_window.window_draws` of a window of ``plan.length <=
    padded_length`` transitions: one compiled program for every
    :class:`~.warmup_window.WindowPlan`.

    ``transition`` is the static part of
    :func:`~numpyro_deer.core.hmc.split_leapfrog` (the leapfrog count is
    ``plan.leapfrog``); the tapes have ``padded_length`` entries, and the
    steps past ``plan.length`` are frozen. With ``lockstep`` one
    :func:`~.warmup_window.lockstep_solve` (stopped at ``plan.max_iter``
    iterations or a front stall of ``plan.stall``), else ``vmap`` of
    :func:`~numpyro_deer.core.newton.deer_solve` under ``solver``'s own
    limits; ``plan.max_iter = 0`` is the sequential scan either way. The
    metric is ``inverse_mass``; the tapes and solve use the first key of
    ``jax.random.split(key)`` (the second is the adaptation's). Returns
    ``(draws (C, padded_length, D), step infos, iterations, fronts,
    residuals)``; the window's draws are ``draws[:, :plan.length]``.
    """
    stall = jnp.asarray(plan.stall, jnp.int32) if lockstep else 0
    plan = plan._replace(stall=stall)
    return window_draws(
        with_leapfrog(transition, plan.leapfrog),
        potential_fn,
        solver,
        padded_length,
        False,
        x,
        step_size,
        mass_matrix_sqrt(inverse_mass),
        jax.random.split(key)[0],
        plan=plan,
    )


@partial(
    jax.jit,
    static_argnums=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9),
    static_argnames=("curve_transitions",),
)
def warmup_window(
    transition: Transition,
    potential_fn: PotentialFn,
    solver: DEERSolver,
    padded_length: int,
    lockstep: bool,
    metric: str,
    target: float,
    num_curve_points: int,
    slots: int,
    hessian_points: int,
    x: Array,
    step_size: Array,
    inverse_mass: Array,
    adapt_metric: Array,
    key: Array,
    plan: WindowPlan,
    curve_transitions: int = CURVE_TRANSITIONS,
) -> tuple[Array, Array, Array, Array, WindowInfo]:
    """One window for all chains at a fixed kernel, then the adaptation: one
    compiled program for every window of a warmup.

    The window's draws (:func:`padded_window_draws`: tapes of
    ``padded_length``, the window's length ``W = plan.length``, leapfrog
    count, iteration cap and front-stall look-back traced), then from the
    second half of its draws pooled over chains (``C (W - W // 2)`` of them,
    selected by masks) the metric, estimated where ``adapt_metric``
    (traced), and the step size from the acceptance curve at
    ``num_curve_points`` of them (:func:`~.warmup_adapt.window_points`, in
    ``slots`` rows: at least as many as the points of any window, so one
    program serves all; ``curve_transitions`` from each point, static).
    ``hessian_points``: the points of the Hessian metric (static, at most
    the pooled draws; 0 for the other metrics).
    ``transition`` is the static part of
    :func:`~numpyro_deer.core.hmc.split_leapfrog` or a fixed transition.
    Returns ``(positions, next step size, next inverse mass, the rows of the
    step size curve's points and which rows are points, info)``.
    """
    draws, infos, iterations, fronts, residuals = padded_window_draws(
        transition,
        potential_fn,
        solver,
        padded_length,
        lockstep,
        x,
        step_size,
        inverse_mass,
        key,
        plan,
    )
    transition = with_leapfrog(transition, plan.leapfrog)
    num_chains, _, dim = draws.shape
    length = jnp.asarray(plan.length, jnp.int32)
    half = length // 2
    steps = jnp.arange(padded_length)
    active = steps < length
    pooled = jnp.broadcast_to((steps >= half) & active, (num_chains, padded_length))
    sequential = plan.max_iter == 0
    _, k_curve = jax.random.split(key)
    draws, restarted = restart_stuck(
        draws, infos.accepted & active, jax.random.fold_in(k_curve, 1)
    )

    if metric == "hessian":
        points, _ = window_points(draws, half, length, *(hessian_points,) * 2)
        estimate = hessian_inverse_mass(potential_fn, points)
    else:
        estimate = pooled_inverse_mass(
            draws.reshape(-1, dim), metric == "dense", pooled.reshape(-1)
        )
    finite = jnp.all(jnp.where(pooled[..., None], jnp.isfinite(draws), True))
    usable = jnp.all(jnp.isfinite(estimate)) & finite
    new_inverse = jnp.where(adapt_metric & usable, estimate, inverse_mass)

    factors = jnp.asarray(WINDOW_FACTORS, draws.dtype)
    points, valid = window_points(draws, half, length, num_curve_points, slots)
    accept = acceptance_curve(
        transition,
        potential_fn,
        points,
        step_size,
        mass_matrix_sqrt(new_inverse),
        factors,
        k_curve,
        valid,
        curve_transitions,
    )
    new_step_size = choose_step_size(step_size, factors, accept, target)

    fallbacks = length - fronts
    # a sequential window: no iteration, the finish from the start (1 + W g)
    critical, total, levels = window_costs(
        transition,
        solver,
        length,
        False,
        iterations,
        fallbacks,
        num_chains,
        dim,
        jnp.sum(valid) * factors.shape[0],
        hessian_points,
        adapt_metric,
        curve_transitions=curve_transitions,
    )
    prob = jnp.where(active & jnp.isfinite(infos.accept_prob), infos.accept_prob, 0.0)
    info = WindowInfo(
        num_steps=length,
        sequential=sequential,
        newton_iterations=jnp.max(iterations),
        num_converged=jnp.sum(~sequential & (fronts >= length)),
        fallback_steps=jnp.asarray(jnp.max(fallbacks), jnp.int32),
        residual=jnp.max(residuals),
        mean_accept_prob=jnp.sum(prob) / (num_chains * length),
        num_diverging=jnp.sum(infos.diverging & active),
        num_restarted=jnp.sum(restarted),
        step_size=step_size,
        metric_updated=adapt_metric & usable,
        critical_path_gradients=jnp.asarray(critical, jnp.int32),
        total_gradients=jnp.asarray(total, draws.dtype),
        scan_levels=jnp.asarray(levels, jnp.int32),
    )
    last = draws[:, length - 1]
    return last, new_step_size, new_inverse, (points, valid), info
