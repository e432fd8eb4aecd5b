"""The settings of the DEER Newton solve of one block: :class:`DEERSolver`.

A small frozen object passed to the solvers (:func:`~numpyro_deer.core.deer_solve`,
the batched and sharded ones) and to the kernels (``solver=``); it owns the
Jacobian strategy and the gate as objects and checks its fields when built.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from .gates import Gate, gate_from_name
from .jacobian import (
    AutoJacobian,
    JacobianStrategy,
    jacobian_from_name,
    resolve_jacobian,
)

MAX_TOLERANCE = 1e-2
"""Largest ``atol`` or ``rtol`` a :class:`DEERSolver` accepts (whitened units)."""

SOLVE_BASES = ("auto", "whitened", "hessian")


__all__ = ["MAX_TOLERANCE", "SOLVE_BASES", "DEERSolver"]


@dataclass(frozen=True)
class DEERSolver:
    """How the parallel Newton solve of one block runs; the defaults in one place.

    Attributes:
        jacobian: the Jacobian strategy: ``"auto"`` (the default,
            :class:`~numpyro_deer.AutoJacobian`): ``"full"`` for a state of
            at most 2 dimensions, ``"stochastic"`` above, chosen where the
            block is solved (:meth:`jacobian_for`); ``"stochastic"``
            (Hutchinson diagonal,
            :class:`~numpyro_deer.StochasticDiagonalJacobian`), ``"diag"``
            (exact diagonal), ``"full"`` (dense) or a strategy object, which
            owns its settings (``num_probes``, ``clip``, ``precision``,
            ``max_full_dim``). Strings are the strategies with their defaults.
        gate: the derivative of the accept decision: ``"hard"`` (held
            constant), ``"sigmoid"`` or a gate object such as
            ``SigmoidGate(temperature=0.5)``. Never changes the chain.
        solve_basis: coordinates of the solve (used by the kernel):
            ``"whitened"`` (``w = L^{-1} x`` with ``M = L L^T`` the adapted
            inverse mass matrix), ``"hessian"`` (``w`` rotated to the
            eigenvectors of the potential's Hessian averaged over 16 draws,
            where a step's Jacobian ``I - eps H`` is nearly diagonal) or
            ``"auto"``: ``"hessian"`` up to 512 latent dimensions (with ``C``
            vectorized chains up to ``C D**3 = 2**32``), unless the Jacobian
            is dense (Newton's iterates do not depend on the basis then).
            The chain is the same in either basis.
        atol, rtol: a step passes when ``|s_t - f_t(s_{t-1})| <= atol +
            rtol |f_t(s_{t-1})|`` in every coordinate. ``None`` picks a default
            from the dtype: ``(1e-5, 1e-4)`` in float32, ``(1e-10, 1e-8)`` in
            float64. Each must be in ``[0, MAX_TOLERANCE]`` (``1e-2``): the
            solve runs in whitened coordinates, where a posterior standard
            deviation is about 1 and a step moves about ``sqrt(2 eps)``, so a
            tolerance of that order (or an infinite one) would certify states
            that are not the MALA step (an accept decision could flip
            unnoticed); at ``1e-2`` the certified state is within a hundredth
            of a posterior standard deviation of the step.
        max_iter: Newton iterations per solve.
        max_solves: solves per block; each restarts from the front, keeping
            the iterate as the initial guess. A block still unfinished after
            ``max_iter * max_solves`` iterations reports
            ``RESULTS.max_iterations_reached``.
        sweep: sequential steps computed at the start of each iteration from
            the front and from each local front, side by side (``0``: none);
            see :mod:`numpyro_deer.core.sweep`.
        sweep_after: iterations of a solve before the sweep starts (``0``:
            from the first); blocks that converge within them never pay for
            it.
    """

    jacobian: JacobianStrategy | AutoJacobian | str = "auto"
    gate: Gate | str = "hard"
    solve_basis: str = "auto"
    atol: float | None = None
    rtol: float | None = None
    max_iter: int = 100
    max_solves: int = 3
    sweep: int = 8
    sweep_after: int = 20

    def __post_init__(self):
        object.__setattr__(self, "jacobian", jacobian_from_name(self.jacobian))
        object.__setattr__(self, "gate", gate_from_name(self.gate))
        if self.solve_basis not in SOLVE_BASES:
            raise ValueError(
                f"DEERSolver(solve_basis={self.solve_basis!r}): use 'auto', "
                "'whitened' (the mass-matrix coordinates) or 'hessian' (their "
                "rotation to the eigenvectors of the mean Hessian)."
            )
        for name, low in (
            ("max_iter", 1),
            ("max_solves", 1),
            ("sweep", 0),
            ("sweep_after", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int) and value >= low):
                raise ValueError(
                    f"DEERSolver({name}={value!r}): use an integer >= {low}."
                )
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int | float) and 0 <= value <= MAX_TOLERANCE
            ):
                raise ValueError(
                    f"DEERSolver({name}={value!r}): use a number in [0, "
                    f"{MAX_TOLERANCE}] (or None for the dtype's default). The "
                    "solve runs in whitened coordinates, where a posterior "
                    "standard deviation is about 1; a larger (or infinite) "
                    "tolerance passes steps that are not the MALA step, so the "
                    "block would not be the chain."
                )

    def jacobian_for(self, dim: int) -> JacobianStrategy:
        """The Jacobian strategy that solves states of ``dim`` dimensions:
        ``jacobian`` itself, or the choice of an
        :class:`~numpyro_deer.AutoJacobian`."""
        return resolve_jacobian(self.jacobian, dim)

    def tolerances(self, dtype) -> tuple[float, float]:
        """``(atol, rtol)`` for the given dtype."""
        wide = jnp.finfo(dtype).bits >= 64
        atol = (1e-10 if wide else 1e-5) if self.atol is None else self.atol
        rtol = (1e-8 if wide else 1e-4) if self.rtol is None else self.rtol
        return atol, rtol
