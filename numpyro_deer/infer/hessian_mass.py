r"""A dense mass matrix from the curvature of the potential.

NumPyro's windowed adaptation estimates the inverse mass matrix ``M`` as the
covariance of the draws of each warmup window. A dense covariance needs many
effective draws (``D (D + 1) / 2`` entries), which a slowly mixing MALA warmup
does not provide. The curvature does not need them: the Hessian of the
potential ``U`` averaged over a few draws ``x_k`` of the posterior,

.. math::

    \bar H = \frac{1}{K} \sum_k \nabla^2 U(x_k), \qquad
    M = \bar H^{-1},

is a full-rank estimate of the posterior precision (exact for a Gaussian), the
"Laplace" preconditioner of Newton-type samplers (Girolami and Calderhead,
2011, use the local one; here it is fixed after warmup so MALA stays MALA). In
the metric ``M`` the mean curvature is the identity, so one step size suits
every direction. Where ``U`` is not convex the eigenvalues are taken in
absolute value (as in Betancourt's SoftAbs metric, 2013) and floored at
:data:`~numpyro_deer.core.hessian.EIGENVALUE_FLOOR` times the largest one.

:func:`hessian_mass` plugs this into NumPyro's ``warmup_adapter`` (run
without a mass matrix estimate of its own): at the end of each middle window
(:func:`is_hessian_window_end`) the inverse mass matrix becomes ``M`` from the
kernel's curvature points, and the step size search and dual averaging
restart in the new metric exactly as NumPyro does after its own update
(:mod:`numpyro_deer.infer.warmup`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from numpyro.infer.hmc_util import build_adaptation_schedule

from ..core.certificate import tree_where
from ..core.hessian import COLUMN_BATCH, inverse_abs_mean_hessian
from ..core.hessian import EIGENVALUE_FLOOR as EIGENVALUE_FLOOR
from ..core.metric import mass_matrix_sqrt
from ..core.newton import DEERSolver
from .chains import on_cpu

MAX_HESSIAN_DIM = 512
"""Largest latent dimension for which the ``"auto"`` settings use the mean
Hessian (``solve_basis`` and ``adapt_mass_matrix``): it costs ``16 D``
Hessian-vector products (at most 4,096, see
:func:`~numpyro_deer.core.hessian.points_within_budget`) and a ``D x D``
eigendecomposition per use, and a ``D x D`` product per gradient."""


MAX_HESSIAN_CHAIN_WORK = 2**32
"""Largest ``num_chains * D**3`` for which the ``"auto"`` settings
(``adapt_mass_matrix`` and ``solve_basis``) use the mean Hessian with
vectorized chains: every chain takes its own Hessian (``16 D``
Hessian-vector products) and ``D x D`` eigendecomposition at each window end
(and each DEER block). The decomposition itself is cheap on a GPU (1,024
matrices of ``D = 100`` in 6 ms on an H100, ``benchmarks/window_end.py``),
and with the Hessian's columns 8 at a time (:func:`window_end_columns`) a
first accurate answer of 256 to 1,024 chains came 1.4 s sooner to 5.9 s
later than with the diagonal estimate at ``D = 50`` to ``100``. Measured on an H100
(``docs/performance.md``): item response theory (``D = 501``) with 256
chains (``3.2e10``) reached error 0.01 in 22 s with the Hessian and 9.5 s
with NumPyro's diagonal estimate, with 1,024 chains not within 45 s;
``D = 100`` with 1,024 chains (``1e9``) keeps the Hessian, which the
Inference Gym's ill-conditioned Gaussian needs (5.1 s, the diagonal
estimate not within 12 s)."""


def hessian_affordable(dim: int, num_chains: int = 1) -> bool:
    """Whether the ``"auto"`` settings take the mean Hessian for
    ``num_chains`` vectorized chains (one program) of ``dim`` latent
    dimensions: ``dim`` up to :data:`MAX_HESSIAN_DIM` and ``num_chains *
    dim**3`` up to :data:`MAX_HESSIAN_CHAIN_WORK`."""
    return dim <= MAX_HESSIAN_DIM and num_chains * dim**3 <= MAX_HESSIAN_CHAIN_WORK


def resolve_mass_adaptation(
    adapt_mass_matrix: bool | str, dense_mass: bool, dim: int, num_chains: int = 1
) -> bool | str:
    """``adapt_mass_matrix="auto"`` as ``"hessian"`` or ``True``.

    ``"auto"`` is the Hessian mass where :func:`hessian_affordable` (``dim``
    and ``num_chains``, the vectorized chains one program computes) unless a
    dense sample covariance was asked for (``dense_mass=True``), NumPyro's
    windowed estimate otherwise. Any other value is returned as it is.
    """
    if adapt_mass_matrix != "auto":
        return adapt_mass_matrix
    return "hessian" if not dense_mass and hessian_affordable(dim, num_chains) else True


def auto_solve_basis(solver: DEERSolver, dim: int, num_chains: int = 1) -> str:
    """``solve_basis="auto"`` for ``num_chains`` vectorized chains of ``dim``
    dimensions: the Hessian's eigenbasis (where a diagonal Jacobian misses
    less) within :func:`hessian_affordable`'s bound; the whitened
    coordinates beyond it (every chain would take its own Hessian and
    eigendecomposition per block) and for a dense Jacobian (Newton's iterates
    do not depend on the basis, so the Hessian and the pilot would be work
    and compile time spent for nothing)."""
    dense = solver.jacobian_for(dim).structure == "dense"
    return (
        "hessian" if hessian_affordable(dim, num_chains) and not dense else "whitened"
    )


def resolve_solve_basis(
    solver: DEERSolver, dim: int, num_chains: int = 1
) -> DEERSolver:
    """``solver`` with ``solve_basis="auto"`` replaced by
    :func:`auto_solve_basis`'s choice; any other basis as it is."""
    if solver.solve_basis != "auto":
        return solver
    return dataclasses.replace(
        solver, solve_basis=auto_solve_basis(solver, dim, num_chains)
    )


