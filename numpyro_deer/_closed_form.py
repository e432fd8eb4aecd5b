"""Models whose posteriors are known in closed form.

Samplers are tested against these: small conjugate models and an
ill-conditioned Gaussian. Each model comes with a data generator with a fixed
seed, returning ``(args, kwargs)`` for ``mcmc.run``, and a function that
returns the exact posterior mean and standard deviation of every latent site
as `PosteriorMoments`. Import them from :mod:`numpyro_deer.models`.
"""

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike

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
