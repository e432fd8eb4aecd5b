"""Stress: the block driver against stock ``MCMC`` over the options users combine.

Chain methods, thinning, a ``block_size`` change between warmup and run, data
refilled in place and pickling, over two models and two seeds; every run must
give the draws stock ``numpyro.infer.MCMC`` gives with the same kernel. Slow
(``-m slow``), not in CI.
"""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC as StockMCMC

from numpyro_deer import DEERMALA, MCMC

pytestmark = pytest.mark.slow

SIZES = {"num_warmup": 40, "num_samples": 64, "thinning": 2, "progress_bar": False}


def location(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def regression(y):
    # four coefficients on four chains: the chain-axis trap
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(4), 1.0).to_event(1))
    numpyro.sample("y", dist.Normal(beta.sum(), 1.0), obs=y)


MODELS = {"location": location, "regression": regression}


def _pair(model, chain_method, num_chains, block_size=16):
    options = dict(SIZES, num_chains=num_chains, chain_method=chain_method)
    ours = MCMC(DEERMALA(model, block_size=block_size, method="deer"), **options)
    stock = StockMCMC(DEERMALA(model, block_size=block_size, method="deer"), **options)
    return ours, stock


def _same(ours, stock):
    a = ours.get_samples(group_by_chain=True)
    b = stock.get_samples(group_by_chain=True)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-8, err_msg=name)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("chain_method", ["sequential", "vectorized", "parallel"])
def test_driver_matches_stock_mcmc(chain_method, model_name, seed):
    model = MODELS[model_name]
    data = np.zeros(10)
    ours, stock = _pair(model, chain_method, num_chains=4)
    key = jax.random.PRNGKey(seed)
    ours.run(key, data)
    stock.run(key, data)
    _same(ours, stock)
    draws = ours.get_samples(group_by_chain=True)
    assert all(v.shape[:2] == (4, 32) for v in draws.values())

    # data refilled in place: both read it again
    data[:] = 3.0
    ours.run(key, data)
    stock.run(key, data)
    _same(ours, stock)

    # a pickled driver continues like the original
    clone = pickle.loads(pickle.dumps(ours))
    clone.run(key, data)
    _same(clone, stock)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sizes", [(16, 32), (32, 16)])
def test_block_size_change_between_warmup_and_run(sizes, seed):
    data = np.ones(10)
    options = dict(SIZES, num_chains=2, chain_method="vectorized")
    warm = MCMC(DEERMALA(regression, block_size=sizes[0], method="deer"), **options)
    warm.warmup(jax.random.PRNGKey(seed), data)
    state = warm.post_warmup_state
    other = MCMC(DEERMALA(regression, block_size=sizes[1], method="deer"), **options)
    other.post_warmup_state = state
    other.run(state.rng_key, data)
    warm.run(state.rng_key, data)
    # the buffer's own block size: the chain the warmed-up driver continues
    _same(other, warm)
    draws = other.get_samples()["beta"]
    assert len(np.unique(draws[:, 0])) > len(draws) // 2  # no repeated blocks
