"""Draws pinned before the package was restructured: the same key and settings
give the same chain.

The values were taken from the code as it was before the redesign (float64,
``PRNGKey(1)``, 100 warmup draws, blocks of 32, 64 draws): draws 0, 31, 32
and 63 of a few latent sites. DEER agrees with the sequential scan of the same
tape up to the solver's tolerance, so its pinned values are compared with a
tolerance that a changed chain (a different tape, step size or accept
decision) would exceed by orders of magnitude.
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
PINNED = {('eight_schools', 'deer'): {'mu': [0.71234981165516,
                                    -4.69944280849518,
                                    -4.19899731277231,
                                    -0.423425532900334],
                             'tau': [15.5702896724467,
                                     8.68581629060891,
                                     8.73396778508286,
                                     2.3920180492841],
                             'theta_tilde': [0.577215586854963,
                                             -0.34439409278461,
                                             0.483676570123888,
                                             0.201872838060215,
                                             0.513329919364993,
                                             -0.0133029240421714,
                                             -1.73375021370721,
                                             -1.76500576704922]},
 ('eight_schools', 'sequential'): {'mu': [0.71234981165516,
                                          -4.69944284044219,
                                          -4.19899734472965,
                                          -0.423425551722267],
                                   'tau': [15.5702896724467,
                                           8.68581638308525,
                                           8.73396787763845,
                                           2.39201805620054],
                                   'theta_tilde': [0.577215586854963,
                                                   -0.34439409278461,
                                                   0.483676576426756,
                                                   0.20187284657888,
                                                   0.513329925697971,
                                                   -0.0133029155967969,
                                                   -1.73375021157467,
                                                   -1.76500576241533]},
 ('gaussian_mean', 'deer'): {'mu': [2.7457710120453,
                                    2.74772003937186,
                                    3.05958214989252,
                                    3.05880873650581]},
 ('gaussian_mean', 'sequential'): {'mu': [2.7457710120453,
                                          2.74772003937186,
                                          3.05958214989252,
                                          3.05880873650581]}}
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
