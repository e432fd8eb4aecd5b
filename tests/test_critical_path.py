"""The race's gradient counts (``benchmarks/_counts.py``) on cases counted by hand.

Definitions: ``benchmarks/race.py``'s module docstring. Each case writes the
count out from the rule (not from the code under test) and compares.
"""

import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import numpyro
import pytest
from numpyro.infer import NUTS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import _counts  # noqa: E402
import gym_models  # noqa: E402
import race  # noqa: E402

import numpyro_deer  # noqa: E402
from numpyro_deer import DEERHMC, DEERMALA, DEERSolver  # noqa: E402

# tests of benchmarks/, not of the package: a CI job of their own
pytestmark = pytest.mark.harness

TINY = {
    "seed": 0,
    "budget_s": 0.0,  # one segment, then stop
    "x64": False,
    "nuts_warmup": 30,
    "nuts_segment": 10,
    "mala_warmup": 20,
    "block_size": 16,
    "hmc_warmup": 10,
    "hmc_segment": 10,
    "hmc_leapfrog": 3,
}


def test_lockstep_and_per_core_paths():
    steps = np.array([[1, 7, 3], [5, 2, 3]])  # (chains, iterations)
    lock = _counts.from_steps(steps, lockstep=True)
    assert lock.gradients == 21
    assert lock.critical_path_gradients == 5 + 7 + 3
    own = _counts.from_steps(steps, lockstep=False)
    assert own.critical_path_gradients == 11  # chain 0: 1 + 7 + 3
    # over segments, a chain per core keeps its own running total
    counter = _counts.StepsCounter(lockstep=False)
    first = counter.add(steps[:, :1])  # totals (1, 5)
    second = counter.add(steps[:, 1:])  # totals (11, 10)
    assert (first.critical_path_gradients, second.critical_path_gradients) == (5, 6)
    assert first.gradients + second.gradients == 21


def test_deer_block_counts_by_hand():
    # two chains, two blocks of B = 8, MALA (g = 1: a step evaluates 2
    # gradients, carried 1), Hutchinson with one probe, sweep 4 after 3
    # iterations, no Hessian basis
    its = np.array([[5, 2], [3, 4]])
    fronts = np.array([[8, 8], [6, 8]])  # chain 1's first block falls back
    solver = DEERSolver(jacobian="stochastic", sweep=4, sweep_after=3)
    lockstep, own = (
        _counts.deer_blocks(
            its, fronts, block_size=8, dim=3, g=1, solver=solver, lockstep=mode
        )
        for mode in (True, False)
    )

    # path of k iterations: 2 * 2 each, 1 sweep start each, 4 carried steps
    # each from the 4th on; a fallback of n steps 1 + n
    def path(k, n=0):
        return 4 * k + k + 4 * max(k - 3, 0) + (1 + n if n else 0)

    # vectorized chains: the slowest solve of each block, then the longest
    # fallback (block 0: 5 iterations, then chain 1's 2 steps)
    assert lockstep.critical_path_gradients == path(5, 2) + path(4)
    # a chain per core: each chain's own blocks, the longer chain
    assert own.critical_path_gradients == max(path(5) + path(2), path(3, 2) + path(4))
    # all: 2 * (1 + 1) per step and iteration for the 8 steps of the block,
    # 2 segments (8 // 4) per iteration, 2 segments x 4 steps per sweeping
    # iteration, the fallback
    work = sum(8 * 4 * i + 2 * i + 2 * 4 * max(i - 3, 0) for i in its.ravel()) + 3
    assert lockstep.gradients == own.gradients == work
    assert lockstep.scan_levels == 3 * (5 + 4)  # log2(8) levels, slowest chain
    assert own.scan_levels == 3 * max(5 + 2, 3 + 4)


def _mcmc_fields(kernel, chains, warmup, seed=0):
    target = gym_models.get_target("eight_schools")
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=warmup, num_samples=kernel.block_size,
        num_chains=chains, chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    with warnings.catch_warnings():  # blocks that fall back warn
        warnings.simplefilter("ignore", numpyro_deer.DEERConvergenceWarning)
        mcmc.run(
            jax.random.PRNGKey(seed), *target.args, **target.kwargs,
            extra_fields=("newton_iterations", "block.info.front"),
        )  # fmt: skip
    fields = mcmc.get_extra_fields(group_by_chain=True)
    B = kernel.block_size
    return (
        np.asarray(fields["newton_iterations"])[:, ::B],
        np.asarray(fields["block.info.front"])[:, ::B],
    )


def test_deer_fixed_newton_iterations_from_the_extra_fields():
    # one Newton iteration per block: max_iter = max_solves = 1, no sweep,
    # the whitened basis (no Hessian); the front says what the fallback did
    solver = DEERSolver(max_iter=1, max_solves=1, sweep=0, solve_basis="whitened")
    kernel = numpyro_deer.DEERMALA(
        gym_models.get_target("eight_schools").model,
        block_size=16,
        method="deer",
        solver=solver,
    )
    its, fronts = _mcmc_fields(kernel, chains=2, warmup=20)
    assert np.all(its == 1)
    counts = _counts.deer_kernel_blocks(kernel, its, fronts, dim=10)
    # per block: 1 iteration x 2 x 2 on the path, plus 1 + 16 - front
    per_chain = 4 + np.where(fronts < 16, 1 + 16 - fronts, 0)
    assert counts.critical_path_gradients == per_chain.max(0).sum()
    # all: the 16 steps' values and one probe's tangents, 2 gradients each
    assert (
        counts.gradients == (16 * 2 * 2 + np.where(fronts < 16, 17 - fronts, 0)).sum()
    )
    assert counts.scan_levels == 4  # log2(16), one iteration


