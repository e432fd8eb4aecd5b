"""DEERHMC through the drivers: the same chain as its sequential method, the
closed-form posterior, the chain methods, and its own arguments.

Everything else (warmup, mass matrix, extra fields, failure policy) is the
base kernel's, tested with DEERMALA; these tests check that the HMC transition
goes through all of it. Tiny sizes, float64 (conftest).
"""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC as StockMCMC

from benchmarks.models import gaussian_mean_model, gaussian_mean_posterior
from numpyro_deer import DEERHMC, DEERMALA, MCMC, DEERSolver
from numpyro_deer.core import HMC

from .helpers import gaussian_data


def _chain(method, jacobian="stochastic"):
    """128 draws of a Gaussian mean, from key 5, with their acceptance."""
    args, kwargs = gaussian_data(0.5)
    solver = DEERSolver(jacobian=jacobian, atol=1e-12, rtol=1e-10)
    kernel = DEERHMC(
        gaussian_mean_model, num_steps=3, block_size=64, method=method, solver=solver
    )
    mcmc = MCMC(kernel, num_warmup=50, num_samples=128, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(5), *args, **kwargs, extra_fields=("accept_prob",))
    accept = float(np.mean(mcmc.get_extra_fields()["accept_prob"]))
    assert 0.5 < accept < 1.0
    return np.asarray(mcmc.get_samples()["mu"])


@pytest.fixture(scope="module")
def sequential_chain():
    """The sequential method's chain (the chain itself), run once."""
    draws = _chain("sequential")
    assert not np.allclose(draws[:-1], draws[1:])  # the chain moves
    return draws


# the full Jacobian's HMC solve against its chain: test_hmc.py (core) and
# test_sharded.py; through the driver it is the stochastic one's path, so the
# default run takes the default Jacobian only
@pytest.mark.parametrize(
    "jacobian", ["stochastic", pytest.param("full", marks=pytest.mark.slow)]
)
def test_deer_and_sequential_methods_give_the_same_chain(sequential_chain, jacobian):
    np.testing.assert_allclose(_chain("deer", jacobian), sequential_chain, atol=1e-8)


def test_short_fixed_trajectories_are_written_out_on_accelerators(
    sequential_chain, monkeypatch
):
    """On an accelerator a fixed count of at most 8 leapfrog steps is written
    out (no loop), and the chain is the looped one's; longer or adapted
    counts keep the loop, as every count does on the CPU."""
    import numpyro_deer.infer.hmc as hmc_module

    if jax.default_backend() == "cpu":
        assert not DEERHMC(gaussian_mean_model, num_steps=3).transition.unroll
    monkeypatch.setattr(hmc_module, "on_cpu", lambda: False)
    assert DEERHMC(gaussian_mean_model, num_steps=8).transition.unroll
    assert not DEERHMC(gaussian_mean_model, num_steps=9).transition.unroll
    assert not DEERHMC(gaussian_mean_model).transition.unroll  # "auto"
    np.testing.assert_allclose(_chain("deer"), sequential_chain, atol=1e-8)


def test_posterior_matches_the_closed_form():
    """2,000 draws of a Gaussian mean (20 observations of 3.0, noise 1, prior
    N(0, 10^2)); tolerances are about 5 Monte Carlo standard errors."""
    args, kwargs = gaussian_data(3.0)
    exact = gaussian_mean_posterior(*args)["mu"]
    kernel = DEERHMC(gaussian_mean_model, block_size=500)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
    mu = np.asarray(mcmc.get_samples()["mu"])
    np.testing.assert_allclose(mu.mean(), exact.mean, atol=5 * exact.std / 30)
    np.testing.assert_allclose(mu.std(), exact.std, rtol=0.15)
    # "auto": warmup's transition takes 4 steps; here the count stays 4
    assert kernel.num_steps == "auto" and kernel.transition == HMC(4, 0.2)
    # the default method is "auto": on the CPU, the sequential scan
    if jax.default_backend() == "cpu":
        assert kernel.method_chosen == "sequential"


def test_default_method_is_auto_like_deermala():
    hmc, mala = DEERHMC(gaussian_mean_model), DEERMALA(gaussian_mean_model)
    assert hmc.method == mala.method == "auto"