def hessian_inverse_mass(
    potential: Callable[[Array], Array],
    points: Array,
    column_batch: int | None = None,
) -> tuple[Array, Array, Array, Array]:
    """``M = |H|^{-1}`` and NumPyro's two square roots of it, and a finite flag.

    Returns ``(inverse_mass_matrix, mass_matrix_sqrt, mass_matrix_sqrt_inv,
    finite)`` with NumPyro's conventions for a dense matrix:
    ``mass_matrix_sqrt`` is the lower Cholesky factor of the mass matrix
    ``M^{-1}`` and ``mass_matrix_sqrt_inv`` its inverse. ``finite`` is false
    when the Hessian is not finite at some point; the matrices are then
    meaningless. ``column_batch``: the Hessian's columns taken at a time
    (:func:`~numpyro_deer.core.hessian.mean_hessian`).
    """
    inverse, finite = inverse_abs_mean_hessian(potential, points, column_batch)
    eye = jnp.eye(inverse.shape[-1], dtype=inverse.dtype)
    # NumPyro's factorisation of a dense inverse mass matrix (hmc_util)
    sqrt_inv = jnp.swapaxes(mass_matrix_sqrt(inverse), -2, -1)
    sqrt = jax.scipy.linalg.solve_triangular(sqrt_inv, eye, lower=True)
    return inverse, sqrt, sqrt_inv, finite


def adapt_mass_sqrt(adapt: Any) -> Array:
    """``L`` (:mod:`numpyro_deer.core.metric`) of NumPyro's adapt state's
    metric, from the factor the state keeps (``mass_matrix_sqrt_inv``: ``L``
    itself for a diagonal metric, ``L^T`` for a dense one), which NumPyro's
    adapter and :func:`hessian_mass` update with the metric: no
    factorisation per step (a ``D x D`` Cholesky per chain, which at
    ``D = 501`` made a warmup step 100 times slower on a CPU)."""
    sqrt_inv = adapt.mass_matrix_sqrt_inv
    return sqrt_inv if sqrt_inv.ndim == 1 else jnp.swapaxes(sqrt_inv, -2, -1)


def is_hessian_window_end(before: Any, after: Any, num_windows: int) -> Array:
    """Whether the update ``before -> after`` ended a middle adaptation window."""
    window_end = after.window_idx != before.window_idx
    middle = (before.window_idx > 0) & (before.window_idx < num_windows - 1)
    return window_end & middle


def hessian_mass(
    state: Any,
    potential: Callable[[Array], Array],
    points: Array,
    vectorized: bool = False,
):
    """``(state, finite)``: NumPyro's adapt ``state`` with the inverse mean
    Hessian at ``points`` (``(K, D)``) as its metric, and whether that Hessian
    is finite; where it is not, ``state`` is returned unchanged (the previous
    metric is kept: under the Hessian mass the adapter estimates none of its
    own). The step size search in the new metric is
    :func:`~numpyro_deer.infer.warmup.restart_step_size`'s. ``vectorized``:
    ``state`` is one chain of several mapped side by side (the Hessian's
    columns then by :func:`window_end_columns`)."""
    inverse, sqrt, sqrt_inv, finite = hessian_inverse_mass(
        potential, points, window_end_columns(vectorized)
    )
    new = state._replace(
        inverse_mass_matrix=inverse,
        mass_matrix_sqrt=sqrt,
        mass_matrix_sqrt_inv=sqrt_inv,
    )
    return tree_where(finite, new, state), finite


def window_end_columns(batched: bool) -> int | None:
    """The Hessian columns a window end takes at a time: every chain's
    :data:`~numpyro_deer.core.hessian.COLUMN_BATCH` where the vectorized
    chains run side by side (``jax.vmap``, not on a CPU: ``map_chains``), so
    that ``C`` chains hold ``C * 8 * K`` gradients' intermediates at once
    instead of ``C * D * K`` (the D = 100 logistic regression of
    ``benchmarks/``: 131 MB a chain by XLA's memory analysis on a CPU, so
    about 134 GB for 1,024 chains, which the memory plan would split into
    groups of chains and compile again at the first window end); ``None``
    (:func:`~numpyro_deer.core.hessian.mean_hessian`'s own rule) for one
    chain at a time."""
    return COLUMN_BATCH if batched and not on_cpu() else None


def hessian_window_ends(num_warmup: int) -> tuple[int, ...]:
    """The iteration counts after the warmup steps that end a middle window
    of NumPyro's schedule (:func:`is_hessian_window_end` holds for the update
    of step ``i - 1``): where the host applies :func:`hessian_mass` between
    warmup loops."""
    schedule = build_adaptation_schedule(num_warmup)
    return tuple(int(window.end) + 1 for window in schedule[1:-1])
