"""The associative scans of the affine recursion ``s_t = A_t s_{t-1} + b_t``.

Every scan is checked against a plain Python for-loop in NumPy (the recursion
as written, ``s_0 = 0``), to ``1e-12`` in float64. The inputs are drawn with
fixed seeds; the transitions are kept in the unit ball so the recursion stays
well conditioned and the only differences are the rounding of a different
association order.
"""

import functools

import jax
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from numpyro_deer.core import scan as scan_module
from numpyro_deer.core import scan_dense, scan_diagonal, scan_sequential
from numpyro_deer.core.scan import ELEMENTWISE_MAX_DIM, matmul

TOL = dict(rtol=1e-12, atol=1e-12)

_scan_diagonal = jax.jit(scan_diagonal)
_scan_dense = jax.jit(scan_dense)
_scan_sequential = jax.jit(scan_sequential)


def loop_diagonal(A, b, s0=None):
    """The recursion with a Python for-loop, diagonal transitions."""
    A, b = np.asarray(A), np.asarray(b)
    s = np.zeros(b.shape[1]) if s0 is None else np.asarray(s0, dtype=float)
    out = np.empty_like(b)
    for t in range(b.shape[0]):
        s = A[t] * s + b[t]
        out[t] = s
    return out


def loop_dense(A, b, s0=None):
    """The recursion with a Python for-loop, dense transitions."""
    A, b = np.asarray(A), np.asarray(b)
    s = np.zeros(b.shape[1]) if s0 is None else np.asarray(s0, dtype=float)
    out = np.empty_like(b)
    for t in range(b.shape[0]):
        s = A[t] @ s + b[t]
        out[t] = s
    return out


def diagonal_inputs(seed, T, D, regime):
    rng = np.random.default_rng(seed)
    if regime == "contracting":
        A = rng.uniform(-1.0, 1.0, (T, D))
    elif regime == "persistent":  # long memory: products of A decay slowly
        A = rng.uniform(0.97, 1.0, (T, D))
    else:
        raise ValueError(regime)
    b = rng.standard_normal((T, D))
    return A, b


def dense_inputs(seed, T, D, radius=0.98):
    """Rotations scaled by ``radius``: long memory, no blow-up, non-commuting."""
    rng = np.random.default_rng(seed)
    Q, R = np.linalg.qr(rng.standard_normal((T, D, D)))
    Q = Q * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[:, None, :]
    A = radius * Q
    b = rng.standard_normal((T, D))
    return A, b


# ---------------------------------------------------------------------- diagonal
@pytest.mark.parametrize(
    "T, D, regime",
    [
        (1, 3, "contracting"),
        (7, 4, "persistent"),
        (37, 3, "persistent"),  # groups of RADIX with the last one padded
        (512, 4, "contracting"),
        (512, 4, "persistent"),
        (4096, 8, "contracting"),
        (4096, 8, "persistent"),
    ],
)
def test_scan_diagonal_matches_loop(T, D, regime):
    A, b = diagonal_inputs(T + D, T, D, regime)
    expected = loop_diagonal(A, b)
    got = np.asarray(_scan_diagonal(A, b))
    assert got.shape == (T, D)
    assert got.dtype == np.float64
    assert_allclose(got, expected, **TOL)
    assert_allclose(np.asarray(_scan_sequential(A, b)), expected, **TOL)


def test_scan_diagonal_persistent_long_chain_is_not_trivial():
    # Guard for the test above: with A close to 1 the last state depends on
    # thousands of offsets, so a wrong composition order could not hide.
    A, b = diagonal_inputs(4096 + 8, 4096, 8, "persistent")
    expected = loop_diagonal(A, b)
    assert np.max(np.abs(expected)) > 5.0
    with_last_offset_only = b[-1]
    assert np.max(np.abs(expected[-1] - with_last_offset_only)) > 1.0


def test_scan_diagonal_identity_is_cumsum():
    rng = np.random.default_rng(11)
    b = rng.standard_normal((4096, 8))
    A = np.ones_like(b)
    assert_allclose(np.asarray(_scan_diagonal(A, b)), np.cumsum(b, axis=0), **TOL)


@pytest.mark.parametrize("T, D", [(1, 3), (7, 4), (4096, 8)])
def test_scan_diagonal_zero_transition_returns_offsets_exactly(T, D):
    b = np.random.default_rng(T).standard_normal((T, D))
    A = np.zeros_like(b)
    assert_array_equal(np.asarray(_scan_diagonal(A, b)), b)
    assert_array_equal(np.asarray(_scan_sequential(A, b)), b)


def test_scan_diagonal_zero_transition_in_the_middle_cuts_the_memory():
    # A_t = 0 at one step: every later state forgets everything before it.
    A, b = diagonal_inputs(3, 512, 4, "persistent")
    A[20] = 0.0
    got = np.asarray(_scan_diagonal(A, b))
    assert_allclose(got, loop_diagonal(A, b), **TOL)
    assert_allclose(got[20:], loop_diagonal(A[20:], b[20:]), **TOL)


def test_scan_diagonal_single_step_ignores_transition():
    # s_0 = 0, so s_1 = b_1 whatever A_1 is.
    A = np.array([[3.0, -7.0, 1e6]])
    b = np.array([[0.5, -2.0, 4.0]])
    assert_array_equal(np.asarray(_scan_diagonal(A, b)), b)


