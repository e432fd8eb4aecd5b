r"""One warmup window of all chains at a fixed kernel, then the adaptation.

The unit :func:`~numpyro_deer.core.parallel_warmup.parallel_warmup` repeats:
the window's ``C x W`` transitions (:func:`~.warmup_window.window_draws`: the
sequential scan, or one DEER solve of all chains with a tape per chain), then
chains that accepted no proposal restarted from another chain's draws
(:func:`~.warmup_adapt.restart_stuck`), then from the second half of its
draws pooled over chains the new metric
(:func:`~.warmup_adapt.pooled_inverse_mass` or the inverse mean Hessian) and
the new step size, where the pooled acceptance curve falls through the target
times its plateau
(:func:`~.warmup_adapt.acceptance_curve`, :func:`~.warmup_adapt.choose_step_size`),
and the window's counts (:func:`~.warmup_cost.window_costs`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array

from .metric import mass_matrix_sqrt
from .newton import DEERSolver
from .transition import PotentialFn, Transition
from .warmup_adapt import (
    acceptance_curve,
    choose_step_size,
    hessian_inverse_mass,
    pooled_inverse_mass,
    restart_stuck,
    spread,
)
from .warmup_cost import WindowInfo, window_costs
from .warmup_window import window_draws

__all__ = ["WINDOW_FACTORS", "warmup_window"]

WINDOW_FACTORS = tuple(2.0 ** (k / 2) for k in range(-16, 9))
"""Step size factors of the acceptance curve between windows (``2^(k/2)``,
1/256 to 16: a new metric can move the step size far)."""


@partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 6, 7, 8), static_argnames="stall")
def warmup_window(
    transition: Transition,
    potential_fn: PotentialFn,
    solver: DEERSolver,
    num_steps: int,
    sequential: bool,
    metric: str,
    target: float,
    num_curve_points: int,
    num_hessian_points: int,
    x: Array,
    step_size: Array,
    inverse_mass: Array,
    adapt_metric: Array,
    key: Array,
    *,
    stall: int = 0,
) -> tuple[Array, Array, Array, Array, WindowInfo]:
    """One window for all chains at a fixed kernel, then the adaptation.

    ``stall``: the front-stall stop of the DEER solve
    (:func:`~.warmup_window.lockstep_solve`; 0: none). The metric is
    estimated after the window where ``adapt_metric`` (traced, so windows of
    one length share one program). Returns ``(positions, next
    step size, next inverse mass, the pooled draws of the step size curve,
    info)``.
    """
    num_chains, dim = x.shape
    key, k_curve = jax.random.split(key)
    draws, infos, iterations, fronts, residuals = window_draws(
        transition,
        potential_fn,
        solver,
        num_steps,
        sequential,
        x,
        step_size,
        mass_matrix_sqrt(inverse_mass),
        key,
        stall,
    )
    draws, restarted = restart_stuck(
        draws, infos.accepted, jax.random.fold_in(k_curve, 1)
    )
    pooled = draws[:, num_steps // 2 :].reshape(-1, dim)

    hessian_points = 0
    if metric == "hessian":
        hessian_points = min(num_hessian_points, pooled.shape[0])
        estimate = hessian_inverse_mass(potential_fn, spread(pooled, hessian_points))
    else:
        estimate = pooled_inverse_mass(pooled, metric == "dense")
    usable = jnp.all(jnp.isfinite(estimate)) & jnp.all(jnp.isfinite(pooled))
    new_inverse = jnp.where(adapt_metric & usable, estimate, inverse_mass)

    factors = jnp.asarray(WINDOW_FACTORS, x.dtype)
    points = spread(pooled, num_curve_points)
    accept = acceptance_curve(
        transition,
        potential_fn,
        points,
        step_size,
        mass_matrix_sqrt(new_inverse),
        factors,
        k_curve,
    )
    new_step_size = choose_step_size(step_size, factors, accept, target)

    max_iterations = jnp.max(iterations)
    fallbacks = num_steps - fronts
    fallback = num_steps if sequential else jnp.max(fallbacks)
    critical, total, levels = window_costs(
        transition,
        solver,
        num_steps,
        sequential,
        iterations,
        fallbacks,
        num_chains,
        dim,
        points.shape[0] * factors.shape[0],
        hessian_points,
        adapt_metric,
    )
    prob = infos.accept_prob
    info = WindowInfo(
        num_steps=jnp.asarray(num_steps, jnp.int32),
        sequential=jnp.asarray(sequential),
        newton_iterations=max_iterations,
        num_converged=jnp.sum(~sequential & (fronts >= num_steps)),
        fallback_steps=jnp.asarray(fallback, jnp.int32),
        residual=jnp.max(residuals),
        mean_accept_prob=jnp.mean(jnp.where(jnp.isfinite(prob), prob, 0.0)),
        num_diverging=jnp.sum(infos.diverging),
        num_restarted=jnp.sum(restarted),
        step_size=step_size,
        metric_updated=adapt_metric & usable,
        critical_path_gradients=jnp.asarray(critical, jnp.int32),
        total_gradients=jnp.asarray(total, x.dtype),
        scan_levels=levels,
    )
    return draws[:, -1], new_step_size, new_inverse, points, info
