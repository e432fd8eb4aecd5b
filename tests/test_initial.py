"""The kernel's starting point: the model set up abstractly, NumPyro's search
for initial values inside the compiled initial state, and the eager set-up
kept for models whose set-up holds on to traced values."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import initialize_model

from numpyro_deer import DEERMALA, MCMC
from numpyro_deer.infer.initial import holds_tracer, initialize

from .helpers import compile_log

LOG = compile_log()
Y = np.linspace(-1.0, 1.0, 13)


def _thirteen(y):
    """A model with latent shapes no other test samples (14 values)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([12]).to_event(1))
    numpyro.sample("y", dist.Normal(mu + scale * jnp.append(x, 0.0), 1.0), obs=y)


def _eager_values(model, key, *args):
    """NumPyro's initial values, searched eagerly from ``key``."""
    info = initialize_model(
        key, model, init_strategy=init_to_uniform, model_args=args
    ).param_info
    return info.z


def test_set_up_compiles_nothing():
    # the model checks and NumPyro's initialize_model are traced, not run:
    # run eagerly every operation of the model (and NumPyro's search loop)
    # compiled a program of its own
    kernel = DEERMALA(_thirteen)
    key = jax.random.PRNGKey(0)
    before = len(LOG.events)
    init = kernel.init_program(key, 10, None, (Y,), {})
    jax.eval_shape(init.program, *init.arguments)
    assert LOG.events[before:] == []


@pytest.mark.parametrize("num_chains", [None, 3])
def test_initial_values_are_numpyros_search(num_chains):
    # inside the compiled initial state, NumPyro's search from the key split
    # off each chain's key gives the values an eager search gives
    key = jax.random.PRNGKey(4)
    keys = key if num_chains is None else jax.random.split(key, num_chains)
    state = DEERMALA(_thirteen).init(keys, 10, None, (Y,), {})
    chain_keys = keys if num_chains is None else list(keys)
    expected = [
        _eager_values(_thirteen, jax.random.split(k)[1], Y)
        for k in ([chain_keys] if num_chains is None else chain_keys)
    ]
    for site in ("mu", "scale", "x"):
        got = np.asarray(state.z[site])
        want = np.stack([np.asarray(e[site]) for e in expected])
        np.testing.assert_array_equal(got.reshape(want.shape), want)


def _nan_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.filterwarnings("ignore:Out-of-support values")
def test_no_valid_initial_values_is_an_error_naming_the_chains_and_sites():
    y = np.array([0.0, np.nan])
    mcmc = MCMC(
        DEERMALA(_nan_model, block_size=8),
        num_warmup=5,
        num_samples=8,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    with pytest.raises(
        RuntimeError,
        match=r"Cannot find valid initial parameters for chain\(s\) \[0, 1\].*"
        r"site\(s\) 'y' \(observed\)",
    ):
        mcmc.run(jax.random.PRNGKey(0), y=y)


def _param_model(y):
    """A ``param`` site set from a random draw: NumPyro keeps the trace's value
    in the potential, which a traced set-up would leave as a tracer."""
    shift = numpyro.param("shift", lambda key: jax.random.normal(key) * 0.0 + 1.0)
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    numpyro.sample("y", dist.Normal(mu + shift, 1.0), obs=y)


def _bounded_model(y):
    """An interval support with array bounds under ``to_event``: NumPyro's
    postprocessing keeps the transform built from the trace's bounds."""
    high = jnp.full((2,), 2.0) * jnp.max(jnp.abs(y))
    theta = numpyro.sample("theta", dist.Uniform(-high, high).to_event(1))
    numpyro.sample("y", dist.Normal(jnp.sum(theta), 1.0), obs=y)


@pytest.mark.parametrize("model", [_param_model, _bounded_model])
def test_set_up_holding_traced_values_is_run_eagerly(model):
    y = np.array([0.5, 1.5])
    setup = initialize(model, jax.random.PRNGKey(0), (y,), {}, init_to_uniform)
    assert not holds_tracer((setup.potential_fn_gen, setup.postprocess_fn))
    values = jax.tree.map(lambda s: jnp.full(s.shape, 0.3, s.dtype), setup.shapes)
    energy = jax.jit(setup.potential_fn_gen(y))(values)
    assert np.isfinite(energy)
    mcmc = MCMC(
        DEERMALA(model, block_size=16),
        num_warmup=50,
        num_samples=32,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(1), y)
    draws = mcmc.get_samples()
    assert all(np.all(np.isfinite(v)) for v in draws.values())
    if model is _bounded_model:
        assert np.all(np.abs(np.asarray(draws["theta"])) < 3.0)


def test_holds_tracer_finds_them_in_closures_partials_and_attributes():
    found = []

    class Box:
        pass

    def traced(x):
        box = Box()
        box.inner = {"a": [x]}
        found.append(lambda: box)
        return x

    jax.eval_shape(traced, 1.0)
    assert holds_tracer(found[0])
    concrete = jnp.ones(3)
    assert not holds_tracer(lambda: (concrete, np.ones(2), Box()))
