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


def mean_hessian(potential: Callable[[Array], Array], points: Array) -> Array:
    """The symmetrised Hessian of ``potential`` averaged over ``points`` (K, D)."""
    hessian = jnp.mean(jax.vmap(jax.hessian(potential))(points), axis=0)
    return 0.5 * (hessian + hessian.T)


def mean_hessian_eigh(
    potential: Callable[[Array], Array], points: Array
) -> tuple[Array, Array, Array]:
    """Eigenvalues and eigenvectors of the mean Hessian, and whether it is finite.

    A Hessian that is not finite at some point is replaced by the identity
    before the decomposition (``eigh`` of NaNs is not defined); callers choose
    their fallback from the flag.
    """
    hessian = mean_hessian(potential, points)
    finite = jnp.all(jnp.isfinite(hessian))
    eye = jnp.eye(hessian.shape[-1], dtype=hessian.dtype)
    eigenvalues, vectors = jnp.linalg.eigh(jnp.where(finite, hessian, eye))
    return eigenvalues, vectors, finite


def curvature_basis(potential: Callable[[Array], Array], points: Array) -> Array:
    r"""Orthogonal ``Q`` whose columns are the eigenvectors of the mean Hessian.

    ``H = mean_k \nabla^2 U(w_k)`` over ``points`` (shape ``(K, D)``). In
    ``u = Q^T w`` a step's Jacobian is diagonal wherever ``H(w)`` is close to
    the mean. A non-finite Hessian gives ``Q = I``.
    """
    _, basis, finite = mean_hessian_eigh(potential, points)
    return jnp.where(finite, basis, jnp.eye(points.shape[-1], dtype=points.dtype))