# the chain methods are the base kernel's (test_kernel.py, test_reliability.py);
# here the HMC transition goes through stock MCMC with the chains batched, the
# one chain method that changes what the transition is traced with
@pytest.mark.parametrize("chain_method", ["vectorized"])
def test_chain_methods(chain_method):
    args, kwargs = gaussian_data(1.0)
    mcmc = StockMCMC(
        DEERHMC(gaussian_mean_model, num_steps=2, block_size=32, method="deer"),
        num_warmup=40,
        num_samples=64,
        num_chains=2,
        chain_method=chain_method,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.shape == (2, 64)
    assert not np.allclose(draws[0], draws[1])
    np.testing.assert_allclose(np.mean(draws), 1.0, atol=0.3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_steps": 0}, r"num_steps=0\): use an integer >= 1"),
        ({"num_steps": 2.5}, r"num_steps=2.5\): use an integer >= 1"),
        ({"num_steps": "long"}, r"num_steps='long'\): use an integer >= 1 .*'auto'"),
        ({"jitter": 1.0}, r"jitter=1.0\): the step size jitter must be a number in"),
        ({"target_accept_prob": 1.5}, r"target_accept_prob=1.5: use a value"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DEERHMC(gaussian_mean_model, **kwargs)


def standard_normal_200():
    numpyro.sample("x", dist.Normal(0.0, 1.0).expand([200]).to_event(1))


def _auto_run(method, driver, num_chains=2):
    """``num_steps="auto"`` on a 200-dimensional standard normal, 2 vectorized
    chains: the adapted step size is about 0.25, so the quarter period takes
    more than warmup's 4 steps."""
    solver = DEERSolver(atol=1e-12, rtol=1e-10)
    kernel = DEERHMC(standard_normal_200, block_size=32, method=method, solver=solver)
    mcmc = driver(
        kernel, num_warmup=60, num_samples=64, num_chains=num_chains,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    mcmc.run(jax.random.PRNGKey(3), extra_fields=("num_steps",))
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    eps = np.asarray(mcmc.last_state.adapt_state.step_size)
    return np.asarray(mcmc.get_samples(group_by_chain=True)["x"]), steps, eps


@pytest.fixture(scope="module")
def auto_sequential():
    return _auto_run("sequential", MCMC)


def test_auto_num_steps_is_the_quarter_period_of_the_median_step_size(
    auto_sequential,
):
    _, steps, eps = auto_sequential
    expected = int(np.clip(np.ceil((np.pi / 2) / np.median(eps)), 4, 32))
    assert expected > 4  # the count changed at the end of warmup
    np.testing.assert_array_equal(steps, expected)  # every draw, both chains


def test_auto_num_steps_blocks_are_the_sequential_chain(auto_sequential):
    draws, steps, _ = _auto_run("deer", MCMC)
    np.testing.assert_array_equal(steps, auto_sequential[1])
    np.testing.assert_allclose(draws, auto_sequential[0], atol=1e-8)


def test_stock_mcmc_chooses_the_same_count():
    """One chain through stock ``MCMC`` and ``numpyro_deer.MCMC``: the count is
    chosen inside the warmup step, so both drivers give the same draws."""
    stock = _auto_run("sequential", StockMCMC, num_chains=1)
    ours = _auto_run("sequential", MCMC, num_chains=1)
    assert stock[1].min() > 4
    np.testing.assert_array_equal(stock[1], ours[1])
    np.testing.assert_allclose(stock[0], ours[0], atol=1e-12)


def test_auto_num_steps_stays_in_the_post_warmup_state(auto_sequential):
    """``mcmc.warmup`` then ``mcmc.run``: the count chosen at the end of warmup
    is the state's, and the sampling run takes it."""
    kernel = DEERHMC(standard_normal_200, block_size=32, method="sequential")
    mcmc = MCMC(
        kernel, num_warmup=60, num_samples=32, num_chains=2,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    mcmc.warmup(jax.random.PRNGKey(3))
    chosen = np.asarray(mcmc.post_warmup_state.num_steps)
    np.testing.assert_array_equal(chosen, auto_sequential[1][:, 0])
    mcmc.run(jax.random.PRNGKey(4), extra_fields=("num_steps",))
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    np.testing.assert_array_equal(steps, auto_sequential[1][:, :32])
