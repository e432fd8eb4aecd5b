"""NumPyro models shared by the benchmarks and the tests (not part of the wheel).

Every model here is a plain NumPyro model function, written the way a user
would write it, paired with a data generator that has a fixed seed and returns
``(args, kwargs)`` ready for ``mcmc.run(rng_key, *args, **kwargs)``:

```python
from benchmarks.models import BENCHMARK_MODELS

bench = BENCHMARK_MODELS["eight_schools"]
args, kwargs = bench.make_data()
mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
```

Conventions:

* Plate sizes are read from array shapes, never from Python integers passed as
  arguments, so every model also works with ``MCMC(..., jit_model_args=True)``.
* Data generators draw with NumPy's ``default_rng(seed)`` and return JAX arrays
  in JAX's default dtypes (float32, or float64 under ``jax_enable_x64``).
* ``BenchmarkModel.latent_dim`` is the size of the flattened *unconstrained*
  latent vector at the generator's default size, i.e. the dimension the MALA
  chain lives in.

The targets whose posterior is known exactly (small conjugate models and the
ill-conditioned Gaussian), used to test samplers, come first: each with a data
generator and a function that returns the exact posterior mean and standard
deviation of every latent site as `PosteriorMoments`.
"""

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import Array
from jax.typing import ArrayLike

from numpyro_deer.core import scan_diagonal

__all__ = [
    "BENCHMARK_MODELS",
    "EIGHT_SCHOOLS_SIGMA",
    "EIGHT_SCHOOLS_Y",
    "BenchmarkModel",
    "ModelData",
    "PosteriorMoments",
    "beta_bernoulli",
    "beta_bernoulli_posterior",
    "dirichlet_categorical",
    "dirichlet_categorical_posterior",
    "eight_schools",
    "gaussian_mean_model",
    "gaussian_mean_posterior",
    "hierarchical_logistic_regression",
    "ill_conditioned_covariance",
    "ill_conditioned_gaussian",
    "ill_conditioned_gaussian_posterior",
    "logistic_regression",
    "make_beta_bernoulli_data",
    "make_dirichlet_categorical_data",
    "make_eight_schools_data",
    "make_gaussian_mean_data",
    "make_hierarchical_logistic_data",
    "make_ill_conditioned_gaussian_data",
    "make_logistic_regression_data",
    "make_stochastic_volatility_data",
    "stochastic_volatility",
]


ModelData = tuple[tuple[Any, ...], dict[str, Any]]
"""Positional and keyword arguments for ``mcmc.run(rng_key, *args, **kwargs)``."""


class PosteriorMoments(NamedTuple):
    """Exact posterior mean and standard deviation of one latent site.

    Attributes:
        mean: Posterior mean, with the shape of the site (float64 NumPy).
        std: Posterior standard deviation, with the shape of the site.
    """

    mean: np.ndarray
    std: np.ndarray


# --------------------------------------------------------------------------
# Normal mean with known noise scale
# --------------------------------------------------------------------------


