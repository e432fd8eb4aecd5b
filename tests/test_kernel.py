"""DEERMALA inside stock ``numpyro.infer.MCMC``: the kernel contract.

Compilation dominates the run time here (every ``MCMC`` configuration compiles
the warmup step, a DEER solve and its sequential fallback), so runs are shared
through module-scoped fixtures and kept small.
"""

import inspect
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC as StockMCMC

from benchmarks.models import gaussian_mean_model
from numpyro_deer import (
    DEERMALA,
    AutoJacobian,
    DEERSolver,
    DiagonalJacobian,
    FullJacobian,
    HardGate,
    SigmoidGate,
    StochasticDiagonalJacobian,
)

from .helpers import STOCK_RUN_CONFIG
from .helpers import gaussian_data as _gaussian_data

BLOCK = 64


# vectorized chains through stock MCMC: test_reliability.py's four chains of
# four normals (the same assertions, and a latent of the chains' length)
@pytest.mark.parametrize("chain_method", ["sequential", "parallel"])
def test_chain_methods(chain_method):
    args, kwargs = _gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=32, method="deer")
    mcmc = StockMCMC(
        kernel,
        num_warmup=50,
        num_samples=80,
        num_chains=2,
        chain_method=chain_method,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.shape == (2, 80)
    assert not np.allclose(draws[0], draws[1])
    np.testing.assert_allclose(np.mean(draws), 1.0, atol=0.3)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    assert extra["accept_prob"].shape == (2, 80)


def test_stock_mcmc_shapes_fields_and_posterior(stock_run):
    mcmc, args, _ = stock_run
    samples = mcmc.get_samples()
    config = STOCK_RUN_CONFIG["mcmc"]
    assert samples["mu"].shape == (config["num_samples"] // config["thinning"],)
    extra = mcmc.get_extra_fields()
    assert set(extra) >= {
        "diverging",
        "potential_energy",
        "accept_prob",
        "adapt_state.step_size",
        "newton_iterations",
        "deer_converged",
    }
    # after warmup the step size is fixed and every block converged
    assert np.ptp(np.asarray(extra["adapt_state.step_size"])) == 0
    assert np.all(extra["deer_converged"])
    assert np.all(extra["newton_iterations"] > 0)
    # posterior of mu: N(mean, std) in closed form
    y, sigma = args
    precision = 1 / 10.0**2 + y.shape[0] / sigma**2
    mean, std = float(jnp.sum(y)) / sigma**2 / precision, precision**-0.5
    np.testing.assert_allclose(np.mean(samples["mu"]), mean, atol=3 * std / 5)
    np.testing.assert_allclose(np.std(samples["mu"]), std, rtol=0.3)


def test_acceptance_near_target(stock_run):
    mcmc, _, _ = stock_run
    acc = float(np.mean(mcmc.get_extra_fields()["accept_prob"]))
    assert abs(acc - 0.9) < 0.1


def test_potential_energy_matches_draws(stock_run):
    mcmc, args, kwargs = stock_run
    kernel = mcmc.sampler
    # one latent site of shape (): the flat values are the draws
    potential = kernel.program.potential_flat(args, kwargs)
    pe = jax.vmap(lambda m: potential(m[None]))(mcmc.get_samples()["mu"][:20])
    np.testing.assert_allclose(
        mcmc.get_extra_fields()["potential_energy"][:20], pe, rtol=1e-6
    )


def test_pickle_round_trip(stock_run):
    mcmc, args, kwargs = stock_run
    restored = pickle.loads(pickle.dumps(mcmc))
    np.testing.assert_array_equal(
        restored.get_samples()["mu"], mcmc.get_samples()["mu"]
    )
    assert restored.sampler.program is None  # the run's functions were dropped
    assert int(restored.last_state.i) == int(mcmc.last_state.i)


def test_rerun_on_new_data_uses_new_data():
    """The potential is rebuilt from the arguments given to ``sample``."""
    kernel = DEERMALA(gaussian_mean_model, block_size=BLOCK, method="deer")
    mcmc = StockMCMC(
        kernel,
        num_warmup=100,
        num_samples=100,
        progress_bar=False,
        jit_model_args=True,
    )
    for value in (3.0, -3.0):
        args, kwargs = _gaussian_data(value)
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
        np.testing.assert_allclose(np.mean(mcmc.get_samples()["mu"]), value, atol=0.15)


def test_potential_fn_path_needs_init_params():
    kernel = DEERMALA(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), block_size=32)
    mcmc = StockMCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.raises(ValueError, match="init_params"):
        mcmc.run(jax.random.PRNGKey(0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_size": 0}, "block_size"),
        ({"step_size": -1.0}, "step_size"),
        ({"target_accept_prob": 1.5}, "target_accept_prob"),
        ({"method": "fast"}, "method"),
        ({"dense_mass": [("a",)]}, "dense_mass"),
        ({"adapt_mass_matrix": "hessain"}, "adapt_mass_matrix='hessain'"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DEERMALA(gaussian_mean_model, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"jacobian": "newton"}, "jacobian='newton' is not a Jacobian strategy"),
        ({"gate": "soft"}, "gate='soft' is not a gate"),
        ({"solve_basis": "pca"}, "solve_basis='pca'"),
        ({"sweep": -1}, "sweep=-1"),
        ({"max_iter": 0}, "max_iter=0"),
    ],
)
def test_bad_solver_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DEERSolver(**kwargs)


def test_one_set_of_defaults():
    # the kernel's solver is DEERSolver(), whose strategy owns its settings
    kernel = DEERMALA(gaussian_mean_model, method="deer")
    assert kernel.solver == DEERSolver()
    # the strategy by the state's dimension: full up to D = 2, Hutchinson above
    assert kernel.solver.jacobian == AutoJacobian(max_full_dim=2)
    assert kernel.solver.jacobian_for(2) == FullJacobian(clip=1.0)
    assert kernel.solver.jacobian_for(3) == StochasticDiagonalJacobian(
        num_probes=1, clip=1.0
    )
    assert kernel.solver.gate == HardGate()
    assert (kernel.solver.sweep, kernel.solver.sweep_after) == (8, 20)
    assert (kernel.solver.max_iter, kernel.solver.max_solves) == (100, 3)
    assert kernel.on_failure == "sequential"
    # strings name the strategies with their own defaults (clip 1.0 throughout)
    assert DEERSolver(jacobian="full").jacobian == FullJacobian(clip=1.0)
    assert DEERSolver(jacobian="diag").jacobian == DiagonalJacobian(clip=1.0)
    assert DEERSolver(gate="sigmoid").gate == SigmoidGate(temperature=1.0)


def test_signature_is_small():
    assert len(inspect.signature(DEERMALA).parameters) <= 16


def test_model_and_potential_are_exclusive():
    with pytest.raises(ValueError, match="exactly one"):
        DEERMALA()