def test_sequential_mala_counts_every_step():
    row = race.run_one(
        {**TINY, "platform": "cpu", "target": "eight_schools",
         "sampler": "mala_seq", "chains": 2}
    )  # fmt: skip
    assert row["status"] == "ok", row["status"]
    # warmup: 20 steps of the step function (2 gradients) per chain
    assert row["counts_warmup"]["gradients"] == 2 * 20 * 2
    assert row["counts_warmup"]["critical_path_gradients"] == 20 * 2
    last = row["checkpoints"][-1]
    assert row["draws_per_chain"] == 16  # one block
    # then one block: a gradient at its start and one per carried step
    assert last["critical_path_gradients"] == 40 + 1 + 16
    assert last["gradients"] == 80 + 2 * 17
    assert last["scan_levels"] == 0


def test_sequential_hmc_counts_leapfrog_steps():
    row = race.run_one(
        {**TINY, "platform": "cpu", "target": "eight_schools",
         "sampler": "hmc_seq", "chains": 3}
    )  # fmt: skip
    assert row["status"] == "ok", row["status"]
    L = TINY["hmc_leapfrog"]
    assert row["counts_warmup"]["critical_path_gradients"] == 20 * (L + 1)
    last = row["checkpoints"][-1]
    assert last["critical_path_gradients"] == 20 * (L + 1) + 1 + 16 * L
    assert last["gradients"] == 3 * (20 * (L + 1) + 1 + 16 * L)


def test_auto_leapfrog_counts_warmup_and_sampling_apart():
    """``DEERHMC(num_steps="auto")``: warmup's transitions are counted with
    its 4 steps, the blocks' with the count the run's state holds."""
    target = gym_models.get_target("eight_schools")
    hmc, mala = DEERHMC(target.model), DEERMALA(target.model)
    assert _counts.transition_cost(hmc) == _counts.TransitionCost(5, 4)
    assert _counts.transition_cost(hmc, 7) == _counts.TransitionCost(8, 7)
    assert _counts.transition_cost(mala) == _counts.TransitionCost(2, 1)
    # MALA's state holds 1: its cost is HMC's with one step
    assert _counts.transition_cost(mala, 1) == _counts.TransitionCost(2, 1)
    run = SimpleNamespace(last_state=SimpleNamespace(num_steps=np.array([6, 6])))
    assert _counts.run_num_steps(run) == 6


def test_vectorized_nuts_samples_and_counts_the_slowest_chain():
    # "gpu" settings run several chains vectorized (the race's GPU path):
    # NumPyro's HMC.init wraps `sample` in vmap itself, so the sampling loop
    # must not vmap it again
    spec = {**TINY, "platform": "gpu", "target": "eight_schools"}
    row = race.run_one({**spec, "sampler": "nuts_diag", "chains": 3})
    assert row["status"] == "ok", row["status"]
    assert row["draws_per_chain"] == 10
    assert np.isfinite(row["checkpoints"][-1]["err_mean"])
    # the warmup's count is the lockstep sum of NumPyro's own num_steps
    target = gym_models.get_target("eight_schools")
    mcmc = numpyro.infer.MCMC(
        NUTS(target.model), num_warmup=30, num_samples=10, num_chains=3,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    mcmc.warmup(
        jax.random.PRNGKey(0), *target.args, extra_fields=("num_steps",),
        collect_warmup=True, **target.kwargs,
    )  # fmt: skip
    steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    assert steps.shape == (3, 30)
    warm = row["counts_warmup"]
    assert warm["gradients"] == steps.sum()
    assert warm["critical_path_gradients"] == steps.max(0).sum()
    assert warm["critical_path_gradients"] < warm["gradients"]


@pytest.mark.parametrize("dense", [False, True])
def test_nuts_scores_the_chains_it_ran(dense):
    """The tracker's moments are those of the draws NUTS returns: a run of the
    same kernel, seed and settings through ``MCMC.run`` gives the same draws."""
    sampler = "nuts_dense" if dense else "nuts_diag"
    spec = {**TINY, "platform": "cpu", "target": "eight_schools"}
    row = race.run_one({**spec, "sampler": sampler, "chains": 1})
    assert row["status"] == "ok", row["status"]
    target = gym_models.get_target("eight_schools")
    mcmc = numpyro.infer.MCMC(
        NUTS(target.model, dense_mass=dense), num_warmup=30, num_samples=10,
        progress_bar=False,
    )  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), *target.args, **target.kwargs)
    samples = mcmc.get_samples()
    x = np.concatenate([np.reshape(samples[k], (10, -1)) for k in target.truth], axis=1)
    tracker = race.Tracker(target.truth, 0.0, 1e-4)
    expected = tracker.errors(x.sum(0), (x**2).sum(0), 10)
    last = row["checkpoints"][-1]
    np.testing.assert_allclose(
        (last["err_mean"], last["err_second"]), expected, rtol=1e-4
    )
