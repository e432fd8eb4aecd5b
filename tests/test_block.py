"""The block's solve basis: the curvature points and the Hessian eigenbasis."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_deer import DEERMALA, MCMC, DEERSolver
from numpyro_deer.core import MALA, curvature_basis, make_tape, sequential_chain
from numpyro_deer.core.hessian import ALL_COLUMNS_DIM, COLUMN_BATCH, mean_hessian
from numpyro_deer.infer.block import block_points, record_warmup_draw
from numpyro_deer.infer.hessian_mass import auto_solve_basis

from .helpers import primitive_names


def _gaussian_potential(precision):
    return lambda w: 0.5 * w @ precision @ w


def test_curvature_basis_diagonalises_the_mean_hessian():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 5))
    precision = jnp.asarray(a @ a.T + np.eye(5))
    # a potential whose Hessian varies: the basis diagonalises its mean
    potential = lambda w: 0.5 * w @ precision @ w + 0.25 * jnp.sum(w**4)  # noqa: E731
    points = jnp.asarray(rng.standard_normal((4, 5)))
    basis = curvature_basis(potential, points)
    np.testing.assert_allclose(basis.T @ basis, np.eye(5), atol=1e-12)
    mean_hessian = precision + 3.0 * jnp.diag(jnp.mean(points**2, axis=0))
    rotated = basis.T @ mean_hessian @ basis
    np.testing.assert_allclose(rotated - jnp.diag(jnp.diag(rotated)), 0.0, atol=1e-10)


def test_mean_hessian_in_batches_of_columns_traces_the_potential_once():
    # above ALL_COLUMNS_DIM the columns go COLUMN_BATCH at a time; a dimension
    # that is not a whole number of batches must not trace the potential (and
    # compile its second derivative) a second time for the remainder
    dim = ALL_COLUMNS_DIM + COLUMN_BATCH // 2 + 1
    rng = np.random.default_rng(1)
    a = rng.standard_normal((dim, dim)) / np.sqrt(dim)
    precision = jnp.asarray(a @ a.T + np.eye(dim))
    traces = []

    def potential(w):
        traces.append(1)
        return 0.5 * w @ precision @ w + 0.25 * jnp.sum(w**4)

    points = jnp.asarray(rng.standard_normal((3, dim)))
    hessian = jax.jit(mean_hessian, static_argnums=0)(potential, points)
    assert len(traces) == 1
    expected = precision + 3.0 * jnp.diag(jnp.mean(points**2, axis=0))
    np.testing.assert_allclose(hessian, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("column_batch", [1, 3, None])
def test_mean_hessian_by_any_number_of_columns_is_the_same(column_batch):
    # column_batch=3 at D = 7: two whole batches and a padded one
    dim = 7
    rng = np.random.default_rng(2)
    a = rng.standard_normal((dim, dim)) / np.sqrt(dim)
    precision = jnp.asarray(a @ a.T + np.eye(dim))

    def potential(w):
        return 0.5 * w @ precision @ w + 0.25 * jnp.sum(w**4)

    points = jnp.asarray(rng.standard_normal((3, dim)))
    hessian = mean_hessian(potential, points, column_batch)
    expected = precision + 3.0 * jnp.diag(jnp.mean(points**2, axis=0))
    np.testing.assert_allclose(hessian, expected, rtol=1e-10, atol=1e-10)
    looped = "scan" in primitive_names(
        jax.make_jaxpr(lambda p: mean_hessian(potential, p, column_batch))(points)
    )
    assert looped == (column_batch is not None)


def test_curvature_basis_of_a_nonfinite_hessian_is_the_identity():
    # sqrt's second derivative at -1 is NaN (log's would be finite, -1)
    potential = lambda w: -jnp.sum(jnp.sqrt(w))  # noqa: E731
    assert not np.all(np.isfinite(jax.hessian(potential)(-jnp.ones(3))))
    basis = curvature_basis(potential, -jnp.ones((2, 3)))
    np.testing.assert_array_equal(basis, np.eye(3))


def test_rotated_chain_is_the_whitened_chain_rotated():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4))
    potential = _gaussian_potential(jnp.asarray(a @ a.T + np.eye(4)))
    w0 = jnp.asarray(rng.standard_normal(4))
    tape = make_tape(jax.random.PRNGKey(0), 50, 4, w0.dtype)
    basis = curvature_basis(potential, w0[None])
    potential_u = lambda u: potential(basis @ u)  # noqa: E731
    tape_u = MALA().rotate_tape(tape, basis)
    w, info_w = sequential_chain(MALA(), potential, w0, tape, 0.1)
    u, info_u = sequential_chain(MALA(), potential_u, basis.T @ w0, tape_u, 0.1)
    np.testing.assert_allclose(u @ basis.T, w, atol=1e-12)
    np.testing.assert_array_equal(info_u.accepted, info_w.accepted)


@pytest.mark.parametrize("num_warmup, expected", [(100, [100, 97, 94, 91]), (3, None)])
def test_warmup_keeps_every_stride_th_of_its_last_draws(num_warmup, expected):
    # K = 16 points: stride max(1, 100 // 32) = 3, the last warmup draw first
    points = jnp.full((16, 1), -1.0)
    for i in range(1, num_warmup + 1):
        points = record_warmup_draw(points, jnp.asarray(i), num_warmup, jnp.full(1, i))
    kept = np.asarray(points[:, 0])
    if expected is None:  # fewer warmup draws than points: the rest stay
        np.testing.assert_array_equal(kept[:3], [3, 2, 1])
        np.testing.assert_array_equal(kept[3:], -1.0)
    else:
        np.testing.assert_array_equal(kept[:4], expected)
        np.testing.assert_array_equal(kept, 100 - 3 * np.arange(16))


@pytest.mark.parametrize("block_size", [64, 5])
def test_block_points_are_evenly_spaced_and_end_at_the_last(block_size):
    z = jnp.arange(block_size, dtype=float)[:, None]
    points = np.asarray(block_points(z, 16)[:, 0])
    assert points[-1] == block_size - 1
    assert np.all(np.diff(points) >= 0)
    if block_size >= 16:
        np.testing.assert_array_equal(np.diff(points), block_size // 16)


@pytest.mark.parametrize(
    "jacobian, dim, basis",
    [
        ("auto", 2, "whitened"),  # the full Jacobian at D <= 2
        ("full", 25, "whitened"),
        ("auto", 3, "hessian"),
        ("stochastic", 2, "hessian"),
        ("diag", 512, "hessian"),
        ("stochastic", 513, "whitened"),
    ],
)
def test_auto_solve_basis_is_whitened_for_a_dense_jacobian(jacobian, dim, basis):
    # Newton's iterates with the dense Jacobian do not depend on the basis:
    # no Hessian (nor pilot) is computed for them
    assert auto_solve_basis(DEERSolver(jacobian=jacobian), dim) == basis


@pytest.mark.parametrize(
    "dim, num_chains, basis",
    [(100, 1024, "hessian"), (100, 4295, "whitened"), (501, 33, "hessian"),
     (501, 256, "whitened")],
)  # fmt: skip
def test_auto_solve_basis_with_many_chains_follows_the_metrics_bound(
    dim, num_chains, basis
):
    # num_chains * dim**3 against MAX_HESSIAN_CHAIN_WORK = 2**32, as
    # adapt_mass_matrix="auto": a Hessian and eigendecomposition per chain
    assert auto_solve_basis(DEERSolver(), dim, num_chains) == basis


def test_first_block_without_warmup_takes_its_basis_from_a_pilot():
    # A logistic regression (D = 8) started 3 prior scales out, no warmup: the
    # curvature points are all the initial point, whose Hessian (saturated
    # logits) misleads the basis. The first block's basis now comes from a
    # pilot iterate: 17 Newton iterations where the initial point's Hessian
    # took 36. The draws are the sequential chain's either way; the second
    # block's points are the first block's draws (13 iterations, no pilot).
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((300, 8)))
    w = rng.standard_normal(8)
    y = jnp.asarray(rng.uniform(size=300) < 1 / (1 + np.exp(-np.asarray(X) @ w)))

    def potential(w):
        logits = X @ w
        return 0.5 * w @ w - jnp.sum(y * logits - jax.nn.softplus(logits))

    x0 = 3.0 * jnp.asarray(rng.standard_normal(8))
    runs = {}
    for method in ("sequential", "deer"):
        kernel = DEERMALA(
            potential_fn=potential,
            step_size=0.003,
            adapt_step_size=False,
            adapt_mass_matrix=False,
            block_size=256,
            method=method,
            solver=DEERSolver(atol=1e-12, rtol=1e-10),
        )
        mcmc = MCMC(kernel, num_warmup=0, num_samples=512, progress_bar=False)
        mcmc.run(
            jax.random.PRNGKey(0),
            init_params=x0,
            extra_fields=("newton_iterations", "deer_converged"),
        )
        extra = mcmc.get_extra_fields()
        runs[method] = (
            np.asarray(mcmc.get_samples()),
            np.asarray(extra["newton_iterations"])[::256],
            np.asarray(extra["deer_converged"]),
        )
    draws, iterations, converged = runs["deer"]
    np.testing.assert_allclose(draws, runs["sequential"][0], atol=1e-8)
    assert np.all(converged)
    assert iterations[0] <= 24, iterations
    assert iterations[1] <= 16, iterations
