"""Small shared helpers for the tests."""

import jax.numpy as jnp

STOCK_RUN_CONFIG = {
    "block_size": 64,
    # 384 steps: six blocks of 64, which numpyro_deer.MCMC keeps (it fits the
    # block size to the run; stock MCMC cannot)
    "mcmc": {"num_warmup": 150, "num_samples": 384, "thinning": 2},
    "extra": ("adapt_state.step_size", "newton_iterations", "deer_converged"),
}


def gaussian_data(value: float, n: int = 20):
    """Data for ``gaussian_mean_model``: ``n`` copies of ``value``, noise scale 1."""
    return (jnp.full((n,), value), 1.0), {}
