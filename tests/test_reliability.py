"""Regressions: silent wrong posteriors, repeated draws, hangs and late errors."""

import math
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC as StockMCMC

from benchmarks.models import gaussian_mean_model
from numpyro_deer import (
    DEERMALA,
    MCMC,
    DEERConvergenceWarning,
    DEERSolver,
    StochasticDiagonalJacobian,
    UnsupportedModelError,
)

from .helpers import compile_log, gaussian_data


def four_normals():
    numpyro.sample("x", dist.Normal(jnp.zeros(4), 1.0).to_event(1))


def location(y=None, z=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    if y is not None:
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    if z is not None:
        numpyro.sample("z", dist.Normal(-mu, 1.0), obs=z)


# ------------------------------------------- 1: a latent of length num_chains
@pytest.mark.parametrize("driver", [MCMC, StockMCMC])
def test_vectorized_chains_with_latent_of_num_chains_length(driver):
    kernel = DEERMALA(four_normals, block_size=32, method="deer")
    mcmc = driver(
        kernel,
        num_warmup=100,
        num_samples=300,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0))
    x = mcmc.get_samples(group_by_chain=True)["x"]
    assert x.shape == (4, 300, 4)
    assert not np.allclose(x[0], x[1])  # four chains, not one repeated
    stats = mcmc.get_extra_fields(group_by_chain=True)
    assert stats["potential_energy"].shape == (4, 300)
    # mean and sd of 1200 draws of a unit normal per coordinate: within 0.25
    np.testing.assert_allclose(np.mean(x.reshape(-1, 4), 0), 0.0, atol=0.25)
    np.testing.assert_allclose(np.std(x.reshape(-1, 4), 0), 1.0, atol=0.25)


# ------------------------------------------------- 2: data refilled in place
def test_data_refilled_in_place_is_read_again():
    data = np.zeros(20)
    # 192 draws: six blocks of 32, which both drivers keep (numpyro_deer.MCMC
    # fits the block size to the run, stock MCMC cannot)
    kernel = DEERMALA(location, block_size=32, method="deer")
    mcmc = MCMC(kernel, num_warmup=60, num_samples=192, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), y=data)
    first = float(np.mean(mcmc.get_samples()["mu"]))
    data[:] = 10.0
    before = compile_log().ours()
    mcmc.run(jax.random.PRNGKey(0), y=data)
    # new data of the same shape reuses the compiled programs
    assert compile_log().ours() == before
    ours = mcmc.get_samples()["mu"]
    stock = StockMCMC(
        DEERMALA(location, block_size=32, method="deer"),
        num_warmup=60,
        num_samples=192,
        progress_bar=False,
    )
    stock.run(jax.random.PRNGKey(0), y=data)
    # posterior mean 10 * 20 / (20 + 1/100), sd 0.22
    assert abs(first) < 0.2
    assert abs(float(np.mean(ours)) - 9.995) < 0.2
    np.testing.assert_allclose(ours, stock.get_samples()["mu"], rtol=1e-8)
    # the same buffer as another keyword is another model
    mcmc.run(jax.random.PRNGKey(0), z=data)
    assert abs(float(np.mean(mcmc.get_samples()["mu"])) + 9.995) < 0.2


# ---------------------------- 3: post_warmup_state from another block size
@pytest.mark.parametrize("sizes", [(32, 64), (64, 32)])
def test_post_warmup_state_from_another_block_size(sizes):
    args, kwargs = gaussian_data(2.0)
    options = {"num_warmup": 60, "num_samples": 150, "progress_bar": False}
    warm = MCMC(
        DEERMALA(gaussian_mean_model, block_size=sizes[0], method="deer"), **options
    )
    warm.warmup(jax.random.PRNGKey(3), *args, **kwargs)
    state = warm.post_warmup_state
    other = MCMC(
        DEERMALA(gaussian_mean_model, block_size=sizes[1], method="deer"), **options
    )
    other.post_warmup_state = state
    other.run(state.rng_key, *args, **kwargs)
    warm.run(state.rng_key, *args, **kwargs)
    mu = other.get_samples()["mu"]
    # the buffer's own block size: the chain the warmed-up kernel continues
    np.testing.assert_allclose(mu, warm.get_samples()["mu"], rtol=1e-10)
    assert len(np.unique(mu)) > 50  # no draw repeated block after block


# ------------------------------------------------- the loop's progress guard
def test_block_loop_without_progress_raises(monkeypatch):
    import numpyro_deer.infer.loops as loops

    monkeypatch.setattr(loops, "max_block_steps", lambda total, size: 1)
    args, kwargs = gaussian_data(2.0)
    # the host loop is guarded: the settings of the runs above (block_size=32),
    # whose compiled programs serve this run
    mcmc = MCMC(
        DEERMALA(gaussian_mean_model, block_size=32, method="deer"),
        num_warmup=60,
        num_samples=150,
        progress_bar=False,
    )
    with pytest.raises(RuntimeError, match="block loop stopped after 1 iter"):
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)


