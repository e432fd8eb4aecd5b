r"""Parallel solution of the affine recursion ``s_t = A_t s_{t-1} + b_t``.

The linear step of every DEER iteration is the affine recursion

.. math::

    s_t = A_t s_{t-1} + b_t, \qquad t = 1, \dots, T,

with the initial state folded into ``b_1`` (``A_1 = 0``). Affine maps compose
associatively: applying ``(A_1, b_1)`` then ``(A_2, b_2)`` is the map
``(A_2 A_1, A_2 b_1 + b_2)``. :func:`jax.lax.associative_scan` evaluates all
prefixes of this composition in ``O(log T)`` depth (Blelloch, 1990), which is
what makes the Newton step parallel over the time axis (Lim et al., 2024).

Two structures of ``A_t`` are supported (each Jacobian strategy of
:mod:`numpyro_deer.core.jacobian` names its own):

* diagonal, ``A`` of shape ``(T, D)``: the composition is elementwise, ``O(T D)``
  work and memory (quasi-DEER, Gonzalez et al., 2024);
* dense, ``A`` of shape ``(T, D, D)``: ``O(T D^3)`` work (full DEER).

Up to :data:`ELEMENTWISE_MAX_DIM` dimensions the dense products are written
as broadcast multiplications and sums (:func:`matmul`) rather than matrix
products: XLA fuses them with the rest of a scan level, and a GPU compiler
neither dispatches a batched GEMM of ``2 x 2`` matrices nor autotunes one per
level of the scan (each level has its own batch size), which made the first
compile of a long block take a minute.

The combine operator is written for one pair of elements and vectorised with
:func:`jax.vmap`, as in Dynamax's parallel filters.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array


class AffineElement(NamedTuple):
    """One element ``(A_t, b_t)`` of the affine recursion.

    Attributes:
        A: transition, ``(D,)`` for a diagonal or ``(D, D)`` for a dense
            element (a leading time axis when stacked).
        b: offset, ``(D,)`` (a leading time axis when stacked).
    """

    A: Array
    b: Array


def _combine_diagonal(first: AffineElement, second: AffineElement) -> AffineElement:
    """Compose two diagonal affine maps: ``first`` is applied, then ``second``."""
    return AffineElement(second.A * first.A, second.A * first.b + second.b)


ELEMENTWISE_MAX_DIM = 8
"""Largest ``D`` whose dense products :func:`matmul` writes elementwise."""


def matmul(a: Array, b: Array, precision: str | None = None) -> Array:
    """``a @ b`` for a ``(..., D, D)`` matrix ``a`` and a matrix or vector ``b``.

    Up to :data:`ELEMENTWISE_MAX_DIM` dimensions, ``sum_j a_ij b_j(k)`` as a
    broadcast product and a sum (exact float products, whatever
    ``precision``); above, :func:`jax.numpy.matmul` at ``precision``.
    """
    vector = b.ndim == a.ndim - 1  # a vector per matrix
    if a.shape[-1] > ELEMENTWISE_MAX_DIM:
        spec = "...ij,...j->...i" if vector else "...ij,...jk->...ik"
        return jnp.einsum(spec, a, b, precision=precision)
    if vector:
        return jnp.sum(a * b[..., None, :], axis=-1)
    return jnp.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


def _combine_dense(
    first: AffineElement, second: AffineElement, precision: str | None = None
) -> AffineElement:
    """Compose two dense affine maps: ``first`` is applied, then ``second``."""
    A = matmul(second.A, first.A, precision)
    b = matmul(second.A, first.b, precision) + second.b
    return AffineElement(A, b)


RADIX = 8
"""Consecutive elements per group of :func:`_scan`: the prefixes within a group
are ``RADIX - 1`` compositions in one fused pass, and the associative scan runs
over ``T / RADIX`` group totals (``log2 RADIX`` fewer of its levels). Measured
on an H100 against ``RADIX = 1`` (``benchmarks/dense_products.py --radix``):
the diagonal scan of ``T D = 1.6e6`` numbers 3.3 times (``D = 2``) and 5.8
times (``D = 8``) faster, the dense one 1.1-1.2 times, the banana's DEER block
of 100,000 HMC steps 0.041 s against 0.047 s (its compile 0.24 s longer);
``RADIX = 4`` and ``16`` were slower on some of these."""


def _apply_diagonal(element: AffineElement, state: Array) -> Array:
    return element.A * state + element.b


def _apply_dense(
    element: AffineElement, state: Array, precision: str | None = None
) -> Array:
    return matmul(element.A, state, precision) + element.b


def _scan(combine, apply, A: Array, b: Array) -> Array:
    """The states ``s_1 .. s_T`` by a scan of groups of :data:`RADIX` elements.

    With ``P_{g,j}`` the composition of the first ``j + 1`` maps of group
    ``g`` and ``S_g`` the state at the end of group ``g`` (an associative scan
    of the groups' total maps ``P_{g,RADIX-1}``), the state at position ``j``
    of group ``g`` is ``P_{g,j}`` applied to ``S_{g-1}``. A blocked scan in the
    manner of Blelloch (1990, section 1.4): the ``RADIX - 1`` compositions
    within the groups are one elementwise pass, so about
    ``2 log2(T / RADIX) + 2`` passes over the data (kernel launches on a GPU)
    instead of ``2 log2 T``, for ``2 log2 T + 2`` dependent compositions.
    The time axis is padded at its end (later elements never change earlier
    prefixes).
    """
    pair = jax.vmap(combine)
    elements = AffineElement(A, b)
    T = b.shape[0]
    groups = -(-T // RADIX)
    if RADIX < 2 or groups < 2:
        return jax.lax.associative_scan(pair, elements).b
    pad = groups * RADIX - T
    grouped = jax.tree.map(
        lambda x: jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(
            (groups, RADIX) + x.shape[1:]
        ),
        elements,
    )
    prefixes = [jax.tree.map(lambda x: x[:, 0], grouped)]
    for j in range(1, RADIX):
        prefixes.append(
            pair(prefixes[-1], jax.tree.map(lambda x, j=j: x[:, j], grouped))
        )
    ends = jax.lax.associative_scan(pair, prefixes[-1]).b  # S_g
    prefixes = jax.tree.map(lambda *xs: jnp.stack(xs, 1), *prefixes)
    later = jax.vmap(jax.vmap(apply, (0, None)))(
        jax.tree.map(lambda x: x[1:], prefixes), ends[:-1]
    )
    states = jnp.concatenate([prefixes.b[:1], later])
    return states.reshape((groups * RADIX,) + b.shape[1:])[:T]


def scan_diagonal(A: Array, b: Array) -> Array:
    """All states of ``s_t = A_t * s_{t-1} + b_t`` with ``s_0 = 0``.

    Args:
        A: diagonal transitions, shape ``(T, D)``.
        b: offsets, shape ``(T, D)``. Fold a nonzero ``s_0`` into ``b[0]``.

    Returns:
        The states ``s_1 .. s_T``, shape ``(T, D)``.
    """
    return _scan(_combine_diagonal, _apply_diagonal, A, b)


def scan_dense(A: Array, b: Array, precision: str | None = None) -> Array:
    """All states of ``s_t = A_t @ s_{t-1} + b_t`` with ``s_0 = 0``.

    Args:
        A: dense transitions, shape ``(T, D, D)``.
        b: offsets, shape ``(T, D)``. Fold a nonzero ``s_0`` into ``b[0]``.
        precision: precision of the products (:class:`jax.lax.Precision`
            names); ``None`` follows ``jax.default_matmul_precision``. On a
            GPU, ``"default"`` lets float32 products run in TF32 on the tensor
            cores.

    Returns:
        The states ``s_1 .. s_T``, shape ``(T, D)``.
    """
    return _scan(
        partial(_combine_dense, precision=precision),
        partial(_apply_dense, precision=precision),
        A,
        b,
    )


def scan_sequential(A: Array, b: Array) -> Array:
    """Reference: the same recursion with :func:`jax.lax.scan` (diagonal or dense).

    Used by the tests as an oracle; ``O(T)`` depth.
    """
    dense = A.ndim == b.ndim + 1

    def step(s, elem):
        A_t, b_t = elem
        s = (A_t @ s if dense else A_t * s) + b_t
        return s, s

    _, states = jax.lax.scan(step, jnp.zeros_like(b[0]), (A, b))
    return states
