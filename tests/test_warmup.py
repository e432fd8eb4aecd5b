"""The warmup's step size search, on a standard normal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_deer.core import MALA, make_step_fn, make_tape
from numpyro_deer.infer.warmup import MAX_STEP_SIZE_SEARCH, find_reasonable_step_size

D = 10
TARGET = 0.8


def _potential(x):
    return 0.5 * jnp.sum(x**2)


def _acceptance(eps, x, key):
    """One MALA step's acceptance probability on the tape the search draws."""
    tape = jax.tree.map(lambda v: v[0], make_tape(key, 1, D, x.dtype))
    return float(
        make_step_fn(MALA(), _potential, eps, jnp.ones(D))(x, tape)[1].accept_prob
    )


@pytest.mark.parametrize("start", [1e-4, 50.0], ids=["grows", "shrinks"])
def test_step_size_search_crosses_the_target(start):
    key_x, key = jax.random.split(jax.random.PRNGKey(3))
    x = jax.random.normal(key_x, (D,))
    eps = float(
        find_reasonable_step_size(_potential, TARGET, start, jnp.ones(D), (x,), key)
    )
    # a real search: it moved in the right direction, within its bound
    assert (eps > start) if start < 1 else (eps < start)
    assert start * 2.0**-MAX_STEP_SIZE_SEARCH < eps < start * 2.0**MAX_STEP_SIZE_SEARCH
    # the returned step passes the target, twice it does not
    assert _acceptance(eps, x, key) >= TARGET
    assert _acceptance(2 * eps, x, key) <= TARGET
    # it is a power-of-two multiple of the start
    np.testing.assert_allclose(np.log2(eps / start), np.round(np.log2(eps / start)))
