"""Gradient counts of a run: all evaluations and the critical path.

The definitions are in ``benchmarks/race.py``'s module docstring (section
*Gradients and the critical path*); this module implements them from what each
sampler reports, for ``race.py``, ``end_to_end.py``, ``paper.py`` and
``many_chains.py``. A *gradient-equivalent* is one evaluation of ``grad U`` or
one Jacobian-vector (Hessian-vector) product through it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from numpyro_deer.core.warmup_cost import solve_costs, tangent_directions


@dataclass(frozen=True)
class Counts:
    """``gradients`` (all chains), ``critical_path_gradients`` and ``scan_levels``."""

    gradients: float = 0.0
    critical_path_gradients: float = 0.0
    scan_levels: float = 0.0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.gradients + other.gradients,
            self.critical_path_gradients + other.critical_path_gradients,
            self.scan_levels + other.scan_levels,
        )

    def scaled(self, frac: float) -> Counts:
        """Linear interpolation inside a segment (``frac`` of its draws)."""
        return Counts(
            frac * self.gradients,
            frac * self.critical_path_gradients,
            frac * self.scan_levels,
        )

    def as_dict(self) -> dict:
        return {k: float(v) for k, v in asdict(self).items()}


def from_steps(steps, lockstep: bool) -> Counts:
    """Counts of chains that each evaluate ``steps[c, t]`` dependent gradients
    at iteration ``t`` (NUTS's ``num_steps``, a trajectory's integration steps).

    ``lockstep``: the chains are vectorized (one program, ``vmap``), so an
    iteration lasts as long as its slowest chain: the critical path is
    ``sum_t max_c steps[c, t]``. Otherwise (one chain per core, or one chain)
    each chain runs on its own: ``max_c sum_t steps[c, t]``.
    """
    steps = np.asarray(steps, np.float64)
    if steps.ndim == 1:
        steps = steps[None]
    if steps.size == 0:
        return Counts()
    critical = steps.max(0).sum() if lockstep else steps.sum(1).max()
    return Counts(float(steps.sum()), float(critical))


def sequential(chains: int, transitions: int, per_transition: int, init: int = 0):
    """``transitions`` dependent transitions of ``per_transition`` gradients on
    each of ``chains`` chains side by side, after ``init`` gradients."""
    depth = transitions * per_transition + init
    return Counts(float(chains * depth), float(depth))


@dataclass(frozen=True)
class TransitionCost:
    """Gradient evaluations of one transition of a DEER kernel.

    Attributes:
        step: in the step function the solver linearises (and warmup takes),
            which recomputes ``grad U`` at its starting point: MALA 2, HMC
            with ``L`` leapfrog steps ``L + 1``.
        carried: in a sequential loop that carries ``grad U`` (the
            ``"sequential"`` method, the sweep, the fallback): MALA 1, HMC
            ``L``.
    """

    step: int
    carried: int


def transition_cost(kernel, num_steps=None) -> TransitionCost:
    """The :class:`TransitionCost` of a ``DEERMALA`` or ``DEERHMC``:
    ``num_steps`` leapfrog steps (a run's ``state.num_steps``: under
    ``DEERHMC(num_steps="auto")`` the count chosen at the end of warmup),
    default those of the kernel's transition (warmup's)."""
    if num_steps is None:
        num_steps = getattr(kernel.transition, "num_steps", None)
    if num_steps is None:  # MALA
        return TransitionCost(2, 1)
    return TransitionCost(int(num_steps) + 1, int(num_steps))


def run_num_steps(mcmc) -> int:
    """The leapfrog count of a run's sampling transitions (its last state's;
    1 for MALA, whose cost is HMC's with one step)."""
    return int(np.max(np.asarray(mcmc.last_state.num_steps)))


def deer_run_blocks(mcmc, dim: int) -> Counts:
    """:func:`deer_kernel_blocks` of a ``numpyro_deer.MCMC`` run: its kernel,
    each block's Newton iterations and front (the extra fields
    ``newton_iterations`` and ``block.info.front`` at each block's first
    draw) and the run's leapfrog count (:func:`run_num_steps`)."""
    kernel = mcmc.sampler
    block = kernel.block_size
    fields = mcmc.get_extra_fields(group_by_chain=True)
    return deer_kernel_blocks(
        kernel,
        np.asarray(fields["newton_iterations"])[:, ::block],
        np.asarray(fields["block.info.front"])[:, ::block],
        dim,
        num_steps=run_num_steps(mcmc),
    )


