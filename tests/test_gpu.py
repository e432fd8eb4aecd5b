"""On a GPU: DEER is the sequential chain, float32 blocks converge, memory is checked.

Selected with ``-m gpu`` (the default run leaves them out) and skipped unless
JAX's default backend is a GPU::

    JAX_PLATFORMS=cuda python -m pytest -m gpu

The session runs in float64 (``conftest.py``); the float32 test turns it off
inside ``jax.enable_x64(False)``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.diagnostics import effective_sample_size

from benchmarks.models import BENCHMARK_MODELS
from numpyro_deer import DEERMALA, MCMC, DEERSolver
from numpyro_deer.infer.memory import free_device_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        jax.default_backend() != "gpu",
        reason="needs a GPU: run with JAX_PLATFORMS=cuda where JAX sees one",
    ),
]

EIGHT_SCHOOLS = BENCHMARK_MODELS["eight_schools"]


def _run(method, block_size, num_warmup, num_samples, **options):
    args, kwargs = EIGHT_SCHOOLS.make_data()
    kernel = DEERMALA(
        EIGHT_SCHOOLS.model, block_size=block_size, method=method, **options
    )
    mcmc = MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False
    )
    mcmc.run(
        jax.random.PRNGKey(11),
        *args,
        **kwargs,
        extra_fields=("deer_converged", "newton_iterations"),
    )
    return mcmc


def test_deer_is_the_sequential_chain_on_the_gpu():
    """float64, tight tolerances: the same draws as the sequential scan."""
    runs = {
        method: _run(method, 1024, 300, 4096, solver=DEERSolver(atol=1e-12, rtol=1e-10))
        for method in ("sequential", "deer")
    }
    deer = runs["deer"]
    assert np.all(deer.get_extra_fields()["deer_converged"])
    # a parallel solve, not one step per iteration
    assert np.max(deer.get_extra_fields()["newton_iterations"]) < 1024
    reference = runs["sequential"].get_samples()
    for site, draws in deer.get_samples().items():
        np.testing.assert_allclose(draws, reference[site], atol=1e-8, err_msg=site)


def test_float32_blocks_converge_and_agree_with_the_sequential_chain():
    """float32, the defaults: every block certified, the same posterior."""
    with jax.enable_x64(False):
        runs = {
            method: _run(method, 16_384, 500, 32_768)
            for method in ("sequential", "deer")
        }
        samples = {m: run.get_samples() for m, run in runs.items()}
        converged = runs["deer"].get_extra_fields()["deer_converged"]
    assert np.all(converged)
    for site in ("mu", "tau"):
        deer, seq = (np.asarray(samples[m][site]) for m in ("deer", "sequential"))
        assert deer.dtype == np.float32
        assert np.all(np.isfinite(deer))
        # where float32 rounding parts the two chains they are still two chains
        # of one posterior: means within five standard errors
        se = [np.std(x) / np.sqrt(effective_sample_size(x[None])) for x in (deer, seq)]
        assert abs(np.mean(deer) - np.mean(seq)) < 5 * np.hypot(*se), site


def _gaussian_sampler(block_size):
    kernel = DEERMALA(
        potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), block_size=block_size
    )
    return MCMC(kernel, num_warmup=5, num_samples=1, progress_bar=False)


def test_block_larger_than_the_gpu_fails_before_it_runs():
    """Real free memory: the buffer check in init, then the compiled block's."""
    dim = 4096
    free = free_device_bytes()
    assert free is not None, "a GPU reports its memory"
    per_draw = (dim + 4) * 8  # float64

    # the buffer of draws alone: twice the free memory
    too_big = 2 ** int(np.ceil(np.log2(2 * free / per_draw)))
    with pytest.raises(ValueError, match="for the buffer of its draws alone"):
        _gaussian_sampler(too_big).run(
            jax.random.PRNGKey(0), init_params={"x": jnp.zeros(dim)}
        )

    # a buffer of about a quarter of it fits; the solve's B x D arrays do not
    fits = 2 ** int(np.floor(np.log2(0.25 * free / per_draw)))
    with pytest.raises(ValueError, match=r"needs about .* per block.*Set block_size"):
        _gaussian_sampler(fits).run(
            jax.random.PRNGKey(0), init_params={"x": jnp.zeros(dim)}
        )
