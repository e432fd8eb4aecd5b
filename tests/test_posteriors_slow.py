"""Posteriors against a long NUTS reference (marked ``slow``: not run in CI).

Run with ``python -m pytest -m slow tests/test_posteriors_slow.py``. The
tolerance of each comparison is derived from the Monte Carlo standard errors of
both runs: |mean_DEER - mean_NUTS| < 4 * sqrt(mcse_DEER**2 + mcse_NUTS**2).
"""

import jax
import numpy as np
import pytest
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC as StockMCMC
from numpyro.infer import NUTS

from benchmarks.models import BENCHMARK_MODELS
from numpyro_deer import DEERMALA, MCMC

pytestmark = pytest.mark.slow


def _mean_and_mcse(draws):
    draws = np.asarray(draws)
    flat = draws.reshape(draws.shape[0], -1)
    ess = np.array(
        [effective_sample_size(flat[None, :, j]) for j in range(flat.shape[1])]
    )
    return flat.mean(0), flat.std(0) / np.sqrt(ess)


# eight schools: the blocks fall back to the sequential scan (a warning); the
# draws are still the MALA chain and are checked all the same
@pytest.mark.filterwarnings("ignore::numpyro_deer.DEERConvergenceWarning")
@pytest.mark.parametrize("name", ["eight_schools", "logistic_regression"])
def test_matches_long_nuts_reference(name):
    spec = BENCHMARK_MODELS[name]
    args, kwargs = spec.make_data(0)
    nuts = StockMCMC(
        NUTS(spec.model), num_warmup=1000, num_samples=20000, progress_bar=False
    )
    nuts.run(jax.random.PRNGKey(1), *args, **kwargs)
    deer = MCMC(
        DEERMALA(spec.model, block_size=1024, method="deer"),
        num_warmup=1000,
        num_samples=40960,
        progress_bar=False,
    )
    deer.run(jax.random.PRNGKey(2), *args, **kwargs)
    reference, ours = nuts.get_samples(), deer.get_samples()
    latent = [k for k in nuts.last_state.z]
    for site in latent:
        m_ref, se_ref = _mean_and_mcse(reference[site])
        m_our, se_our = _mean_and_mcse(ours[site])
        bound = 4 * np.sqrt(se_ref**2 + se_our**2)
        assert np.all(np.abs(m_our - m_ref) < bound), (site, m_our, m_ref, bound)
