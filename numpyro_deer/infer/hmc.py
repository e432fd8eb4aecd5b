"""``DEERHMC``: HMC as a NumPyro kernel whose blocks DEER solves."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import replace

from jax.sharding import Mesh
from numpyro.infer.initialization import init_to_uniform

from ..core.hmc import HMC
from ..core.newton import DEERSolver
from .chains import on_cpu
from .kernel import DEERKernel
from .trajectory import INITIAL_NUM_STEPS

MAX_UNROLLED_STEPS = 8
"""The longest fixed leapfrog count :func:`unrolls` writes out."""


def unrolls(num_steps: int | str) -> bool:
    """Whether a ``DEERHMC`` transition writes its leapfrog steps out
    (:func:`~numpyro_deer.core.hmc.leapfrog`'s ``unroll``): on an accelerator,
    for a fixed count of at most :data:`MAX_UNROLLED_STEPS`.

    On a GPU each iteration of the leapfrog loop launches its kernels and
    waits for the loop's condition on the host; written out, the steps of a
    cheap potential fuse. On one H100 the banana chain of Zoltowski et al.
    (100,000 transitions of 8 steps, DEER's full Jacobian, 39 Newton
    iterations either way, the same draws) took 42-44 ms instead of 56-57 ms
    (``benchmarks/paper.py``, whose ``--looped-leapfrog`` keeps the loop), its
    first run as long within the spread between runs. Each written-out step
    is traced and compiled anew in every program, so longer trajectories keep
    the loop, and so does ``num_steps="auto"`` (warmup's count and the chosen
    one are not measured written out). On a CPU the loop was the faster (1.2
    times on the banana's DEER block of 20,000 transitions; eight schools'
    sequential chain as fast, its first run 0.5 s longer written out).

    The arithmetic is the same; the compiler may round differently, so a
    chain can part ways from the looped one where an accept decision or the
    warmup's adaptation is within rounding of another outcome.
    """
    fixed = isinstance(num_steps, numbers.Integral) and not isinstance(num_steps, bool)
    return fixed and num_steps <= MAX_UNROLLED_STEPS and not on_cpu()


class DEERHMC(DEERKernel):
    r"""Hamiltonian Monte Carlo, parallel across the chain length.

    Each transition draws a momentum, takes ``num_steps`` leapfrog steps
    (Duane et al., 1987; Neal, 2011) and accepts the end point with
    probability :math:`\min(1, e^{H(x, p) - H(y, p')})`. With the momentum,
    the uniform and the step size jitter drawn first (the tape), a transition
    is a deterministic map of the state, and ``DEERHMC`` computes blocks of
    ``block_size`` transitions by the same parallel Newton solve as
    :class:`~numpyro_deer.DEERMALA` (Zoltowski et al., 2025): the result is the
    chain a sequential HMC would produce from the same randomness, up to the
    solver tolerance. Everything but the transition is ``DEERMALA``'s: the
    driver, chains, warmup with NumPyro's adapter (one HMC transition per
    warmup draw), the Hessian mass matrix, the solver settings, extra fields
    and the failure policy.

    A transition costs ``num_steps`` gradients where a MALA step costs one,
    and each Newton iteration evaluates the transition and its derivative at
    every step of the block, so an iteration costs about ``num_steps + 1``
    times a ``DEERMALA`` iteration. In exchange a transition moves much
    further: on three benchmark models ``num_steps=4`` gave 7 to 43 times the
    effective sample size per draw of ``DEERMALA`` at about the same number
    of Newton iterations per block (see the HMC page of the docs).

    Args:
        model: a NumPyro model with continuous latent sites.
        potential_fn: instead of a model, a potential energy on a pytree of
            unconstrained values; ``init_params`` must then be given to
            ``MCMC.run``.
        num_steps: leapfrog steps per transition (``L``), or ``"auto"`` (the
            default): warmup takes 4, and at its end the sampling transitions
            take :math:`\lceil (\pi / 2) / \epsilon \rceil` (4 to 32) for
            the adapted step size :math:`\epsilon` (the median over
            vectorized chains, which share the count): a trajectory of a
            quarter period of a unit-curvature direction in the adapted
            metric (:func:`~numpyro_deer.core.hmc.num_steps_for`). The count
            is the extra field ``"num_steps"``. Longer trajectories cost more
            gradients per transition and more Newton iterations per block.
        jitter: each transition's step size is the adapted one times a factor
            drawn uniformly from ``[1 - jitter, 1 + jitter]`` (on the tape),
            which breaks the periodicity of a fixed trajectory length.
        step_size: initial step size (adapted in warmup when
            ``adapt_step_size``).
        target_accept_prob: acceptance rate the step size is adapted to in
            warmup (dual averaging). ``0.8`` by default.
        method: ``"auto"`` (the default, as for
            :class:`~numpyro_deer.DEERMALA`): the sequential scan on a CPU, and
            on an accelerator the faster of the two, measured by
            :class:`~numpyro_deer.MCMC`; ``"deer"`` or ``"sequential"`` by
            name.
        **others: ``adapt_step_size``, ``adapt_mass_matrix``, ``dense_mass``,
            ``init_strategy``, ``block_size``, ``solver``, ``on_failure``,
            ``validate_model`` and ``mesh`` are those of
            :class:`~numpyro_deer.DEERMALA`.
    """

    def __init__(
        self,
        model: Callable | None = None,
        potential_fn: Callable | None = None,
        *,
        num_steps: int | str = "auto",
        jitter: float = 0.2,
        step_size: float = 1.0,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool | str = "auto",
        dense_mass: bool = False,
        target_accept_prob: float = 0.8,
        init_strategy: Callable = init_to_uniform,
        block_size: int = 4096,
        method: str = "auto",
        solver: DEERSolver = DEERSolver(),
        on_failure: str = "sequential",
        validate_model: bool = True,
        mesh: Mesh | None = None,
    ):
        adapt = isinstance(num_steps, str)
        if adapt and num_steps != "auto":
            raise ValueError(
                f"DEERHMC(num_steps={num_steps!r}): use an integer >= 1 (leapfrog "
                "steps per transition) or 'auto' (chosen at the end of warmup)."
            )
        super().__init__(
            HMC(
                num_steps=INITIAL_NUM_STEPS if adapt else num_steps,
                jitter=jitter,
                unroll=unrolls(num_steps),
            ),
            model,
            potential_fn,
            step_size=step_size,
            adapt_step_size=adapt_step_size,
            adapt_mass_matrix=adapt_mass_matrix,
            dense_mass=dense_mass,
            target_accept_prob=target_accept_prob,
            init_strategy=init_strategy,
            block_size=block_size,
            method=method,
            solver=solver,
            on_failure=on_failure,
            validate_model=validate_model,
            mesh=mesh,
        )
        if adapt:
            self._settings = replace(self._settings, adapt_num_steps=True)

    @property
    def num_steps(self) -> int | str:
        """The ``num_steps`` argument: leapfrog steps per transition, or
        ``"auto"`` (a run's count is the extra field ``"num_steps"``)."""
        return "auto" if self._settings.adapt_num_steps else self.transition.num_steps