def test_scan_diagonal_initial_state_folded_into_first_offset():
    A, b = diagonal_inputs(5, 512, 4, "persistent")
    s0 = np.array([1.5, -2.0, 0.25, 3.0])
    folded = b.copy()
    folded[0] = A[0] * s0 + b[0]
    assert_allclose(
        np.asarray(_scan_diagonal(A, folded)), loop_diagonal(A, b, s0), **TOL
    )


@pytest.mark.parametrize("radix", [1, 2, 5, 8, 16])
@pytest.mark.parametrize("T", [9, 37, 64])
def test_every_group_size_gives_the_recursion(monkeypatch, radix, T):
    # the blocked scan at any RADIX (one group, a padded last group, whole
    # groups), unjitted so that each RADIX is traced afresh
    monkeypatch.setattr(scan_module, "RADIX", radix)
    A, b = diagonal_inputs(T, T, 3, "persistent")
    assert_allclose(np.asarray(scan_diagonal(A, b)), loop_diagonal(A, b), **TOL)
    A, b = dense_inputs(T, T, 3)
    assert_allclose(np.asarray(scan_dense(A, b)), loop_dense(A, b), **TOL)


# ------------------------------------------------------------------------- dense
@pytest.mark.parametrize(
    "T, D",
    # D above ELEMENTWISE_MAX_DIM takes the matrix products
    [(1, 3), (7, 4), (37, 3), (512, 4), (64, ELEMENTWISE_MAX_DIM + 4)],
)
def test_scan_dense_matches_loop(T, D):
    A, b = dense_inputs(T * 10 + D, T, D)
    expected = loop_dense(A, b)
    got = np.asarray(_scan_dense(A, b))
    assert got.shape == (T, D)
    assert got.dtype == np.float64
    assert_allclose(got, expected, **TOL)
    assert_allclose(np.asarray(_scan_sequential(A, b)), expected, **TOL)


@pytest.mark.parametrize("D", [2, ELEMENTWISE_MAX_DIM, ELEMENTWISE_MAX_DIM + 1])
def test_matmul_is_the_matrix_product_batched_and_single(D):
    # elementwise up to ELEMENTWISE_MAX_DIM, matrix products above: both are
    # a @ b, for a batch of matrices times matrices or vectors and for one pair
    rng = np.random.default_rng(D)
    a, b = rng.standard_normal((2, 5, D, D))
    v = rng.standard_normal((5, D))
    assert_allclose(np.asarray(matmul(a, b)), a @ b, **TOL)
    assert_allclose(np.asarray(matmul(a, v)), np.einsum("tij,tj->ti", a, v), **TOL)
    assert_allclose(np.asarray(matmul(a[0], b[0])), a[0] @ b[0], **TOL)
    assert_allclose(np.asarray(matmul(a[0], v[0])), a[0] @ v[0], **TOL)


def test_scan_dense_inputs_do_not_commute():
    # Guard for the test above: the transitions do not commute, so composing
    # the affine maps in the wrong order could not go unnoticed.
    A, b = dense_inputs(1, 7, 4)
    assert np.max(np.abs(A[1] @ A[0] - A[0] @ A[1])) > 0.1
    swapped = loop_dense(np.swapaxes(A, -1, -2), b)
    assert np.max(np.abs(swapped - loop_dense(A, b))) > 0.1


@pytest.mark.parametrize("T, D", [(1, 3), (7, 4), (512, 4)])
def test_scan_dense_zero_transition_returns_offsets_exactly(T, D):
    b = np.random.default_rng(T).standard_normal((T, D))
    A = np.zeros((T, D, D))
    assert_array_equal(np.asarray(_scan_dense(A, b)), b)
    assert_array_equal(np.asarray(_scan_sequential(A, b)), b)


def test_scan_dense_diagonal_matrices_agree_with_scan_diagonal():
    A, b = diagonal_inputs(9, 512, 4, "persistent")
    A_dense = np.einsum("ti,ij->tij", A, np.eye(4))
    assert_allclose(
        np.asarray(_scan_dense(A_dense, b)), np.asarray(_scan_diagonal(A, b)), **TOL
    )


def test_scan_dense_initial_state_folded_into_first_offset():
    A, b = dense_inputs(6, 512, 4)
    s0 = np.array([2.0, -1.0, 0.5, -3.0])
    folded = b.copy()
    folded[0] = A[0] @ s0 + b[0]
    assert_allclose(np.asarray(_scan_dense(A, folded)), loop_dense(A, b, s0), **TOL)


@pytest.mark.parametrize("precision", ["highest", "default", None])
def test_scan_dense_precision_is_accepted_and_matches_sequential(precision):
    # On the CPU a float64 product is exact whatever the precision, so this
    # checks that the argument reaches the products (a static argument under
    # jit) without changing the states.
    A, b = dense_inputs(33, 33, 4, radius=0.9)
    scan = jax.jit(functools.partial(scan_dense, precision=precision))
    got = np.asarray(scan(A, b))
    assert got.shape == (33, 4)
    assert got.dtype == np.float64
    expected = np.asarray(_scan_sequential(A, b))
    assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
