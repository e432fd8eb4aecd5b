"""The mass matrix from the mean Hessian (``adapt_mass_matrix="hessian"``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.hmc_util import build_adaptation_schedule, warmup_adapter

from benchmarks.models import (
    ill_conditioned_covariance,
    ill_conditioned_gaussian,
    make_ill_conditioned_gaussian_data,
)
from numpyro_deer import DEERMALA, MCMC, DEERSolver
from numpyro_deer.core.hessian import COLUMN_BATCH
from numpyro_deer.core.metric import mass_matrix_sqrt
from numpyro_deer.infer import hessian_mass as hessian_mass_module
from numpyro_deer.infer.hessian_mass import (
    EIGENVALUE_FLOOR,
    MAX_HESSIAN_CHAIN_WORK,
    MAX_HESSIAN_DIM,
    adapt_mass_sqrt,
    hessian_inverse_mass,
    hessian_mass,
    hessian_window_ends,
    is_hessian_window_end,
    resolve_mass_adaptation,
)
from numpyro_deer.infer.warmup import restart_step_size

from .helpers import primitive_names


def _precision(dim=4, seed=0):
    a = np.random.default_rng(seed).standard_normal((dim, dim))
    return jnp.asarray(a @ a.T + np.eye(dim))


def test_inverse_mass_of_a_gaussian_is_its_covariance():
    precision = _precision()
    points = jnp.asarray(np.random.default_rng(1).standard_normal((3, 4)))
    inverse, sqrt, sqrt_inv, finite = hessian_inverse_mass(
        lambda w: 0.5 * w @ precision @ w, points
    )
    assert bool(finite)
    np.testing.assert_allclose(inverse, np.linalg.inv(precision), atol=1e-10)
    # NumPyro's conventions: the lower Cholesky factor of the mass matrix
    # (the precision here) and its inverse
    np.testing.assert_allclose(sqrt @ sqrt.T, precision, atol=1e-10)
    np.testing.assert_allclose(np.triu(sqrt, 1), 0.0)
    np.testing.assert_allclose(sqrt @ sqrt_inv, np.eye(4), atol=1e-10)


def test_nonconvex_directions_take_the_absolute_curvature_and_a_floor():
    # Hessian diag(4, -2, 1e-9): |eigenvalues| floored at 1e-4 * 4
    hessian = jnp.asarray([4.0, -2.0, 1e-9])
    inverse, *_, finite = hessian_inverse_mass(
        lambda w: 0.5 * jnp.sum(hessian * w**2), jnp.zeros((2, 3))
    )
    assert bool(finite)
    expected = 1.0 / np.array([4.0, 2.0, EIGENVALUE_FLOOR * 4.0])
    np.testing.assert_allclose(np.diag(inverse), expected, rtol=1e-10)
    assert np.all(np.linalg.eigvalsh(inverse) > 0)


def _adapt_states(dim):
    init, _ = warmup_adapter(
        100,
        find_reasonable_step_size=lambda eps, *_: eps,
        dense_mass=True,
    )
    before = init((jnp.zeros(dim),), jax.random.PRNGKey(0), 0.1, mass_matrix_size=dim)
    before = before._replace(window_idx=jnp.asarray(1))
    return before, before._replace(window_idx=jnp.asarray(2))


def _window_end(before, after, potential, points, num_windows=4):
    """What a warmup step does to NumPyro's adapt state ``after`` its update
    (``BlockProgram.warmup``): at the end of a middle window, the Hessian
    mass (``window_end``) then, where finite, the step size search
    (``step_size``)."""
    if not is_hessian_window_end(before, after, num_windows):
        return after
    find = lambda eps, inverse, z_info, key: eps * 2.0  # noqa: E731
    adapt, finite = hessian_mass(after, potential, points)
    return restart_step_size(adapt, points[-1], find, finite)


def test_window_end_replaces_the_mass_and_restarts_the_step_size():
    precision = _precision(3)
    potential = lambda w: 0.5 * w @ precision @ w  # noqa: E731
    before, after = _adapt_states(3)
    new = _window_end(before, after, potential, jnp.ones((2, 3)))
    np.testing.assert_allclose(
        new.inverse_mass_matrix, np.linalg.inv(precision), atol=1e-10
    )
    np.testing.assert_allclose(new.step_size, 2.0 * after.step_size)
    # dual averaging restarted at log(10 eps), as NumPyro does
    np.testing.assert_allclose(new.ss_state[-1], np.log(10 * new.step_size))


def test_window_end_keeps_numpyros_estimate_elsewhere_or_if_not_finite():
    precision = _precision(3)
    gaussian = lambda w: 0.5 * w @ precision @ w  # noqa: E731
    before, after = _adapt_states(3)
    # not a window end (index unchanged), and the last (non-middle) window
    for b, a, windows in ((after, after, 4), (before, after, 2)):
        new = _window_end(b, a, gaussian, jnp.ones((2, 3)), windows)
        np.testing.assert_array_equal(new.inverse_mass_matrix, a.inverse_mass_matrix)
        np.testing.assert_array_equal(new.step_size, a.step_size)
    # a Hessian that is not finite at the points
    sqrt_potential = lambda w: -jnp.sum(jnp.sqrt(w))  # noqa: E731
    new = _window_end(before, after, sqrt_potential, -jnp.ones((2, 3)))
    np.testing.assert_array_equal(new.inverse_mass_matrix, after.inverse_mass_matrix)
    np.testing.assert_array_equal(new.step_size, after.step_size)


@pytest.mark.parametrize(
    ("vectorized", "cpu", "columns"),
    [(True, False, COLUMN_BATCH), (True, True, None), (False, False, None)],
)
def test_vectorized_window_ends_take_the_columns_in_batches(
    monkeypatch, vectorized, cpu, columns
):
    # chains side by side under vmap (not on a CPU, where map_chains runs one
    # after another) hold COLUMN_BATCH of the Hessian's columns at a time;
    # the window end is the same
    monkeypatch.setattr(hessian_mass_module, "on_cpu", lambda: cpu)
    assert hessian_mass_module.window_end_columns(vectorized) == columns
    dim = COLUMN_BATCH + 3
    precision = _precision(dim, seed=4)
    potential = lambda w: 0.5 * w @ precision @ w + 0.1 * jnp.sum(w**4)  # noqa: E731
    points = jnp.asarray(np.random.default_rng(5).standard_normal((4, dim)))
    before, after = _adapt_states(dim)
    new, finite = hessian_mass(after, potential, points, vectorized)
    reference, _ = hessian_mass(after, potential, points)
    assert bool(finite)
    np.testing.assert_allclose(
        new.inverse_mass_matrix, reference.inverse_mass_matrix, rtol=1e-9
    )


@pytest.fixture(scope="module")
def gaussian_runs():
    """DEER and sequential runs on a correlated Gaussian with the Hessian mass."""
    args, kwargs = make_ill_conditioned_gaussian_data(dim=5, condition_number=100.0)
    runs = {}
    for method in ("deer", "sequential"):
        kernel = DEERMALA(
            ill_conditioned_gaussian,
            block_size=256,
            method=method,
            adapt_mass_matrix="hessian",
            solver=DEERSolver(atol=1e-12, rtol=1e-10),
        )
        mcmc = MCMC(kernel, num_warmup=300, num_samples=1024, progress_bar=False)
        mcmc.run(
            jax.random.PRNGKey(3), *args, **kwargs, extra_fields=("deer_converged",)
        )
        runs[method] = mcmc
    return runs


def test_hessian_mass_of_a_gaussian_is_its_covariance_after_warmup(gaussian_runs):
    # the Hessian of a Gaussian is its precision everywhere: exact from the
    # first window on, where a sample covariance would still be noisy
    adapt = gaussian_runs["deer"].last_state.adapt_state
    cov = ill_conditioned_covariance(dim=5, condition_number=100.0)
    np.testing.assert_allclose(adapt.inverse_mass_matrix, cov, rtol=1e-8, atol=1e-10)
    # the step size was searched and adapted again in the new metric
    accept = np.asarray(gaussian_runs["deer"].last_state.mean_accept_prob)
    assert 0.8 < accept < 0.97, accept


def test_hessian_mass_deer_is_the_sequential_chain(gaussian_runs):
    deer, seq = gaussian_runs["deer"], gaussian_runs["sequential"]
    assert np.all(np.asarray(deer.get_extra_fields()["deer_converged"]))
    np.testing.assert_allclose(
        deer.get_samples()["x"], seq.get_samples()["x"], atol=1e-8
    )
    # and the draws are from the target (1,024 draws, a loose check)
    cov = ill_conditioned_covariance(dim=5, condition_number=100.0)
    x = np.asarray(deer.get_samples()["x"])
    np.testing.assert_allclose(x.var(0) / np.diag(cov), 1.0, atol=0.35)


@pytest.mark.parametrize(
    ("requested", "dense_mass", "dim", "expected"),
    [
        ("auto", False, 10, "hessian"),
        ("auto", False, MAX_HESSIAN_DIM, "hessian"),
        ("auto", False, MAX_HESSIAN_DIM + 1, True),
        ("auto", True, 10, True),
        ("hessian", False, MAX_HESSIAN_DIM + 1, "hessian"),
        (True, False, 10, True),
        (False, False, 10, False),
    ],
)
def test_auto_mass_is_the_hessian_up_to_the_dimension_bound(
    requested, dense_mass, dim, expected
):
    assert resolve_mass_adaptation(requested, dense_mass, dim) == expected


@pytest.mark.parametrize(
    ("requested", "dim", "num_chains", "expected"),
    [
        # num_chains * dim**3 against MAX_HESSIAN_CHAIN_WORK = 2**32
        ("auto", 100, 1024, "hessian"),  # 1.0e9
        ("auto", 100, 4295, True),  # 4.3e9
        ("auto", 501, 256, True),  # 3.2e10
        ("auto", 501, 33, "hessian"),  # 4.2e9
        ("auto", 501, 1, "hessian"),
        ("hessian", 501, 1024, "hessian"),  # asked for: kept
    ],
)
def test_auto_mass_with_many_chains_is_the_hessian_up_to_the_work_bound(
    requested, dim, num_chains, expected
):
    assert MAX_HESSIAN_CHAIN_WORK == 2**32
    assert resolve_mass_adaptation(requested, False, dim, num_chains) == expected


@pytest.mark.parametrize(
    ("options", "expected", "shape"),
    [
        ({}, "hessian", (5, 5)),
        ({"dense_mass": True}, True, (5, 5)),
        ({"adapt_mass_matrix": True}, True, (5,)),
    ],
)
def test_default_mass_adaptation_is_chosen_at_init(options, expected, shape):
    args, kwargs = make_ill_conditioned_gaussian_data(dim=5, condition_number=100.0)
    kernel = DEERMALA(ill_conditioned_gaussian, block_size=8, **options)
    assert kernel.mass_adaptation == options.get("adapt_mass_matrix", "auto")
    state = kernel.init(jax.random.PRNGKey(0), 10, None, args, kwargs)
    assert kernel.mass_adaptation == expected
    assert state.adapt_state.inverse_mass_matrix.shape == shape


@pytest.mark.parametrize(("num_chains", "expected"), [(3, "hessian"), (4, True)])
def test_auto_mass_counts_the_vectorized_chains_at_init(
    monkeypatch, num_chains, expected
):
    # 4 chains x 5**3 = 500 > 499 >= 3 x 5**3: the kernel passes the chain
    # count of its vectorized init to the rule
    monkeypatch.setattr(hessian_mass_module, "MAX_HESSIAN_CHAIN_WORK", 499)
    args, kwargs = make_ill_conditioned_gaussian_data(dim=5, condition_number=100.0)
    kernel = DEERMALA(ill_conditioned_gaussian, block_size=8)
    keys = jax.random.split(jax.random.PRNGKey(0), num_chains)
    state = kernel.init(keys, 10, None, args, kwargs)
    assert kernel.mass_adaptation == expected
    shape = (num_chains, 5, 5) if expected == "hessian" else (num_chains, 5)
    assert state.adapt_state.inverse_mass_matrix.shape == shape
    # the DEER blocks' solve_basis="auto" follows the same bound
    basis = "hessian" if expected == "hessian" else "whitened"
    assert kernel.solver.solve_basis == "auto"
    assert kernel.program.settings.solver.solve_basis == basis


@pytest.mark.parametrize("num_warmup", [10, 60, 150, 500])
def test_window_ends_are_where_numpyros_update_ends_a_middle_window(num_warmup):
    # numpyro_deer.MCMC stops its warmup loop at these iteration counts to
    # run the window end as a program of its own: they must be the steps
    # after which the in-step window end (is_hessian_window_end) fires
    init, update = warmup_adapter(
        num_warmup, find_reasonable_step_size=lambda eps, *_: eps, dense_mass=True
    )
    num_windows = len(build_adaptation_schedule(num_warmup))
    z = (jnp.zeros(2),)
    state = init(z, jax.random.PRNGKey(0), 0.1, mass_matrix_size=2)
    update = jax.jit(update)
    ends = []
    for t in range(num_warmup):
        new = update(t, 0.5, z, state)
        if is_hessian_window_end(state, new, num_windows):
            ends.append(t + 1)
        state = new
    assert tuple(ends) == hessian_window_ends(num_warmup)
    assert len(ends) == max(0, num_windows - 2)


def test_warmup_step_without_the_window_end_traces_no_hessian():
    # the warmup loop of numpyro_deer.MCMC leaves the Hessian (and its
    # eigendecomposition) to the window-end program: not traced in the step
    args, kwargs = make_ill_conditioned_gaussian_data(dim=3, condition_number=10.0)
    kernel = DEERMALA(ill_conditioned_gaussian, adapt_mass_matrix="hessian")
    state = kernel.init(jax.random.PRNGKey(0), 100, None, args, kwargs)

    def primitives(fn, *fn_args):
        return primitive_names(jax.make_jaxpr(fn)(*fn_args).jaxpr)

    def step(window_end):
        return lambda s: kernel.program.warmup(s, args, kwargs, False, window_end)

    assert "eigh" in primitives(step(True), state)
    assert "eigh" not in primitives(step(False), state)
    end = lambda s: kernel.program.window_end(s, args, kwargs)  # noqa: E731
    assert "eigh" in primitives(end, state)
    # nor is the dense metric factorised in a step: its factor is the state's
    assert "cholesky" not in primitives(step(False), state)
    assert "cholesky" in primitives(end, state)


@pytest.mark.parametrize("dense", [False, True])
def test_the_adapt_states_factor_is_the_metrics_square_root(dense):
    """``adapt_mass_sqrt`` reads the factor NumPyro's adapter keeps with its
    metric, and the window end's Hessian metric keeps it too: it is ``L``
    with ``L L^T`` the inverse mass matrix, bit for bit the package's own
    ``mass_matrix_sqrt`` (the blocks and the step size search factorise the
    metric themselves)."""
    dim = 4
    points = jax.random.normal(jax.random.PRNGKey(3), (60, dim)) * jnp.arange(1, 5)
    init, update = warmup_adapter(
        60, find_reasonable_step_size=lambda eps, *_: eps, dense_mass=dense
    )
    state = init((points[0],), jax.random.PRNGKey(0), 0.1, mass_matrix_size=dim)
    for t in range(55):  # through the middle window's end (step 54 of 60)
        state = update(t, 0.5, (points[t],), state)
    inverse = state.inverse_mass_matrix
    assert not np.allclose(inverse, np.eye(dim) if dense else np.ones(dim))
    states = [state]
    if dense:  # the Hessian metric is dense
        precision = _precision(dim)
        potential = lambda w: 0.5 * w @ precision @ w  # noqa: E731
        hessian_state, finite = hessian_mass(state, potential, points[:8])
        assert bool(finite)
        assert not np.allclose(hessian_state.inverse_mass_matrix, inverse)
        states.append(hessian_state)
    for adapt in states:
        sqrt = adapt_mass_sqrt(adapt)
        inverse = adapt.inverse_mass_matrix
        np.testing.assert_array_equal(sqrt, mass_matrix_sqrt(inverse))
        square = sqrt @ sqrt.T if dense else sqrt**2
        np.testing.assert_allclose(square, inverse, rtol=1e-10)
