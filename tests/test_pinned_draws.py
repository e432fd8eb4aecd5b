"""Pinned draws: the same key and settings give the same chain.

The values were taken when the tapes became flat draws (float64,
``PRNGKey(1)``, 100 warmup draws, blocks of 32, 64 draws; eight schools'
again when the dense metric's factor became NumPyro's upper-triangular
one): draws 0, 31, 32 and 63 of a few latent sites. A change of the chain
for a given key (how the tape is drawn, the step size or mass adaptation,
an accept decision) fails here and is a breaking change that the changelog
says. DEER agrees with the sequential scan of the same tape up to the
solver's tolerance, so its pinned values are compared with a tolerance that
a changed chain would exceed by orders of magnitude.
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
PINNED = {('eight_schools', 'deer'): {'mu': [5.10048479441815,
                                    8.69826933461772,
                                    9.46201238669505,
                                    4.42681713023314],
                             'tau': [7.19413429965865,
                                     2.14861579700473,
                                     3.05139435870331,
                                     0.965926556647984],
                             'theta_tilde': [1.19897390297472,
                                             0.0501196637970335,
                                             -0.228744818249101,
                                             -2.07179441540394,
                                             0.244993454056766,
                                             -2.55839909377831,
                                             1.4899348243251,
                                             0.856509329723493]},
 ('eight_schools', 'sequential'): {'mu': [5.10048479441815,
                                          8.69826933095429,
                                          9.46201238234002,
                                          4.426817122656],
                                   'tau': [7.19413429965865,
                                           2.14861577239365,
                                           3.05139432461937,
                                           0.965926560504288],
                                   'theta_tilde': [1.19897390297472,
                                                   0.0501196637970332,
                                                   -0.228744820136853,
                                                   -2.07179441386895,
                                                   0.244993452266012,
                                                   -2.55839909242569,
                                                   1.48993482665886,
                                                   0.85650932668175]},
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
