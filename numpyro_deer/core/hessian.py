r"""The mean Hessian of a potential over a few points, and its eigenbasis.

``H = mean_k \nabla^2 U(x_k)`` over ``K`` points of the posterior is a
full-rank estimate of the posterior precision (exact for a Gaussian). The
kernel uses it twice: as a dense mass matrix (its inverse; NumPyro layer) and
as the *solve basis*, the eigenvectors of ``H`` in the whitened coordinates,
where a MALA step's Jacobian ``I - eps H(w)`` is nearly diagonal wherever
``H(w)`` is close to the mean, so a diagonal Jacobian estimate loses little.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array

EIGENVALUE_FLOOR = 1e-4
"""Smallest eigenvalue magnitude of a Hessian mass matrix, relative to the
largest (:func:`inverse_abs_mean_hessian`)."""

HESSIAN_VECTOR_BUDGET = 4096
"""Most Hessian-vector products one mean Hessian takes: ``K D`` of them with
``K`` points, so above ``D = 4096 / 16 = 256`` fewer of the points are used
(:func:`points_within_budget`)."""

COLUMN_BATCH = 8
"""Columns of the mean Hessian computed side by side above
:data:`ALL_COLUMNS_DIM`; up to it, all at once. On the CPU (an item response
model, 20 answers per student, ``benchmarks/warmup_cost.py``)
at ``D = 101`` all columns at once took 0.04 s and 8 at a time 0.14 s; at
``D = 501`` (8 points) 8 at a time took 1.0 s and all at once 3.1 s."""

ALL_COLUMNS_DIM = 128


def points_within_budget(points: Array) -> Array:
    """Every ``s``-th of ``points`` (``K, D``), ending at the last, so that
    ``K D / s`` Hessian-vector products stay within
    :data:`HESSIAN_VECTOR_BUDGET` (at least 2 points)."""
    num_points, dim = points.shape
    keep = max(2, min(num_points, HESSIAN_VECTOR_BUDGET // max(dim, 1)))
    stride = -(-num_points // keep)
    return points[num_points - 1 :: -stride][::-1]


def mean_hessian(
    potential: Callable[[Array], Array],
    points: Array,
    column_batch: int | None = None,
) -> Array:
    r"""The symmetrised Hessian of ``potential`` averaged over ``points`` (K, D).

    Column ``j`` is ``mean_k \nabla^2 U(x_k) e_j``, one forward-mode
    derivative of the gradients at the ``K`` points along ``e_j``; the columns
    are taken all at once up to ``D = 128`` and :data:`COLUMN_BATCH` at a time
    above (:func:`jax.lax.map`), where ``D K`` copies of the potential's
    intermediates at once are slower than a loop. ``column_batch`` takes that
    many at a time at any ``D`` above it: under :func:`jax.vmap` over ``C``
    chains all columns at once hold ``C D K`` copies (the D = 100 logistic
    regression of ``benchmarks/``: 131 MB a chain by XLA's plan on a CPU,
    beyond a GPU's memory with 1,024 chains). Above ``D = 256`` fewer points
    are used (:func:`points_within_budget`).
    """
    points = points_within_budget(points)
    grad = jax.grad(potential)

    def column(v):
        tangents = jax.vmap(lambda x: jax.jvp(grad, (x,), (v,))[1])(points)
        return jnp.mean(tangents, axis=0)

    dim = points.shape[-1]
    batch = column_batch or (dim if dim <= ALL_COLUMNS_DIM else COLUMN_BATCH)
    if dim <= batch:
        hessian = jax.vmap(column)(jnp.eye(dim, dtype=points.dtype))
    else:
        # rows of zeros pad the basis to whole batches: with a remainder,
        # lax.map would trace the column a second time for it (twice the
        # program: stochastic volatility's Hessian compiled in 6.1 s instead
        # of 3.9 s on the CPU)
        rows = -(-dim // batch) * batch
        basis = jnp.eye(rows, dim, dtype=points.dtype)
        hessian = jax.lax.map(column, basis, batch_size=batch)[:dim]
    return 0.5 * (hessian + hessian.T)


def _finite_mean_hessian(
    potential: Callable[[Array], Array], points: Array, column_batch: int | None
) -> tuple[Array, Array]:
    """``(H, finite)``: :func:`mean_hessian`, the identity where it is not
    finite (a decomposition of NaNs is not defined)."""
    hessian = mean_hessian(potential, points, column_batch)
    finite = jnp.all(jnp.isfinite(hessian))
    eye = jnp.eye(hessian.shape[-1], dtype=hessian.dtype)
    return jnp.where(finite, hessian, eye), finite


def mean_hessian_eigh(
    potential: Callable[[Array], Array],
    points: Array,
    column_batch: int | None = None,
) -> tuple[Array, Array, Array]:
    """Eigenvalues and eigenvectors of the mean Hessian, and whether it is finite.

    A Hessian that is not finite at some point is replaced by the identity
    before the decomposition (``eigh`` of NaNs is not defined); callers choose
    their fallback from the flag. ``column_batch``: :func:`mean_hessian`'s.
    """
    hessian, finite = _finite_mean_hessian(potential, points, column_batch)
    eigenvalues, vectors = jnp.linalg.eigh(hessian)
    return eigenvalues, vectors, finite


def curvature_basis(
    potential: Callable[[Array], Array],
    points: Array,
    column_batch: int | None = None,
) -> Array:
    r"""Orthogonal ``Q`` whose columns are the eigenvectors of the mean Hessian.

    ``H = mean_k \nabla^2 U(w_k)`` over ``points`` (shape ``(K, D)``). In
    ``u = Q^T w`` a step's Jacobian is diagonal wherever ``H(w)`` is close to
    the mean. A non-finite Hessian gives ``Q = I``. ``column_batch``:
    :func:`mean_hessian`'s.
    """
    _, basis, finite = mean_hessian_eigh(potential, points, column_batch)
    return jnp.where(finite, basis, jnp.eye(points.shape[-1], dtype=points.dtype))


def inverse_abs(hessian: Array) -> Array:
    """``|H|^{-1}`` of a symmetric ``H`` through ``H = V diag(lambda) V^T``:
    ``V diag(1/m) V^T`` with ``m = max(|lambda|, floor * max |lambda|)``
    (:data:`EIGENVALUE_FLOOR`), symmetrised."""
    eigenvalues, vectors = jnp.linalg.eigh(hessian)
    magnitude = jnp.abs(eigenvalues)
    magnitude = jnp.maximum(magnitude, EIGENVALUE_FLOOR * jnp.max(magnitude))
    inverse = (vectors / magnitude) @ vectors.T
    return 0.5 * (inverse + inverse.T)


def inverse_abs_mean_hessian(
    potential: Callable[[Array], Array],
    points: Array,
    column_batch: int | None = None,
) -> tuple[Array, Array]:
    """``(|H|^{-1}, finite)`` for the mean Hessian ``H`` at ``points``.

    The eigenvalues are taken in absolute value and floored at
    :data:`EIGENVALUE_FLOOR` times the largest (a metric must be positive
    definite, and a nearly flat direction must not get an unbounded step;
    :func:`inverse_abs`); the result is symmetrised. ``finite`` is false
    where the Hessian is not finite at some point (the matrix is then
    meaningless). ``column_batch``: :func:`mean_hessian`'s.
    """
    hessian, finite = _finite_mean_hessian(potential, points, column_batch)
    return inverse_abs(hessian), finite
