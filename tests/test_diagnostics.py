"""The convergence check after ``numpyro_deer.MCMC.run``.

The suite ignores ``ConvergenceDiagnosticWarning`` (pyproject: the other
tests run short chains on purpose); here every test turns it back on. The
rule is checked on synthetic draws with known autocorrelation, then through
the driver: a short run on a hard hierarchical posterior warns naming a site,
a long run on a Gaussian does not, and ``MCMC.warmup`` does not check.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import split_gelman_rubin

import numpyro_deer
from benchmarks.models import gaussian_mean_model
from numpyro_deer import DEERMALA, MCMC, ConvergenceDiagnosticWarning
from numpyro_deer.infer import diagnostics
from numpyro_deer.infer.diagnostics import (
    MIN_ESS,
    convergence_message,
    diagnose,
    nested_rhat,
    rank_normalize,
)

from .helpers import gaussian_data

pytestmark = pytest.mark.filterwarnings(
    "error::numpyro_deer.ConvergenceDiagnosticWarning"
)

SCHOOLS_Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
SITE = re.compile(r"at '(mu|tau|theta\[\d\])'")


def _ar1(rng, shape, rho):
    """Stationary AR(1) chains along axis 1, unit variance."""
    noise = rng.normal(size=shape)
    x = np.empty(shape)
    x[:, 0] = noise[:, 0]
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho**2) * noise[:, t]
    return x


def test_exported_like_the_other_warnings():
    assert "ConvergenceDiagnosticWarning" in numpyro_deer.__all__
    assert issubclass(ConvergenceDiagnosticWarning, UserWarning)


def test_rank_normalize_is_normal_scores_of_the_ranks():
    x = np.array([[[3.0], [1.0]], [[2.0], [10.0]]])  # 2 chains, 2 draws
    z = rank_normalize(x)[..., 0]
    # ranks 3, 1 / 2, 4 of S = 4: Phi^-1((r - 3/8) / (S + 1/4))
    from scipy.stats import norm

    expected = norm.ppf((np.array([[3, 1], [2, 4]]) - 0.375) / 4.25)
    np.testing.assert_allclose(z, expected)


def test_independent_draws_pass_and_the_worst_component_is_named():
    rng = np.random.default_rng(0)
    good = rng.normal(size=(4, 1000, 3))
    result = diagnose({"good": good})
    assert result.converged and result.min_ess > 2000
    # AR(1) with rho = 0.99: ESS about 4,000 / 199 = 20
    slow = _ar1(rng, (4, 1000, 2), 0.99)
    result = diagnose({"good": good, "slow": slow})
    assert not result.converged
    assert result.min_ess < MIN_ESS and result.ess_site in ("slow[0]", "slow[1]")
    assert result.rhat_kind == "split"


def test_antithetic_chains_pass_with_the_bounded_ess():
    """Negatively autocorrelated chains (AR(1) with rho = -0.9, ESS per draw
    about 19) pass: NumPyro's estimate alone is negative for them, and the
    ESS is bounded at S log10 S as Stan's and ArviZ's."""
    rng = np.random.default_rng(1)
    x = _ar1(rng, (1, 4000, 1), -0.9)
    result = diagnose({"a": x})
    size = 4000  # two halves of 2,000
    assert result.converged
    assert result.min_ess == pytest.approx(size * np.log10(size))
    # a positive autocorrelation still bounds nothing: rho = 0.9, about 210
    slow = diagnose({"a": _ar1(rng, (1, 4000, 1), 0.9)})
    assert 100 < slow.min_ess < MIN_ESS and not slow.converged


def test_many_short_chains_use_the_nested_rhat():
    """64 chains of 200 draws, AR(1) with rho = 0.8: ESS about 64 * 200 / 9 =
    1,400, so the split R-hat (about 1 + 64 / 1,400) exceeds 1.01 on a run
    that mixes well, the nested R-hat (about 1 + 4 / 2,800) does not; a
    superchain whose chains sit elsewhere fails it."""
    rng = np.random.default_rng(1)
    x = _ar1(rng, (64, 200, 2), 0.8)
    assert split_gelman_rubin(rank_normalize(x)).max() > 1.01
    result = diagnose({"x": x})
    assert result.rhat_kind == "nested" and result.converged
    assert result.max_rhat < 1.005
    x[:16, :, 1] += 0.5  # a quarter of the chains in the wrong place
    result = diagnose({"x": x})
    assert not result.converged and result.rhat_site == "x[1]"
    assert result.max_rhat > 1.01 and result.min_ess > MIN_ESS


def test_many_chains_are_checked_on_evenly_spaced_chains(monkeypatch):
    """Where every chain's shortest thinning exceeds the check's values,
    evenly spaced chains stand for all: the check looks at about
    ``MAX_VALUES`` values, its ESS is scaled to all chains (within 15 % of
    the ESS of every chain), and a quarter of the chains elsewhere is still
    found."""
    rng = np.random.default_rng(4)
    x = _ar1(rng, (512, 64, 48), 0.5)  # 1.6 million values
    looked = []
    check = diagnostics._check_batch

    def record(batch, nested):
        looked.append(batch.size)
        return check(batch, nested)

    full = diagnose({"x": x}, max_values=x.size)
    monkeypatch.setattr(diagnostics, "_check_batch", record)
    result = diagnose({"x": x})
    assert sum(looked) <= diagnostics.MAX_VALUES < x.size
    assert result.num_chains == 512 and result.converged
    assert result.min_ess == pytest.approx(full.min_ess, rel=0.15)
    x[:128, :, 7] += 0.5
    result = diagnose({"x": x})
    assert not result.converged and result.rhat_site == "x[7]"


def test_nested_rhat_with_one_chain_per_superchain_is_rhat_without_split():
    """With ``M = 1`` the nested R-hat is ``sqrt(1 + B / W)`` with ``B`` the
    variance of the chain means (Margossian et al., 2024, footnote 3)."""
    rng = np.random.default_rng(2)
    z = rng.normal(size=(4, 50, 1)) + np.arange(4)[:, None, None] * 0.1
    expected = np.sqrt(1 + z.mean(1).var(0, ddof=1) / z.var(1, ddof=1).mean(0))
    np.testing.assert_allclose(nested_rhat(z), expected)


def test_message_names_the_site_the_divergences_and_what_to_do():
    rng = np.random.default_rng(3)
    result = diagnose({"tau": _ar1(rng, (1, 400), 0.98)})
    message = convergence_message(result, 7, "DEERMALA")
    assert "at 'tau'" in message and "7 divergent transitions" in message
    for advice in ("num_samples", "DEERHMC", "num_chains"):
        assert advice in message
    assert "DEERHMC" not in convergence_message(result, None, "DEERHMC")
    assert "divergent" not in convergence_message(result, None, "DEERHMC")


def test_too_few_draws_or_constant_sites_are_not_checked():
    assert diagnose({"x": np.zeros((2, 3))}) is None
    assert diagnose({"c": np.ones((2, 100))}) is None


def _schools_t(sigma, y=None):
    """Centred eight schools with a Student-t likelihood, as a user writes it."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.StudentT(4.0, theta, sigma), obs=y)


def test_a_short_run_on_a_hard_posterior_warns_once_naming_a_site():
    mcmc = MCMC(
        DEERMALA(_schools_t, block_size=100),
        num_warmup=100,
        num_samples=200,
        progress_bar=False,
    )
    mcmc.warmup(jax.random.PRNGKey(0), SCHOOLS_SIGMA, y=SCHOOLS_Y)  # no check
    with pytest.warns(ConvergenceDiagnosticWarning) as record:
        mcmc.run(jax.random.PRNGKey(1), SCHOOLS_SIGMA, y=SCHOOLS_Y)
    checks = [w for w in record if w.category is ConvergenceDiagnosticWarning]
    assert len(checks) == 1
    message = str(checks[0].message)
    assert SITE.search(message), message
    assert "bulk effective sample size" in message
    assert re.search(r"\d+ divergent transition", message)
    assert checks[0].filename == __file__  # points at the user's run call


def test_a_long_run_on_a_gaussian_does_not_warn():
    args, kwargs = gaussian_data(3.0)
    mcmc = MCMC(
        DEERMALA(gaussian_mean_model, block_size=1000),
        num_warmup=200,
        num_samples=4000,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceDiagnosticWarning)
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)
    assert diagnose(draws).converged
