"""Tests of the shared models in ``benchmarks.models``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import initialize_model

from benchmarks import models
from benchmarks.models import BENCHMARK_MODELS

BENCHMARK_NAMES = sorted(BENCHMARK_MODELS)


@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_registry_entry_is_consistent(name: str) -> None:
    bench = BENCHMARK_MODELS[name]
    assert bench.name == name
    assert bench.description
    assert bench.latent_dim > 0


@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_benchmark_model_initializes(name: str) -> None:
    """``initialize_model`` works (traced, as the kernels run it), the latent
    dimension is the registered one and the potential is finite at the
    initial point."""
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()

    # one compiled program (as the kernels run it): run eagerly, every
    # operation of the model and of NumPyro's search compiles a program
    @jax.jit
    def initialize(key):
        info = initialize_model(key, bench.model, model_args=args, model_kwargs=kwargs)
        return info.param_info, info.potential_fn(info.param_info.z)

    param_info, energy_again = initialize(jax.random.PRNGKey(0))
    flat, _ = ravel_pytree(param_info.z)
    assert flat.shape == (bench.latent_dim,)
    assert flat.dtype == jnp.float64  # x64 is on for the test session
    energy = param_info.potential_energy
    assert jnp.isfinite(energy)
    assert jnp.isfinite(energy_again)
    assert jnp.all(jnp.isfinite(ravel_pytree(param_info.z_grad)[0]))


@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_benchmark_model_traces_with_traced_data(name: str) -> None:
    """Plate sizes come from shapes, so the potential traces with the data as
    tracers, as under ``MCMC(..., jit_model_args=True)`` (nothing compiled)."""
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()

    def energy(args, kwargs):
        # the set-up traced too (eagerly, each of its operations would compile)
        info = initialize_model(
            jax.random.PRNGKey(0),
            bench.model,
            model_args=args,
            model_kwargs=kwargs,
            dynamic_args=True,
        )
        return info.potential_fn(*args, **kwargs)(info.param_info.z)

    out = jax.eval_shape(energy, args, kwargs)
    assert out.shape == ()


@pytest.mark.parametrize("name", BENCHMARK_NAMES)
def test_make_data_is_reproducible(name: str) -> None:
    make_data = BENCHMARK_MODELS[name].make_data
    first, second = make_data(seed=3), make_data(seed=3)
    for a, b in zip(
        jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_sizes_follow_the_generators() -> None:
    (X,), kwargs = models.make_logistic_regression_data(num_obs=30, num_features=4)
    assert X.shape == (30, 4) and kwargs["y"].shape == (30,)
    (X, group, covariate), _ = models.make_hierarchical_logistic_data(
        num_obs=40, num_groups=7, num_features=2
    )
    assert X.shape == (40, 2) and covariate.shape == (7,)
    assert set(np.asarray(group).tolist()) == set(range(7))
    (returns,), _ = models.make_stochastic_volatility_data(num_steps=25)
    assert returns.shape == (25,)
    with pytest.raises(ValueError, match="num_obs"):
        models.make_hierarchical_logistic_data(num_obs=5, num_groups=7)


def test_stationary_ar1_is_the_recursion() -> None:
    rng = np.random.default_rng(0)
    eps = rng.standard_normal(37)
    phi = 0.9
    expected = np.empty(37)
    expected[0] = eps[0] / np.sqrt(1.0 - phi**2)
    for t in range(1, 37):
        expected[t] = phi * expected[t - 1] + eps[t]
    path = models._stationary_ar1(jnp.asarray(phi), 1.0 - phi**2, jnp.asarray(eps))
    np.testing.assert_allclose(path, expected, rtol=1e-12)


def test_ill_conditioned_covariance() -> None:
    cov = models.ill_conditioned_covariance(dim=50, condition_number=1_000.0)
    np.testing.assert_allclose(cov, cov.T)
    eigenvalues = np.linalg.eigvalsh(cov)
    np.testing.assert_allclose(eigenvalues, np.logspace(0.0, 3.0, 50), rtol=1e-8)
    (scale_tril,), _ = models.make_ill_conditioned_gaussian_data()
    np.testing.assert_allclose(scale_tril @ scale_tril.T, cov, rtol=1e-10, atol=1e-8)
    moments = models.ill_conditioned_gaussian_posterior(scale_tril)["x"]
    np.testing.assert_allclose(moments.std, np.sqrt(np.diag(cov)))
    np.testing.assert_array_equal(moments.mean, np.zeros(50))


def test_closed_form_gaussian_mean() -> None:
    # One observation equal to the prior mean: the posterior mean stays there
    # and the precisions add.
    moments = models.gaussian_mean_posterior(
        np.array([3.0]), sigma=1.0, prior_loc=3.0, prior_scale=1.0
    )["mu"]
    np.testing.assert_allclose(moments.mean, 3.0)
    np.testing.assert_allclose(moments.std, np.sqrt(0.5))


def test_closed_form_beta_bernoulli() -> None:
    y = np.array([[1, 0], [1, 0], [0, 0]])
    moments = models.beta_bernoulli_posterior(y)["p"]
    # Beta(3, 2) and Beta(1, 4).
    np.testing.assert_allclose(moments.mean, [3 / 5, 1 / 5])
    np.testing.assert_allclose(moments.std, np.sqrt([6 / 150, 4 / 150]))


def test_closed_form_dirichlet_categorical() -> None:
    moments = models.dirichlet_categorical_posterior(np.array([0, 2, 2]), np.ones(3))[
        "p"
    ]
    # Dirichlet(2, 1, 3): marginals Beta(2, 4), Beta(1, 5), Beta(3, 3).
    np.testing.assert_allclose(moments.mean, [2 / 6, 1 / 6, 3 / 6])
    np.testing.assert_allclose(moments.std, np.sqrt([8 / 252, 5 / 252, 9 / 252]))


CLOSED_FORM_MODELS = [
    (
        models.gaussian_mean_model,
        models.make_gaussian_mean_data,
        models.gaussian_mean_posterior,
    ),
    (
        models.beta_bernoulli,
        models.make_beta_bernoulli_data,
        models.beta_bernoulli_posterior,
    ),
    (
        models.dirichlet_categorical,
        models.make_dirichlet_categorical_data,
        models.dirichlet_categorical_posterior,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "make_data", "posterior"),
    CLOSED_FORM_MODELS,
    ids=[entry[0].__name__ for entry in CLOSED_FORM_MODELS],
)
def test_closed_form_matches_nuts(model, make_data, posterior) -> None:
    """The closed forms agree with NUTS on the model as written (slow: about
    5 s of compilation per model).

    Means are compared in units of their Monte Carlo standard error
    (sd / sqrt(ESS)); 4.5 standard errors is a loose bound that a correct pair
    passes with a fixed key, and a wrong formula fails by far.
    """
    args, kwargs = make_data()
    mcmc = MCMC(NUTS(model), num_warmup=300, num_samples=2_000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
    samples = mcmc.get_samples(group_by_chain=True)
    for site, exact in posterior(*args, **kwargs).items():
        draws = np.asarray(samples[site])
        ess = effective_sample_size(draws)
        mcse = exact.std / np.sqrt(ess)
        z = np.abs(draws.mean(axis=(0, 1)) - exact.mean) / mcse
        assert np.all(z < 4.5), (site, z)
        np.testing.assert_allclose(draws.std(axis=(0, 1)), exact.std, rtol=0.15)
