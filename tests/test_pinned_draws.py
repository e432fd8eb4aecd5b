"""Pinned draws: the same key and settings give the same chain.

The values were taken when the tapes became flat draws (float64,
``PRNGKey(1)``, 100 warmup draws, blocks of 32, 64 draws): draws 0, 31, 32
and 63 of a few latent sites. A change of the chain for a given key (how the
tape is drawn, the step size or mass adaptation, an accept decision) fails
here and is a breaking change that the changelog says. DEER agrees with the
sequential scan of the same tape up to the solver's tolerance, so its pinned
values are compared with a tolerance that a changed chain would exceed by
orders of magnitude.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.models import (
    EIGHT_SCHOOLS_SIGMA,
    EIGHT_SCHOOLS_Y,
    eight_schools,
    gaussian_mean_model,
)
from numpyro_deer import DEERMALA, MCMC

# fmt: off
PINNED = {('eight_schools', 'deer'): {'mu': [4.74478991790794,
                                    6.2719838007131,
                                    6.35113528107128,
                                    4.93904295644127],
                             'tau': [5.23162918101779,
                                     2.64704569013428,
                                     2.79479441213311,
                                     0.398127728646532],
                             'theta_tilde': [0.980457439023269,
                                             -0.101459901994274,
                                             -0.242880840861462,
                                             -2.15876744049986,
                                             0.136178256835329,
                                             -2.6296764342153,
                                             0.777422746037026,
                                             0.650349813590865]},
 ('eight_schools', 'sequential'): {'mu': [4.74478991790794,
                                          6.27198379524906,
                                          6.35113527536733,
                                          4.93904295503955],
                                   'tau': [5.23162918101777,
                                           2.64704567300662,
                                           2.79479439491515,
                                           0.3981277229116],
                                   'theta_tilde': [0.980457439023267,
                                                   -0.101459901994274,
                                                   -0.242880841897432,
                                                   -2.15876744033704,
                                                   0.136178255873979,
                                                   -2.6296764341466,
                                                   0.777422742315468,
                                                   0.650349814215496]},
 ('gaussian_mean', 'deer'): {'mu': [3.17460365793467,
                                    2.64805185248708,
                                    2.83059363123726,
                                    3.04598119268611]},
 ('gaussian_mean', 'sequential'): {'mu': [3.17460365793467,
                                          2.64805185248708,
                                          2.83059363123726,
                                          3.04598119268611]}}
# fmt: on

CASES = {
    "eight_schools": (
        eight_schools,
        (jnp.array(EIGHT_SCHOOLS_SIGMA), jnp.array(EIGHT_SCHOOLS_Y)),
    ),
    "gaussian_mean": (gaussian_mean_model, (jnp.full((20,), 3.0), 1.0)),
}


@pytest.mark.parametrize("method", ["deer", "sequential"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_pinned_draws(name, method):
    model, args = CASES[name]
    kernel = DEERMALA(model, block_size=32, method=method)
    mcmc = MCMC(kernel, num_warmup=100, num_samples=64, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *args)
    samples = mcmc.get_samples()
    for site, expected in PINNED[(name, method)].items():
        got = np.asarray(samples[site])[[0, 31, 32, 63]]
        got = (got[:, :2] if got.ndim > 1 else got).reshape(-1)
        np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-9, err_msg=site)