def gaussian_mean_model(
    y: ArrayLike, sigma: float, prior_loc: float = 0.0, prior_scale: float = 10.0
) -> None:
    """Unknown mean of normal data with a known noise scale.

    ``mu ~ N(prior_loc, prior_scale)`` and ``y[n] ~ N(mu, sigma)``. The
    posterior of ``mu`` is normal with precision
    ``1 / prior_scale**2 + N / sigma**2`` and mean
    ``(prior_loc / prior_scale**2 + sum(y) / sigma**2) / precision``; see
    `gaussian_mean_posterior`.

    Args:
        y: Observations, shape ``(num_obs,)``.
        sigma: Known standard deviation of the observation noise.
        prior_loc: Prior mean of ``mu``.
        prior_scale: Prior standard deviation of ``mu``.
    """
    mu = numpyro.sample("mu", dist.Normal(prior_loc, prior_scale))
    with numpyro.plate("data", jnp.shape(y)[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def make_gaussian_mean_data(
    seed: int = 0, num_obs: int = 20, true_mean: float = 1.5, sigma: float = 2.0
) -> ModelData:
    """Synthetic data for `gaussian_mean_model`.

    Returns:
        ``((y, sigma), {})``.
    """
    rng = np.random.default_rng(seed)
    y = true_mean + sigma * rng.standard_normal(num_obs)
    return (jnp.asarray(y), sigma), {}


def gaussian_mean_posterior(
    y: ArrayLike, sigma: float, prior_loc: float = 0.0, prior_scale: float = 10.0
) -> dict[str, PosteriorMoments]:
    """Closed-form posterior of `gaussian_mean_model`.

    Returns:
        ``{"mu": PosteriorMoments(mean, std)}`` with scalar arrays.
    """
    y = np.asarray(y, dtype=np.float64)
    precision = 1.0 / prior_scale**2 + y.size / sigma**2
    mean = (prior_loc / prior_scale**2 + y.sum() / sigma**2) / precision
    return {"mu": PosteriorMoments(np.asarray(mean), np.asarray(precision**-0.5))}


# --------------------------------------------------------------------------
# Beta-Bernoulli
# --------------------------------------------------------------------------


def beta_bernoulli(y: ArrayLike, alpha: float = 1.0, beta: float = 1.0) -> None:
    """Independent Bernoulli probabilities with Beta priors.

    ``p[k] ~ Beta(alpha, beta)`` for each column ``k`` of ``y`` and
    ``y[n, k] ~ Bernoulli(p[k])``. The posterior of ``p[k]`` is
    ``Beta(alpha + s_k, beta + N - s_k)`` with ``s_k = sum_n y[n, k]``; see
    `beta_bernoulli_posterior`. The unconstrained latent dimension is the
    number of columns.

    Args:
        y: Binary observations, shape ``(num_obs, num_probs)``.
        alpha: First Beta prior parameter.
        beta: Second Beta prior parameter.
    """
    num_obs, num_probs = jnp.shape(y)
    with numpyro.plate("probs", num_probs, dim=-1):
        p = numpyro.sample("p", dist.Beta(alpha, beta))
        with numpyro.plate("data", num_obs, dim=-2):
            numpyro.sample("y", dist.Bernoulli(probs=p), obs=y)


def make_beta_bernoulli_data(
    seed: int = 0, num_obs: int = 100, true_probs: tuple[float, ...] = (0.2, 0.7)
) -> ModelData:
    """Synthetic data for `beta_bernoulli`.

    Returns:
        ``((y,), {})`` with ``y`` of shape ``(num_obs, len(true_probs))``.
    """
    rng = np.random.default_rng(seed)
    y = rng.random((num_obs, len(true_probs))) < np.asarray(true_probs)
    return (jnp.asarray(y.astype(np.int32)),), {}


def _beta_moments(a: np.ndarray, b: np.ndarray) -> PosteriorMoments:
    """Mean and standard deviation of ``Beta(a, b)``."""
    total = a + b
    return PosteriorMoments(a / total, np.sqrt(a * b / (total**2 * (total + 1.0))))


def beta_bernoulli_posterior(
    y: ArrayLike, alpha: float = 1.0, beta: float = 1.0
) -> dict[str, PosteriorMoments]:
    """Closed-form posterior of `beta_bernoulli`.

    Returns:
        ``{"p": PosteriorMoments(mean, std)}`` with arrays of shape
        ``(num_probs,)``.
    """
    y = np.asarray(y, dtype=np.float64)
    successes = y.sum(axis=0)
    return {"p": _beta_moments(alpha + successes, beta + y.shape[0] - successes)}


# --------------------------------------------------------------------------
# Dirichlet-categorical
# --------------------------------------------------------------------------


def dirichlet_categorical(y: ArrayLike, concentration: ArrayLike) -> None:
    """Category probabilities with a Dirichlet prior.

    ``p ~ Dirichlet(concentration)`` and ``y[n] ~ Categorical(p)``. The
    posterior of ``p`` is ``Dirichlet(concentration + counts)`` with ``counts``
    the number of observations in each category; see
    `dirichlet_categorical_posterior`. The unconstrained latent dimension is
    the number of categories - 1 (stick-breaking).

    Args:
        y: Observed categories in ``[0, num_categories)``, shape ``(num_obs,)``.
        concentration: Prior concentration, shape ``(num_categories,)``.
    """
    p = numpyro.sample("p", dist.Dirichlet(jnp.asarray(concentration)))
    with numpyro.plate("data", jnp.shape(y)[0]):
        numpyro.sample("y", dist.Categorical(probs=p), obs=y)


def make_dirichlet_categorical_data(
    seed: int = 0,
    num_obs: int = 100,
    true_probs: tuple[float, ...] = (0.2, 0.3, 0.5),
) -> ModelData:
    """Synthetic data for `dirichlet_categorical`, with a flat prior.

    Returns:
        ``((y, concentration), {})`` with ``concentration`` all ones.
    """
    rng = np.random.default_rng(seed)
    y = rng.choice(len(true_probs), size=num_obs, p=np.asarray(true_probs))
    concentration = np.ones(len(true_probs))
    return (jnp.asarray(y.astype(np.int32)), jnp.asarray(concentration)), {}


def dirichlet_categorical_posterior(
    y: ArrayLike, concentration: ArrayLike
) -> dict[str, PosteriorMoments]:
    """Closed-form posterior of `dirichlet_categorical`.

    The marginals of ``Dirichlet(a)`` are ``Beta(a_k, sum(a) - a_k)``.

    Returns:
        ``{"p": PosteriorMoments(mean, std)}`` with arrays of shape
        ``(num_categories,)``.
    """
    concentration = np.asarray(concentration, dtype=np.float64)
    counts = np.bincount(np.asarray(y), minlength=concentration.size)
    a = concentration + counts
    return {"p": _beta_moments(a, a.sum() - a)}


# --------------------------------------------------------------------------
# Ill-conditioned Gaussian (the target itself; no data)
# --------------------------------------------------------------------------


def ill_conditioned_covariance(
    dim: int = 50, condition_number: float = 1_000.0, seed: int = 0
) -> np.ndarray:
    """Covariance ``Q diag(v) Q^T`` of the `ill_conditioned_gaussian` target.

    ``Q`` is a Haar-random rotation drawn with ``seed`` and the variances ``v``
    are log-spaced from 1 to ``condition_number``.

    Args:
        dim: Dimension.
        condition_number: Ratio of the largest to the smallest variance.
        seed: Seed of NumPy's generator for the rotation.

    Returns:
        A symmetric positive-definite float64 NumPy array of shape
        ``(dim, dim)``.
    """
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.sign(np.diag(r))  # makes the rotation Haar-distributed
    variances = np.logspace(0.0, np.log10(condition_number), dim)
    cov = (q * variances) @ q.T
    return (cov + cov.T) / 2.0


def ill_conditioned_gaussian(scale_tril: ArrayLike) -> None:
    """A zero-mean Gaussian ``x ~ MultivariateNormal(0, L L^T)``.

    The model takes the Cholesky factor ``L`` rather than the covariance so the
    potential does not factorise the covariance at every evaluation.

    Args:
        scale_tril: Lower Cholesky factor of the covariance, shape
            ``(dim, dim)``; see `ill_conditioned_covariance`.
    """
    dim = jnp.shape(scale_tril)[-1]
    numpyro.sample(
        "x", dist.MultivariateNormal(jnp.zeros(dim), scale_tril=jnp.asarray(scale_tril))
    )


def make_ill_conditioned_gaussian_data(
    seed: int = 0, dim: int = 50, condition_number: float = 1_000.0
) -> ModelData:
    """The Cholesky factor of `ill_conditioned_covariance` for the model.

    Args:
        seed: Seed of the random rotation.
        dim: Dimension.
        condition_number: Ratio of the largest to the smallest variance.

    Returns:
        ``((scale_tril,), {})``.
    """
    cov = ill_conditioned_covariance(dim, condition_number, seed)
    return (jnp.asarray(np.linalg.cholesky(cov)),), {}


def ill_conditioned_gaussian_posterior(
    scale_tril: ArrayLike,
) -> dict[str, PosteriorMoments]:
    """Exact moments of `ill_conditioned_gaussian`: the target itself.

    The full covariance is ``scale_tril @ scale_tril.T`` (or
    `ill_conditioned_covariance`); this returns its marginals.

    Returns:
        ``{"x": PosteriorMoments(zeros, sqrt(diag(cov)))}``.
    """
    scale_tril = np.asarray(scale_tril, dtype=np.float64)
    marginal_var = np.sum(scale_tril**2, axis=-1)
    return {"x": PosteriorMoments(np.zeros_like(marginal_var), np.sqrt(marginal_var))}


class BenchmarkModel(NamedTuple):
    """A model of the benchmark registry.

    Attributes:
        name: Key of the model in `BENCHMARK_MODELS`.
        model: The NumPyro model function.
        make_data: ``make_data(seed=0, **size) -> (args, kwargs)``; the size
            keywords are those of the underlying ``make_*_data`` function.
        latent_dim: Dimension of the unconstrained latent space at the default
            size of ``make_data``.
        description: One line describing the model and its size.
        num_warmup: MALA warmup steps after which the chain is stationary
            (its potential energy no longer drifts) from NumPyro's default
            initialisation; the benchmarks warm up this long unless told
            otherwise. DEER's Newton solve of a block that starts while the
            chain is still in transit is slow, and such draws are not yet
            posterior draws (``docs/limitations.md``).
    """

    name: str
    model: Callable[..., None]
    make_data: Callable[..., ModelData]
    latent_dim: int
    description: str
    num_warmup: int = 500


# --------------------------------------------------------------------------
# Eight schools (Rubin 1981; Gelman et al., Bayesian Data Analysis, 5.5)
# --------------------------------------------------------------------------

EIGHT_SCHOOLS_Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
"""Estimated treatment effects of the eight schools."""
EIGHT_SCHOOLS_SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)
"""Standard errors of the eight estimated effects."""


def eight_schools(sigma: ArrayLike, y: ArrayLike | None = None) -> None:
    """Eight schools, non-centred parameterisation.

    ``mu ~ N(0, 5)``, ``tau ~ HalfCauchy(5)``, ``theta_tilde[j] ~ N(0, 1)``,
    ``theta = mu + tau * theta_tilde`` (deterministic site ``theta``) and
    ``y[j] ~ N(theta[j], sigma[j])``. Latent dimension: number of schools + 2.

    Args:
        sigma: Known standard errors, shape ``(num_schools,)``.
        y: Observed effects, shape ``(num_schools,)``; ``None`` samples them.
    """
    num_schools = jnp.shape(sigma)[0]
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", num_schools):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def make_eight_schools_data(seed: int = 0) -> ModelData:
    """The classic eight-schools data (fixed; ``seed`` is accepted and unused).

    Returns:
        ``((sigma,), {"y": y})``.
    """
    del seed  # the data are the published ones
    return (jnp.asarray(EIGHT_SCHOOLS_SIGMA),), {"y": jnp.asarray(EIGHT_SCHOOLS_Y)}


# --------------------------------------------------------------------------
# Logistic regression
# --------------------------------------------------------------------------


def logistic_regression(X: ArrayLike, y: ArrayLike | None = None) -> None:
    """Bayesian logistic regression with an intercept.

    ``intercept ~ N(0, 1)``, ``weights ~ N(0, I)`` (one ``.to_event(1)`` site)
    and ``y[n] ~ Bernoulli(logits=intercept + X[n] @ weights)``. Latent
    dimension: number of features + 1.

    Args:
        X: Design matrix, shape ``(num_obs, num_features)``, without a column
            of ones.
        y: Binary labels, shape ``(num_obs,)``; ``None`` samples them.
    """
    num_obs, num_features = jnp.shape(X)
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 1.0))
    weights = numpyro.sample(
        "weights", dist.Normal(0.0, 1.0).expand([num_features]).to_event(1)
    )
    logits = intercept + jnp.asarray(X) @ weights
    with numpyro.plate("data", num_obs):
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def make_logistic_regression_data(
    seed: int = 0, num_obs: int = 1_000, num_features: int = 24
) -> ModelData:
    """Synthetic data for `logistic_regression`.

    Features are standard normal; the true intercept is 0.5 and the true
    weights are ``N(0, 4 / num_features)``, so the true logits have a standard
    deviation of about 2 whatever the number of features (not separable).

    Args:
        seed: Seed of NumPy's generator.
        num_obs: Number of observations.
        num_features: Number of features; the latent dimension is one more.

    Returns:
        ``((X,), {"y": y})``.
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((num_obs, num_features))
    weights = rng.standard_normal(num_features) * 2.0 / np.sqrt(num_features)
    logits = 0.5 + X @ weights
    y = rng.random(num_obs) < 1.0 / (1.0 + np.exp(-logits))
    return (jnp.asarray(X),), {"y": jnp.asarray(y.astype(np.int32))}


# --------------------------------------------------------------------------
# Hierarchical logistic regression (radon-like sizes: 85 groups)
# --------------------------------------------------------------------------


def hierarchical_logistic_regression(
    X: ArrayLike,
    group: ArrayLike,
    group_covariate: ArrayLike,
    y: ArrayLike | None = None,
) -> None:
    """Logistic regression with non-centred varying intercepts per group.

    ``mu_a ~ N(0, 1)``, ``sigma_a ~ HalfNormal(1)``, ``gamma ~ N(0, 1)``,
    ``beta ~ N(0, I)``, ``a_raw[g] ~ N(0, 1)``,
    ``a = mu_a + gamma * group_covariate + sigma_a * a_raw`` (deterministic site
    ``a``) and ``y[n] ~ Bernoulli(logits=a[group[n]] + X[n] @ beta)``. This is
    the shape of the radon model of Gelman and Hill with a county-level
    predictor. Latent dimension: number of groups + number of features + 3.

    Args:
        X: Individual-level features, shape ``(num_obs, num_features)``.
        group: Group index in ``[0, num_groups)`` of each observation, shape
            ``(num_obs,)``.
        group_covariate: Group-level predictor, shape ``(num_groups,)``; its
            length sets the number of groups.
        y: Binary labels, shape ``(num_obs,)``; ``None`` samples them.
    """
    num_obs, num_features = jnp.shape(X)
    num_groups = jnp.shape(group_covariate)[0]
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 1.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    gamma = numpyro.sample("gamma", dist.Normal(0.0, 1.0))
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([num_features]).to_event(1)
    )
    with numpyro.plate("groups", num_groups):
        a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
        a = numpyro.deterministic("a", mu_a + gamma * group_covariate + sigma_a * a_raw)
    logits = a[jnp.asarray(group)] + jnp.asarray(X) @ beta
    with numpyro.plate("data", num_obs):
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def make_hierarchical_logistic_data(
    seed: int = 0, num_obs: int = 2_000, num_groups: int = 85, num_features: int = 3
) -> ModelData:
    """Synthetic data for `hierarchical_logistic_regression`.

    Group sizes are unbalanced, as counties are in the radon data: every group
    has at least one observation and the rest are spread with log-normal
    weights. True values: ``mu_a = -0.5``, ``sigma_a = 0.8``, ``gamma = 0.7``,
    ``beta ~ N(0, 0.25)``.

    Args:
        seed: Seed of NumPy's generator.
        num_obs: Number of observations (at least ``num_groups``).
        num_groups: Number of groups.
        num_features: Number of individual-level features.

    Returns:
        ``((X, group, group_covariate), {"y": y})``.
    """
    if num_obs < num_groups:
        raise ValueError(f"num_obs={num_obs} must be at least num_groups={num_groups}")
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 1.0, num_groups)
    extra = rng.choice(num_groups, size=num_obs - num_groups, p=weights / weights.sum())
    group = rng.permutation(np.concatenate([np.arange(num_groups), extra]))
    X = rng.standard_normal((num_obs, num_features))
    group_covariate = rng.standard_normal(num_groups)
    a = -0.5 + 0.7 * group_covariate + 0.8 * rng.standard_normal(num_groups)
    beta = 0.5 * rng.standard_normal(num_features)
    logits = a[group] + X @ beta
    y = rng.random(num_obs) < 1.0 / (1.0 + np.exp(-logits))
    args = (jnp.asarray(X), jnp.asarray(group), jnp.asarray(group_covariate))
    return args, {"y": jnp.asarray(y.astype(np.int32))}


# --------------------------------------------------------------------------
# Stochastic volatility (Kim, Shephard and Chib 1998; Stan User's Guide 2.5)
# --------------------------------------------------------------------------


def _stationary_ar1(phi: Array, one_minus_phi_sq: Array, eps: Array) -> Array:
    """AR(1) path ``x[t] = phi * x[t-1] + eps[t]`` started at stationarity.

    ``x[0] = eps[0] / sqrt(1 - phi**2)``. The recursion is affine with a
    scalar transition, so it is the package's parallel affine scan
    (:func:`numpyro_deer.core.scan_diagonal`, the DEER linear step) on the
    pairs ``(phi, eps[t])``: ``O(T log T)`` elementwise work in ``log T``
    parallel steps, which batches well on a GPU (a closed-form ``T x T`` matrix
    product would cost ``T**2`` per evaluation).
    """
    first = eps[0] / jnp.sqrt(one_minus_phi_sq)
    b = eps.at[0].set(first)
    return scan_diagonal(jnp.full_like(eps, phi), b)


def stochastic_volatility(returns: ArrayLike) -> None:
    """Stochastic volatility model with a latent AR(1) log variance.

    ``mu ~ N(0, 1)`` (mean log variance), ``phi_raw ~ Beta(20, 1.5)`` with
    persistence ``phi = 2 phi_raw - 1`` in (-1, 1), ``sigma ~ HalfNormal(1)``,
    non-centred innovations ``eps[t] ~ N(0, 1)``, log variance
    ``h = mu + sigma * x`` with ``x`` the stationary AR(1) path driven by
    ``eps`` (an associative scan), and ``returns[t] ~ N(0, exp(h[t] / 2))``.
    Latent dimension: number of time steps + 3.

    Args:
        returns: Observed returns, shape ``(num_steps,)``.
    """
    num_steps = jnp.shape(returns)[0]
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    phi_raw = numpyro.sample("phi_raw", dist.Beta(20.0, 1.5))
    phi = numpyro.deterministic("phi", 2.0 * phi_raw - 1.0)
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("time", num_steps):
        eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
        # 1 - phi^2 = 4 phi_raw (1 - phi_raw), without cancellation near phi = 1.
        path = _stationary_ar1(phi, 4.0 * phi_raw * (1.0 - phi_raw), eps)
        h = numpyro.deterministic("h", mu + sigma * path)
        numpyro.sample("returns", dist.Normal(0.0, jnp.exp(h / 2.0)), obs=returns)


def make_stochastic_volatility_data(seed: int = 0, num_steps: int = 200) -> ModelData:
    """Synthetic returns from `stochastic_volatility`'s generative process.

    True values: ``mu = -1``, ``phi = 0.95``, ``sigma = 0.25``.

    Args:
        seed: Seed of NumPy's generator.
        num_steps: Number of time steps; the latent dimension is 3 more.

    Returns:
        ``((returns,), {})``.
    """
    rng = np.random.default_rng(seed)
    mu, phi, sigma = -1.0, 0.95, 0.25
    x = np.empty(num_steps)
    x[0] = rng.standard_normal() / np.sqrt(1.0 - phi**2)
    for t in range(1, num_steps):
        x[t] = phi * x[t - 1] + rng.standard_normal()
    h = mu + sigma * x
    returns = np.exp(h / 2.0) * rng.standard_normal(num_steps)
    return (jnp.asarray(returns),), {}


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

BENCHMARK_MODELS: dict[str, BenchmarkModel] = {
    bench.name: bench
    for bench in (
        BenchmarkModel(
            "eight_schools",
            eight_schools,
            make_eight_schools_data,
            10,
            "Eight schools, non-centred (8 schools, D=10).",
        ),
        BenchmarkModel(
            "logistic_regression",
            logistic_regression,
            make_logistic_regression_data,
            25,
            "Logistic regression, N=1,000, 24 features + intercept (D=25).",
        ),
        BenchmarkModel(
            "logistic_regression_large",
            logistic_regression,
            partial(make_logistic_regression_data, num_obs=10_000, num_features=99),
            100,
            "Logistic regression, N=10,000, 99 features + intercept (D=100).",
        ),
        BenchmarkModel(
            "hierarchical_logistic_regression",
            hierarchical_logistic_regression,
            make_hierarchical_logistic_data,
            91,
            "Hierarchical logistic regression, 85 groups, N=2,000 (D=91).",
            # after 800 MALA warmup steps its potential energy still falls
            # (1,418 -> 1,237, and on to 1,205 in the next 4,096 draws); by
            # 700 of 3,000 it is flat
            3_000,
        ),
        BenchmarkModel(
            "stochastic_volatility",
            stochastic_volatility,
            make_stochastic_volatility_data,
            203,
            "Stochastic volatility, AR(1) log variance, T=200 (D=203).",
            # potential energy flat from about 500 of 3,000 warmup steps
            3_000,
        ),
        BenchmarkModel(
            "ill_conditioned_gaussian",
            ill_conditioned_gaussian,
            make_ill_conditioned_gaussian_data,
            50,
            "Gaussian with a random rotation, condition number 1,000 (D=50).",
        ),
    )
}
"""The benchmark models by name."""
