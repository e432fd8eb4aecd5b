r"""Warmup solved in parallel across time and chains.

Sequential warmup adapts the kernel after every transition, so there is no
fixed map ``s_t = f_t(s_{t-1})`` to solve in parallel, and its critical path is
``num_warmup`` dependent transitions whatever the number of chains. Here the
warmup of ``C`` chains is a few *windows*; within a window of ``W``
transitions the kernel (step size, metric) is fixed, so the window is a block
of taped transitions like any other, and one DEER solve (:func:`deer_solve`
``vmap``-ped over the chains, a tape per chain) computes it for all chains at
once, exactly (:mod:`~numpyro_deer.core.warmup_window`). Between windows the
kernel is adapted from statistics pooled over all chains and the draws of the
window:

* **metric** (:func:`~numpyro_deer.core.warmup_adapt.pooled_inverse_mass`):
  the variance (``"diag"``) or covariance (``"dense"``) of the second half
  of the window's draws of all chains, regularised as Stan and NumPyro do,
  ``n/(n+5) var + 1e-3 * 5/(n+5)``; or (``"hessian"``) the inverse of the mean
  Hessian of the potential at pooled draws, eigenvalues in absolute value and
  floored (:mod:`numpyro_deer.core.hessian`);
* **step size** (:mod:`~numpyro_deer.core.warmup_adapt`):
  ``curve_transitions`` transitions of the kernel in the new metric are
  taken from each of up to ``num_curve_points`` pooled draws at each of a
  few step sizes ``eps * f_k`` (common random numbers), all in parallel.
  Their mean acceptance estimates the acceptance curve ``a(eps)`` along the
  chains (:func:`~numpyro_deer.core.warmup_adapt.acceptance_curve`: off the
  typical set one transition's acceptance overstates it); the new step
  size is where the curve falls through ``target_accept_prob`` times its
  maximum (points that accept nothing at any candidate left out,
  :func:`~numpyro_deer.core.warmup_adapt.choose_step_size`), interpolated
  linearly in ``log eps`` between the neighbouring candidates; chains that
  accepted no proposal in the window first restart from the draws of moving
  ones (:func:`~numpyro_deer.core.warmup_adapt.restart_stuck`). Dual averaging (Hoffman
  and Gelman, 2014) exists to average out the noise of one acceptance per
  update with decaying gains; a pooled estimate over hundreds of draws has
  little noise, so root finding on the estimated curve is the direct rule,
  converges in one update when the draws are near stationarity, and costs
  ``curve_transitions`` transitions on the critical path.

The initial step size is the same curve at the initial positions over a wide
grid of factors. Far from the typical set (the first windows) the dynamics
need not contract and Newton may need about as many iterations as the
window has steps (Gonzalez et al., 2025, "Predictability enables
parallelization"); ``WarmupSchedule.num_sequential`` leading windows run the
sequential scan instead, and with ``cap_iterations`` a DEER window stops at
the break-even iteration count and finishes sequentially from its front
(:func:`~numpyro_deer.core.transition.finish_chain`): its draws are the chain
either way, and the fallback steps are reported. HMC's number of leapfrog
steps is fixed within a window and, with ``num_steps_choices``, chosen
between windows by ChEES per gradient.

The critical path (dependent gradient evaluations) and the total work of
every window are counted in :mod:`numpyro_deer.core.warmup_cost`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from .adapted_window import padded_window_draws, warmup_window
from .hmc import split_leapfrog
from .metric import mass_matrix_sqrt
from .newton import DEERSolver
from .transition import PotentialFn, Transition
from .warmup_adapt import (
    CURVE_TRANSITIONS,
    INITIAL_FACTORS,
    chees_per_gradient,
    initial_step_size,
)
from .warmup_cost import WarmupInfo, gradients_per_transition
from .warmup_window import (
    WindowPlan,
    sample_window,
    solve_window,
    stall_iterations,
    window_solver,
    window_tapes,
)

__all__ = [
    "ParallelWarmupResult",
    "WarmupSchedule",
    "WindowPlan",
    "check_schedule",
    "initial_step_size",
    "padded_window_draws",
    "parallel_warmup",
    "sample_window",
    "solve_window",
    "warmup_window",
    "window_solver",
    "window_tapes",
]

METRICS = ("diag", "dense", "hessian")

STALL_FRACTION = 0.5
"""Default look-back of the front-stall stop, a fraction of the break-even
iteration count (:func:`~.warmup_window.stall_iterations`)."""


class WarmupSchedule(NamedTuple):
    """Windows of a parallel warmup.

    Attributes:
        windows: transitions per window (``W``), in order. Newton's
            iterations grow slowly with ``W`` where the chains mix, so few
            long windows make the shortest critical path.
        num_sequential: leading windows computed by the sequential scan
            instead of a DEER solve (chains far from the typical set).
        first_metric_window: the metric is estimated after each window from
            this index on (the windows before it keep the identity).
    """

    windows: tuple[int, ...] = (64, 256, 1024)
    num_sequential: int = 1
    first_metric_window: int = 1


class ParallelWarmupResult(NamedTuple):
    """What the sampling phase starts from.

    Attributes:
        positions: the chains' last warmup states, ``(C, D)``.
        step_size: the adapted step size (scalar).
        inverse_mass_matrix: ``(D,)`` (diagonal) or ``(D, D)``.
        mass_matrix_sqrt: ``L`` with ``L L^T`` the inverse mass matrix, as
            :mod:`numpyro_deer.core.metric` takes it.
        info: per window and in total, a :class:`WarmupInfo`.
    """

    positions: Array
    step_size: Array
    inverse_mass_matrix: Array
    mass_matrix_sqrt: Array
    info: WarmupInfo


def check_schedule(schedule: WarmupSchedule) -> None:
    """Raise ``ValueError`` naming the field if ``schedule`` is not usable."""
    windows = schedule.windows
    if not windows or not all(isinstance(w, int) and w >= 2 for w in windows):
        raise ValueError(
            f"WarmupSchedule(windows={windows!r}): use a non-empty tuple of "
            "integers >= 2 (transitions per window)."
        )
    for name in ("num_sequential", "first_metric_window"):
        value = getattr(schedule, name)
        if not (isinstance(value, int) and 0 <= value <= len(windows)):
            raise ValueError(
                f"WarmupSchedule({name}={value!r}): use an integer in "
                f"[0, {len(windows)}] (the number of windows)."
            )


def _identity_metric(metric: str, dim: int, dtype) -> np.ndarray:
    if metric == "diag":
        return np.ones((dim,), dtype)
    return np.eye(dim, dtype=dtype)


@partial(jax.jit, static_argnums=(0, 1))
def _choose_num_steps(
    potential_fn: PotentialFn,
    candidates: tuple[Transition, ...],
    points: Array,
    valid: Array,
    step_size: Array,
    inverse_mass: Array,
    key: Array,
) -> Array:
    """The index of the candidate of highest ChEES per gradient at the
    ``valid`` rows of ``points``."""
    scores = chees_per_gradient(
        potential_fn,
        candidates,
        points,
        step_size,
        mass_matrix_sqrt(inverse_mass),
        jax.random.fold_in(key, 1),
        valid,
    )
    return jnp.argmax(scores)


@jax.jit
def _report(rows, inverse_mass, used, critical, total):
    """The windows' infos stacked, the totals, the metric's square root: one
    program (eager, each would compile on its own)."""
    windows = jax.tree.map(lambda *a: jnp.stack(a), *rows)
    critical = jnp.sum(windows.critical_path_gradients) + critical
    total = jnp.sum(windows.total_gradients) + total
    used = jnp.asarray(used, jnp.int32)
    return windows, critical, total, used, mass_matrix_sqrt(inverse_mass)


def parallel_warmup(
    transition: Transition,
    potential_fn: PotentialFn,
    x0: Array,
    key: Array,
    *,
    schedule: WarmupSchedule | None = None,
    solver: DEERSolver = DEERSolver(),
    metric: str = "diag",
    target_accept_prob: float | None = None,
    step_size: float = 1.0,
    cap_iterations: bool = True,
    stall_fraction: float = STALL_FRACTION,
    num_curve_points: int = 256,
    num_hessian_points: int = 16,
    num_steps_choices: tuple[int, ...] | None = None,
    curve_transitions: int = CURVE_TRANSITIONS,
) -> ParallelWarmupResult:
    """Adapt step size and metric for ``C`` chains in a few parallel windows.

    Args:
        transition: the taped transition (:class:`~.mala.MALA`,
            :class:`~.hmc.HMC`).
        potential_fn: the potential energy of a flat vector, ``(D,) -> ()``.
        x0: initial positions, ``(C, D)``.
        key: the warmup's random key.
        schedule: the windows (:class:`WarmupSchedule`; ``None``: its
            defaults).
        solver: the DEER solver of each window (solved in the whitened
            coordinates of the window's metric, so its tolerances mean what
            they mean for the sampling blocks).
        metric: ``"diag"`` (pooled variance), ``"dense"`` (pooled covariance)
            or ``"hessian"`` (inverse mean Hessian at ``num_hessian_points``
            pooled draws; dense).
        target_accept_prob: the acceptance the step size is chosen for;
            ``None``: 0.8 for a transition with leapfrog steps, 0.9 otherwise
            (the defaults of ``DEERHMC`` and ``DEERMALA``).
        step_size: centre of the initial search's grid.
        cap_iterations: stop each window's solve at the break-even iteration
            count and finish it sequentially (the draws are the chain either
            way); otherwise ``solver``'s own limits apply.
        stall_fraction: with ``cap_iterations``, also stop a window's solve
            as soon as the slowest chain's front gained fewer steps over the
            last ``m`` Newton iterations than those iterations cost, ``m``
            this fraction of the break-even count
            (:func:`~.warmup_window.lockstep_solve`), and finish
            sequentially from the fronts; 0: no such stop.
        num_curve_points: pooled draws the acceptance curve is estimated at.
        curve_transitions: transitions from each of them (and each initial
            position) per candidate step size, their mean acceptance the
            curve (:func:`~.warmup_adapt.acceptance_curve`).
        num_hessian_points: pooled draws of the Hessian metric.
        num_steps_choices: for a transition with leapfrog steps (HMC), the
            candidate ``num_steps``: after each window that estimates the
            metric (the last one excepted) the next windows use the candidate
            of highest ChEES per gradient at the pooled draws
            (:func:`~.warmup_adapt.chees_per_gradient`); ``None`` keeps
            ``num_steps``. The leapfrog count is then traced in the window
            program, so every value runs the same program (without choices
            it stays a constant of the program).

    Returns:
        :class:`ParallelWarmupResult`. The windows run from a Python loop,
        so the call is not meant to be traced under an outer ``jit``. What
        compiles: one program for the windows and the adaptation after each
        (:func:`~.adapted_window.warmup_window`: the tapes as long as the
        longest window, a shorter window's steps past its end frozen, which
        neither changes its draws nor counts in its costs, though a DEER
        iteration computes them; the window's length, kind, iteration cap,
        front-stall look-back and, with ``num_steps_choices``, leapfrog
        count traced; a sequential window is a solve of no iteration
        finished sequentially, the same chain at the same cost), and one
        each for the initial step size search, the trajectory length choice
        and the report.
    """
    schedule = WarmupSchedule() if schedule is None else schedule
    check_schedule(schedule)
    if metric not in METRICS:
        raise ValueError(f"parallel_warmup(metric={metric!r}): use one of {METRICS}.")
    if not (isinstance(stall_fraction, int | float) and 0 <= stall_fraction <= 1):
        raise ValueError(
            f"parallel_warmup(stall_fraction={stall_fraction!r}): use a number "
            "in [0, 1] (0: no front-stall stop)."
        )
    x0 = jnp.asarray(x0)
    if x0.ndim != 2:
        raise ValueError(
            f"parallel_warmup(x0 of shape {x0.shape}): pass one flat position "
            "per chain, shape (num_chains, dim)."
        )
    if target_accept_prob is None:
        target_accept_prob = 0.8 if hasattr(transition, "num_steps") else 0.9
    if not 0 < target_accept_prob < 1:
        raise ValueError(
            f"parallel_warmup(target_accept_prob={target_accept_prob!r}): use a "
            "value in (0, 1)."
        )
    if num_steps_choices is not None and not (
        hasattr(transition, "num_steps")
        and num_steps_choices
        and all(isinstance(n, int) and n >= 1 for n in num_steps_choices)
    ):
        raise ValueError(
            f"parallel_warmup(num_steps_choices={num_steps_choices!r}): give a "
            "non-empty tuple of integers >= 1, for a transition with leapfrog "
            "steps (HMC)."
        )
    if not (isinstance(curve_transitions, int) and curve_transitions >= 1):
        raise ValueError(
            f"parallel_warmup(curve_transitions={curve_transitions!r}): use an "
            "integer >= 1 (transitions from each point of the step size curve)."
        )
    dim = x0.shape[1]
    keys = jax.random.split(key, len(schedule.windows) + 1)
    eps = initial_step_size(
        transition,
        potential_fn,
        x0,
        np.asarray(step_size, x0.dtype),
        float(target_accept_prob),
        keys[0],
        curve_transitions,
    )
    g_f = 1 + gradients_per_transition(transition)
    initial_total = x0.shape[0] * len(INITIAL_FACTORS) * g_f * curve_transitions
    inverse_mass = _identity_metric(metric, dim, x0.dtype)
    x, rows, used = x0, [], []
    # the initial search, then the trajectory length choices
    extra_critical, extra_total = curve_transitions * g_f, initial_total
    # with a trajectory length choice the leapfrog count is traced: one
    # program for every count; a fixed count stays a constant
    static = split_leapfrog(transition)[0] if num_steps_choices else transition
    # every window's tapes as long as the longest: one program for all
    padded_length = longest = max(schedule.windows)
    # rows of the step size curve's points: as many as any window has
    slots = min(num_curve_points, x0.shape[0] * (longest - longest // 2))
    # a capped window is one lockstep solve; its cap and look-back are traced
    base = solver
    if cap_iterations:
        budget = solver.max_iter * solver.max_solves
        base = dataclasses.replace(solver, max_iter=budget, max_solves=1)
    for index, num_steps in enumerate(schedule.windows):
        used.append(getattr(transition, "num_steps", 0))
        this_solver = window_solver(solver, transition, num_steps, cap_iterations)
        max_iter = 0 if index < schedule.num_sequential else this_solver.max_iter
        stall = stall_iterations(this_solver, stall_fraction) if cap_iterations else 0
        _, leapfrog = split_leapfrog(transition)
        # NumPy scalars go in as they are (a jnp conversion would compile)
        plan = WindowPlan(
            np.int32(num_steps), leapfrog, np.int32(max_iter), np.int32(stall)
        )
        pooled = x0.shape[0] * (num_steps - num_steps // 2)  # the second half
        x, eps_next, inverse_mass, points, row = warmup_window(
            static,
            potential_fn,
            base,
            padded_length,
            cap_iterations,
            metric,
            float(target_accept_prob),
            num_curve_points,
            slots,
            min(num_hessian_points, pooled) if metric == "hessian" else 0,
            x,
            eps,
            inverse_mass,
            np.bool_(index >= schedule.first_metric_window),
            keys[index + 1],
            plan,
            curve_transitions=curve_transitions,
        )
        rows.append(row)
        eps = eps_next
        last = index == len(schedule.windows) - 1
        if num_steps_choices and index >= schedule.first_metric_window and not last:
            candidates = tuple(
                dataclasses.replace(transition, num_steps=n) for n in num_steps_choices
            )
            best = _choose_num_steps(
                potential_fn, candidates, *points, eps, inverse_mass, keys[index + 1]
            )
            transition = candidates[int(best)]
            extra_critical += max(num_steps_choices) + 1
            num_points = min(num_curve_points, pooled)
            extra_total += num_points * sum(n + 1 for n in num_steps_choices)
    windows, critical, total, used, mass_sqrt = _report(
        rows, inverse_mass, used, extra_critical, extra_total
    )
    info = WarmupInfo(
        windows=windows,
        initial_step_size=rows[0].step_size,
        critical_path_gradients=critical,
        total_gradients=total,
        num_steps=used,
        final_num_steps=getattr(transition, "num_steps", 0),
    )
    return ParallelWarmupResult(x, eps, inverse_mass, mass_sqrt, info)