# --------------------------- 4: vectorized chains + Hessian mass, no hang
HANG_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
    from numpyro_deer import DEERMALA, MCMC

    def model():
        numpyro.sample("x", dist.Normal(jnp.zeros(64), 1.0).to_event(1))

    kernel = DEERMALA(model, block_size=16, adapt_mass_matrix="hessian", method="deer")
    mcmc = MCMC(kernel, num_warmup=60, num_samples=16, num_chains=4,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    print("finished", mcmc.get_samples()["x"].shape)
    """
)


def test_vectorized_hessian_warmup_does_not_hang():
    result = subprocess.run(
        [sys.executable, "-c", HANG_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,  # the watchdog; the fixed run takes well under a minute
        env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "finished (64, 64)" in result.stdout


# -------------------------------------- 5: non-convergence always surfaces
def _unconverged_kernel():
    solver = DEERSolver(max_iter=1, max_solves=1)
    return DEERMALA(gaussian_mean_model, block_size=32, solver=solver, method="deer")


def test_parallel_chains_warn_about_unconverged_blocks():
    args, kwargs = gaussian_data(2.0)
    mcmc = MCMC(
        _unconverged_kernel(),
        num_warmup=30,
        num_samples=64,
        num_chains=2,
        chain_method="parallel",
        progress_bar=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", DEERConvergenceWarning)
        with pytest.raises(DEERConvergenceWarning, match="did not converge on"):
            mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)


def test_stock_mcmc_warns_about_unconverged_blocks():
    args, kwargs = gaussian_data(2.0)
    mcmc = StockMCMC(
        _unconverged_kernel(), num_warmup=30, num_samples=64, progress_bar=False
    )
    with pytest.warns(DEERConvergenceWarning, match="did not converge on"):
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    # made an error, it stops the run (raised from the compiled sampler's
    # host callback, so JAX wraps it)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DEERConvergenceWarning)
        with pytest.raises(Exception, match="DEERConvergenceWarning"):
            mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)


# -------------------------------------------------------- 6: tolerances
@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"atol": 1.0, "rtol": 1.0}, "atol"),
        ({"rtol": 1.0}, "rtol"),
        ({"atol": math.inf}, "atol"),
        ({"rtol": math.nan}, "rtol"),
    ],
)
def test_tolerances_that_cannot_certify_a_step_are_rejected(options, name):
    with pytest.raises(ValueError, match=rf"{name}=.*use a number in \[0, 0.01\]"):
        DEERSolver(**options)


# ------------------------------------------------- 7: clear, early errors
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"block_size": True}, "block_size=True: use an integer"),
        ({"step_size": math.inf}, "step_size=inf: use a finite positive"),
        ({"adapt_step_size": "no"}, "adapt_step_size='no': use True or False"),
        ({"solver": {"sweep": 16}}, "solver=.*pass a DEERSolver"),
        ({"on_failure": "ignore"}, "on_failure='ignore': use 'sequential'"),
    ],
)
def test_bad_options_are_rejected_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        DEERMALA(gaussian_mean_model, **options)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: DEERSolver(jacobian=None), "jacobian=None is not a Jacobian strat"),
        (lambda: DEERSolver(jacobian=5), "jacobian=5 is not a Jacobian strategy"),
        (lambda: DEERSolver(gate=None), "gate=None is not a gate treatment: use"),
        (lambda: DEERSolver(gate=5), "gate=5 is not a gate treatment"),
        (
            lambda: StochasticDiagonalJacobian(clip=math.inf),
            r"clip=inf\): use a finite positive number, or None",
        ),
    ],
)
def test_bad_solver_settings_are_rejected_at_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_numpy_integer_block_size_is_accepted():
    assert (
        DEERMALA(
            gaussian_mean_model, block_size=np.int64(128), method="deer"
        ).block_size
        == 128
    )


def test_model_without_latent_sites():
    def observed_only(y):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    mcmc = MCMC(DEERMALA(observed_only, method="deer"), num_warmup=5, num_samples=5)
    with pytest.raises(UnsupportedModelError, match="no latent sample sites"):
        mcmc.run(jax.random.PRNGKey(0), jnp.zeros(3))


def test_int_of_a_model_argument_under_jit_model_args():
    def sized(n):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=jnp.zeros(int(n)))

    mcmc = MCMC(
        DEERMALA(sized, block_size=16, method="deer"),
        num_warmup=5,
        num_samples=16,
        jit_model_args=True,
        progress_bar=False,
    )
    with pytest.raises(UnsupportedModelError, match="jit_model_args=True"):
        mcmc.run(jax.random.PRNGKey(0), 3)


@pytest.mark.filterwarnings("ignore:Out-of-support values")
def test_nan_in_the_data_names_the_site():
    data = np.zeros(20)
    data[2] = np.nan
    # the settings and shapes of test_data_refilled_in_place_is_read_again:
    # the programs compiled beside the initial state are its
    mcmc = MCMC(
        DEERMALA(location, block_size=32, method="deer"),
        num_warmup=60,
        num_samples=192,
        progress_bar=False,
    )
    with pytest.raises(RuntimeError, match=r"not finite .* site\(s\) 'y' \(observed\)"):
        mcmc.run(jax.random.PRNGKey(0), y=data)


def test_integer_init_params_are_taken_as_floats():
    # the settings and shapes of test_data_refilled_in_place_is_read_again
    mcmc = MCMC(
        DEERMALA(location, block_size=32, method="deer"),
        num_warmup=60,
        num_samples=192,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), y=jnp.ones(20), init_params={"mu": jnp.array(1)})
    assert jnp.issubdtype(mcmc.get_samples()["mu"].dtype, jnp.floating)


def test_hessian_window_ends_agree_on_both_paths():
    """Vectorized chains take the Hessian window end alike on both paths:
    numpyro_deer.MCMC's window-end program between warmup loops, and NumPyro's
    own loop with the end inside the step (one cond for all chains)."""

    def run(driver):
        # the blocks do not matter here: sequential, and few
        kernel = DEERMALA(
            four_normals,
            block_size=16,
            adapt_mass_matrix="hessian",
            method="sequential",
        )
        mcmc = driver(
            kernel,
            num_warmup=60,
            num_samples=16,
            num_chains=2,
            chain_method="vectorized",
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(4))
        return mcmc.get_samples()["x"]

    ours = run(MCMC)
    np.testing.assert_allclose(run(StockMCMC), ours, rtol=1e-7, atol=1e-9)