def deer_blocks(
    iterations,
    fronts,
    *,
    block_size: int,
    dim: int,
    g: int,
    solver,
    hessian_points: int = 0,
    lockstep: bool = True,
) -> Counts:
    """Counts of DEER-solved blocks of ``block_size`` transitions of ``g``
    gradients each (MALA 1, HMC ``L``): ``iterations[c, b]`` Newton
    iterations and front ``fronts[c, b]`` of block ``b`` of chain ``c``, solved
    by ``solver``.

    A block's count is :func:`numpyro_deer.core.warmup_cost.solve_costs`,
    the one count of a DEER solve (the parallel warmup's windows report the
    same): per Newton iteration every step's value and Jacobian tangents,
    ``2 (g + 1)`` on the critical path, the sweep's segments and steps; a
    block whose front stops short of ``B`` finished sequentially; ``ceil(log2
    B)`` scan levels per iteration. ``hessian_points`` ``K > 0``: the solve
    basis's mean Hessian, ``K (1 + dim)`` in all, 2 on the path. Vectorized
    chains (``lockstep``) run each block's Newton loop until the slowest
    chain's solve ends, then the longest fallback; chains on their own
    cores (or one chain) each add up their own blocks.
    """
    its = np.asarray(iterations, np.float64)
    fronts = np.asarray(fronts, np.float64)
    if its.ndim == 1:
        its, fronts = its[None], fronts[None]
    if its.size == 0:
        return Counts()
    B = block_size
    directions = tangent_directions(solver, dim)
    fallback = np.maximum(B - fronts, 0.0)
    path, work = solve_costs(solver, g, B, its, fallback, directions, xp=np)
    hessian_path = 2 if hessian_points else 0
    work = work + hessian_points * (1 + dim)
    levels = its * math.ceil(math.log2(B)) if B > 1 else its * 0
    if lockstep:
        path, _ = solve_costs(
            solver, g, B, its.max(0), fallback.max(0), directions, xp=np
        )
        critical = (path + hessian_path).sum()
        scan = levels.max(0).sum()
    else:
        critical = (path + hessian_path).sum(1).max()
        scan = levels.sum(1).max()
    return Counts(float(work.sum()), float(critical), float(scan))


def deer_kernel_blocks(
    kernel, iterations, fronts, dim: int, lockstep=True, num_steps=None
) -> Counts:
    """:func:`deer_blocks` with the settings read from a ``DEERMALA`` or
    ``DEERHMC`` (its run's solver, whose ``solve_basis="auto"`` the kernel
    resolved at ``init``, and block size); ``num_steps``: as for
    :func:`transition_cost` (:func:`run_num_steps`)."""
    cost = transition_cost(kernel, num_steps)
    its = np.asarray(iterations)
    blocks = its.shape[-1] if its.ndim else 1
    chains = its.shape[0] if its.ndim == 2 else 1
    block_size = kernel.program.block_size  # the run's (fitted) size
    if kernel_method(kernel) == "sequential":
        return sequential(chains, blocks * block_size, cost.carried, 0) + (
            sequential(chains, blocks, 1)  # the gradient at each block's start
        )
    solver = kernel.program.settings.solver
    return deer_blocks(
        iterations,
        fronts,
        block_size=block_size,
        dim=dim,
        g=cost.carried,
        solver=solver,
        hessian_points=16 if solver.solve_basis == "hessian" else 0,
        lockstep=lockstep,
    )


def kernel_method(kernel) -> str:
    """The method a DEER kernel computes its blocks with (``"auto"`` resolved
    where the kernel has chosen)."""
    method = kernel.method
    if method == "auto":
        method = getattr(kernel, "method_chosen", None) or "deer"
    return method


def deer_warmup(kernel, chains: int, num_warmup: int) -> Counts:
    """Warmup of a DEER kernel: ``num_warmup`` transitions of the step function
    per chain (NumPyro's adaptation; the initial step size search and the
    Hessian mass matrix's window ends are not counted)."""
    return sequential(chains, num_warmup, transition_cost(kernel).step)


class StepsCounter:
    """:func:`from_steps` over consecutive segments of one run.

    A chain per core finishes when its own total does, so its critical path
    is the largest running total over chains, not a sum of per-segment
    maxima; each :meth:`add` returns the increment of the counts.
    """

    def __init__(self, lockstep: bool):
        self.lockstep = lockstep
        self.totals = None  # per chain, for chains on their own cores

    def add(self, steps) -> Counts:
        steps = np.asarray(steps, np.float64)
        if steps.ndim == 1:
            steps = steps[None]
        if self.lockstep:
            return from_steps(steps, True)
        before = 0.0 if self.totals is None else float(self.totals.max())
        self.totals = steps.sum(1) + (0.0 if self.totals is None else self.totals)
        return Counts(float(steps.sum()), float(self.totals.max()) - before)
