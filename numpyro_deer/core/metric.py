r"""Products with a mass matrix given by its square root, and whitening.

A preconditioned sampler works with an inverse mass matrix ``M = L L^T``,
given by ``L``: a vector ``(D,)`` for a diagonal ``M`` or an upper-triangular
``(D, D)`` matrix for a dense one (``None`` is the identity). The dense ``L``
is the factor NumPyro keeps with its metric (``HMCAdaptState``'s
``mass_matrix_sqrt_inv`` is ``L^T``), so a kernel can take it from the
adaptation state instead of factorising ``M`` at every step. In the whitened
coordinates ``w = L^{-1} x`` a preconditioned MALA or HMC chain is the same
chain with the identity (Roberts and Stramer, 2002), which is where the kernel
solves its blocks. These are the only products with ``L`` in the package.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array


def mass_matrix_sqrt(inverse_mass_matrix: Array) -> Array:
    """``L`` with ``L L^T`` the inverse mass matrix (diagonal or dense).

    Dense: the upper-triangular factor, the Cholesky factor of the matrix
    with its rows and columns reversed, reversed back (NumPyro's
    ``welford_covariance`` computes the same, ``cholesky_of_inverse``'s
    trick), so that it equals the transpose of NumPyro's
    ``mass_matrix_sqrt_inv`` bit for bit.
    """
    if inverse_mass_matrix.ndim == 1:
        return jnp.sqrt(inverse_mass_matrix)
    return jnp.linalg.cholesky(inverse_mass_matrix[..., ::-1, ::-1])[..., ::-1, ::-1]


def mul_sqrt(mass_sqrt: Array | None, v: Array) -> Array:
    """``L v``."""
    if mass_sqrt is None:
        return v
    return mass_sqrt * v if mass_sqrt.ndim == 1 else mass_sqrt @ v


def mul_sqrt_t(mass_sqrt: Array | None, v: Array) -> Array:
    """``L^T v``."""
    if mass_sqrt is None:
        return v
    return mass_sqrt * v if mass_sqrt.ndim == 1 else mass_sqrt.T @ v


def mul_mass(mass_sqrt: Array | None, v: Array) -> Array:
    """``M v = L L^T v``."""
    if mass_sqrt is None:
        return v
    if mass_sqrt.ndim == 1:
        return mass_sqrt**2 * v
    return mass_sqrt @ (mass_sqrt.T @ v)


def solve_sqrt(mass_sqrt: Array | None, v: Array) -> Array:
    """``L^{-1} v``: the whitened coordinates of ``v``."""
    if mass_sqrt is None:
        return v
    if mass_sqrt.ndim == 1:
        return v / mass_sqrt
    return jax.scipy.linalg.solve_triangular(mass_sqrt, v, lower=False)


def whiten(
    potential_fn: Callable[[Array], Array], mass_sqrt: Array | None
) -> Callable[[Array], Array]:
    """The potential of ``w = L^{-1} x``: ``w -> U(L w)``."""
    return lambda w: potential_fn(mul_sqrt(mass_sqrt, w))
