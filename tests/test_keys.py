"""The chains' keys split on the host (``numpyro_deer.infer.keys``).

They must be NumPyro's keys bit for bit (``jax.random.split`` of the run's
key), so that a run's chains are those of stock ``MCMC``; where JAX would
split another way the split is left to JAX.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.models import gaussian_mean_model
from numpyro_deer import DEERMALA, MCMC
from numpyro_deer.infer.keys import chain_keys, host_split

from .helpers import gaussian_data


@pytest.mark.parametrize("num", [2, 3, 7, 1024])
def test_host_split_is_jax_split_bit_for_bit(num):
    rng = np.random.default_rng(num)
    keys = [np.zeros(2), np.full(2, 2**32 - 1), *rng.integers(0, 2**32, (6, 2))]
    for key in keys:
        key = jnp.asarray(np.asarray(key, np.uint64).astype(np.uint32))
        np.testing.assert_array_equal(
            host_split(key, num), np.asarray(jax.random.split(key, num))
        )


def test_other_keys_are_split_by_jax():
    assert host_split(jax.random.key(0), 4) is None  # a typed key
    with jax.threefry_partitionable(False):  # the other split rule
        assert host_split(jax.random.PRNGKey(0), 4) is None
        original = chain_keys(jax.random.PRNGKey(0), 4)
        np.testing.assert_array_equal(
            original, jax.random.split(jax.random.PRNGKey(0), 4)
        )
    traced = jax.jit(lambda k: jnp.sum(chain_keys(k, 3)))(jax.random.PRNGKey(1))
    assert traced == jnp.sum(jax.random.split(jax.random.PRNGKey(1), 3))
    batch = jax.random.split(jax.random.PRNGKey(2), 3)
    assert chain_keys(batch, 3) is batch  # already a key per chain


def test_a_run_of_several_chains_splits_no_key_eagerly(monkeypatch):
    """``MCMC.run`` with three chains gives the draws of NumPyro's split keys
    and calls ``jax.random.split`` on no concrete key (no eager program)."""
    args, kwargs = gaussian_data(1.0)

    def run(key):
        mcmc = MCMC(
            DEERMALA(gaussian_mean_model, block_size=16),
            num_warmup=20,
            num_samples=32,
            num_chains=3,
            chain_method="vectorized",
            progress_bar=False,
        )
        mcmc.run(key, *args, **kwargs)
        return mcmc.get_samples(group_by_chain=True)["mu"]

    key = jax.random.PRNGKey(5)
    expected = run(jax.random.split(key, 3))
    split = jax.random.split
    eager = []

    def spy(key, *rest, **options):
        if not isinstance(key, jax.core.Tracer):
            eager.append(np.shape(key))
        return split(key, *rest, **options)

    monkeypatch.setattr(jax.random, "split", spy)
    draws = run(key)
    assert eager == []
    np.testing.assert_array_equal(draws, expected)
