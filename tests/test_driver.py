"""``numpyro_deer.MCMC``: the block driver behaves like stock ``MCMC``, only faster."""

import pickle
import warnings

import jax
import numpy as np
import pytest
from numpyro.infer import MCMC as StockMCMC
from numpyro.infer import NUTS

from benchmarks.models import (
    beta_bernoulli,
    beta_bernoulli_posterior,
    dirichlet_categorical,
    dirichlet_categorical_posterior,
    gaussian_mean_model,
    ill_conditioned_gaussian,
    make_beta_bernoulli_data,
    make_dirichlet_categorical_data,
    make_ill_conditioned_gaussian_data,
)
from numpyro_deer import (
    DEERMALA,
    MCMC,
    DEERConvergenceError,
    DEERConvergenceWarning,
    DEERSolver,
)
from numpyro_deer.infer import compile_cache, lowering

from .helpers import STOCK_RUN_CONFIG, compile_log, gaussian_data


def _driver(block_size=64, **mcmc_kwargs):
    kernel = DEERMALA(gaussian_mean_model, block_size=block_size, method="deer")
    options = {"num_warmup": 100, "num_samples": 200, "progress_bar": False}
    options.update(mcmc_kwargs)
    return MCMC(kernel, **options)


def test_same_draws_as_stock_mcmc(stock_run):
    stock, args, kwargs = stock_run
    kernel = DEERMALA(
        gaussian_mean_model, block_size=STOCK_RUN_CONFIG["block_size"], method="deer"
    )
    mcmc = MCMC(kernel, **STOCK_RUN_CONFIG["mcmc"], progress_bar=False)
    mcmc.run(
        jax.random.PRNGKey(0), *args, **kwargs, extra_fields=STOCK_RUN_CONFIG["extra"]
    )
    np.testing.assert_allclose(
        mcmc.get_samples()["mu"], stock.get_samples()["mu"], rtol=1e-10
    )
    ours, theirs = mcmc.get_extra_fields(), stock.get_extra_fields()
    assert set(ours) == set(theirs)
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-10, err_msg=name)
    # atol: the state holds the solve's residual (~1e-15), rounding noise that
    # differs when the data is an argument of the compiled loop, not a constant
    for a, b in zip(
        jax.tree.leaves(mcmc.last_state), jax.tree.leaves(stock.last_state), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("collect_warmup", [True, False])
def test_warmup_draws_are_collected_as_stock_mcmc_collects_them(collect_warmup):
    # the warmup loop postprocesses and collects states only where a warmup
    # step falls in the collection (LoopSettings.collect_warmup)
    args, kwargs = gaussian_data(2.0)

    def warmup(cls):
        kernel = DEERMALA(gaussian_mean_model, block_size=16, method="sequential")
        mcmc = cls(kernel, num_warmup=40, num_samples=8, thinning=3, progress_bar=False)
        mcmc.warmup(
            jax.random.PRNGKey(3), *args, collect_warmup=collect_warmup, **kwargs
        )
        return mcmc

    ours, theirs = warmup(MCMC), warmup(StockMCMC)
    np.testing.assert_allclose(
        ours.last_state.z["mu"], theirs.last_state.z["mu"], rtol=1e-10
    )
    if collect_warmup:
        assert ours.get_samples()["mu"].shape == (13,)
        np.testing.assert_allclose(
            ours.get_samples()["mu"], theirs.get_samples()["mu"], rtol=1e-10
        )


@pytest.mark.parametrize("processes", [1, 2])
def test_warmup_chunks_follow_the_clock_in_one_process_only(monkeypatch, processes):
    # over several processes every process must pass the same loop counters:
    # the warmup's chunks may not depend on its own clock, nor may
    # method="auto" choose from it
    from numpyro_deer.infer import host_run

    monkeypatch.setattr(jax, "process_count", lambda: processes)
    args, kwargs = gaussian_data(2.0)

    def chunks(tick):
        clock = iter(range(0, 10**6, tick))
        monkeypatch.setattr(host_run.time, "perf_counter", lambda: next(clock))
        seen = []
        call = host_run.Programs.__call__

        def spy(self, name, *a):
            if name == "warmup":
                seen.append((int(a[3]), int(a[4])))
            return call(self, name, *a)

        monkeypatch.setattr(host_run.Programs, "__call__", spy)
        kernel = DEERMALA(gaussian_mean_model, block_size=16)
        MCMC(kernel, num_warmup=200, num_samples=16, progress_bar=False).run(
            jax.random.PRNGKey(0), *args, **kwargs
        )
        monkeypatch.setattr(host_run.Programs, "__call__", call)
        return seen

    fast = chunks(1)  # a second per chunk: 4x growth either way
    slow = chunks(1000)  # 1,000 s per chunk: one step per chunk if timed
    assert fast[-1][1] == slow[-1][1] == 200
    assert (fast == slow) == (processes > 1)


@pytest.mark.parametrize("processes", [1, 2])
def test_auto_measures_the_methods_in_one_process_only(monkeypatch, processes):
    from numpyro_deer.infer import driver
    from numpyro_deer.infer.method import MethodChoice

    # an accelerator's rule (DEER, not measured), on the CPU
    rule = MethodChoice("deer", "accelerator: DEER (not measured)", {})
    monkeypatch.setattr(driver, "device_choice", lambda: rule)
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    args, kwargs = gaussian_data(2.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=16)
    MCMC(kernel, num_warmup=20, num_samples=64, progress_bar=False).run(
        jax.random.PRNGKey(0), *args, **kwargs
    )
    assert (kernel.method_choice == rule) == (processes > 1)


@pytest.fixture(scope="module")
def warm_driver():
    args, kwargs = gaussian_data(2.0)
    # 128 draws: two blocks of 64, as the runs of 256 and 8,192 draws below (one
    # compiled block program for all)
    mcmc = _driver(num_samples=128)
    mcmc.warmup(jax.random.PRNGKey(1), *args, **kwargs)
    return mcmc, args, kwargs


def test_warmup_run_continue_without_recompiling(warm_driver):
    mcmc, args, kwargs = warm_driver
    assert int(mcmc.post_warmup_state.i) == 100
    mcmc.run(jax.random.PRNGKey(2), *args, **kwargs)
    first = mcmc.get_samples()["mu"]
    before = compile_log().ours()
    # continue from the last state with its own key: the rest of its block is used
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.last_state.rng_key, *args, **kwargs)
    second = mcmc.get_samples()["mu"]
    assert first.shape == second.shape == (128,)
    assert not np.allclose(first, second)
    assert int(mcmc.last_state.i) == 356
    assert compile_log().ours() == before  # the second run compiled nothing
    np.testing.assert_allclose(np.mean(np.r_[first, second]), 2.0, atol=0.2)


def test_one_chain_flat_draws_are_the_collection(warm_driver, monkeypatch):
    """One chain: the flat draws (``get_samples``) are the collection the block
    loop wrote, equal to NumPyro's chain-grouped draws, without NumPyro's eager
    reshape per collected field."""
    mcmc, args, kwargs = warm_driver
    mcmc.post_warmup_state = mcmc.post_warmup_state or mcmc.last_state
    eager = []
    reshape = jax.numpy.reshape

    def counted(a, *rest, **options):
        if not isinstance(a, jax.core.Tracer):
            eager.append(np.shape(a))
        return reshape(a, *rest, **options)

    monkeypatch.setattr(jax.numpy, "reshape", counted)
    mcmc.run(jax.random.PRNGKey(5), *args, **kwargs, extra_fields=("accept_prob",))
    flat, fields = mcmc.get_samples(), mcmc.get_extra_fields()
    assert eager == []
    grouped = mcmc.get_samples(group_by_chain=True)
    grouped_fields = mcmc.get_extra_fields(group_by_chain=True)
    assert flat["mu"].shape == (128,)
    np.testing.assert_array_equal(flat["mu"], grouped["mu"][0])
    assert set(fields) == set(grouped_fields) and "accept_prob" in fields
    for name, value in fields.items():
        np.testing.assert_array_equal(value, grouped_fields[name][0], err_msg=name)


def test_block_loop_sends_its_counters_once(capfd):
    """A compiled run's host-to-device transfers are the same few whatever
    its number of blocks: the first collected iteration, the step size
    search's flag and the block loop's six counters, each once (none per
    block, none to lower the programs)."""
    args, kwargs = gaussian_data(0.5)
    key = jax.random.PRNGKey(3)
    counts = []
    for blocks in (1, 3):
        mcmc = _driver(block_size=32, num_warmup=0, num_samples=32 * blocks)
        mcmc.run(key, *args, **kwargs)
        capfd.readouterr()
        with jax.transfer_guard_host_to_device("log_explicit"):
            mcmc.run(key, *args, **kwargs)
        counts.append(capfd.readouterr().err.count("host-to-device transfer"))
    assert counts == [8, 8]


def test_continuation_equals_one_long_run(warm_driver):
    """Two runs that continue each other give the draws of one run of both lengths."""
    mcmc, args, kwargs = warm_driver
    start = mcmc.post_warmup_state
    key = start.rng_key
    mcmc.num_samples = 128
    mcmc.post_warmup_state = start
    mcmc.run(key, *args, **kwargs)
    first = mcmc.get_samples()["mu"]
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.last_state.rng_key, *args, **kwargs)
    both = np.r_[first, mcmc.get_samples()["mu"]]
    mcmc.num_samples = 256
    mcmc.post_warmup_state = start
    mcmc.run(key, *args, **kwargs)
    mcmc.num_samples = 128
    np.testing.assert_allclose(mcmc.get_samples()["mu"], both, rtol=1e-10)


# the tests of the warm driver come one after the other: the compile cache
# keeps the most recently used programs, and other tests' would push its out
def test_pickle(warm_driver):
    mcmc, _, _ = warm_driver
    restored = pickle.loads(pickle.dumps(mcmc))
    assert restored.sampler.program is None  # the run's functions were dropped
    np.testing.assert_array_equal(
        restored.post_warmup_state.z["mu"], mcmc.post_warmup_state.z["mu"]
    )


def test_arviz_conversion(warm_driver):
    az = pytest.importorskip("arviz")
    mcmc, args, kwargs = warm_driver
    mcmc.post_warmup_state = mcmc.last_state or mcmc.post_warmup_state
    mcmc.run(jax.random.PRNGKey(7), *args, **kwargs)
    data = az.from_numpyro(mcmc)
    stats = data.sample_stats
    for name in ("acceptance_rate", "step_size", "lp", "diverging"):
        assert name in stats, name
    assert stats["acceptance_rate"].shape == (1, mcmc.num_samples)
    np.testing.assert_allclose(
        np.asarray(data.posterior["mu"]).ravel(), mcmc.get_samples()["mu"]
    )
    # ArviZ 0.23 gives an InferenceData, 1.x a DataTree; both have these columns
    summary = az.summary(data, var_names=["mu"])
    assert {"mean", "sd", "ess_bulk", "r_hat"} <= set(summary.columns)
    assert summary.loc["mu", "mean"] == pytest.approx(2.0, abs=0.3)


def test_normal_posterior_mean_and_std(warm_driver):
    """``mu`` given 20 observations of 2.0 with unit noise and a N(0, 10) prior."""
    mcmc, args, kwargs = warm_driver
    # 8,192 draws as 64 runs of 128 that continue each other (one long run's
    # draws: test_continuation_equals_one_long_run), through the compiled
    # programs of the module's other runs of 128 draws
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(jax.random.PRNGKey(8), *args, **kwargs)
    runs = [mcmc.get_samples()["mu"]]
    while len(runs) < 64:
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.run(mcmc.last_state.rng_key, *args, **kwargs)
        runs.append(mcmc.get_samples()["mu"])
    draws = np.concatenate(runs)
    assert draws.shape == (8192,)
    precision = 1 / 10.0**2 + 20
    np.testing.assert_allclose(np.mean(draws), 40 / precision, rtol=0.07)
    np.testing.assert_allclose(np.std(draws), precision**-0.5, rtol=0.07)


def test_progress_bar_gives_the_same_draws(monkeypatch):
    """The same draws with the bar and without; without it the blocks' postfix
    (values fetched from the device) is not computed."""
    # the stock comparison's settings (thinning 3, blocks of 64): its compiled
    # programs serve both runs
    from numpyro_deer.infer import host_run

    postfixes = []
    block_postfix = host_run.block_postfix
    monkeypatch.setattr(
        host_run,
        "block_postfix",
        lambda *a: postfixes.append(a[1]) or block_postfix(*a),
    )
    args, kwargs = gaussian_data(1.0)
    draws, counts = [], []
    for bar in (False, True):
        mcmc = _driver(STOCK_RUN_CONFIG["block_size"], **STOCK_RUN_CONFIG["mcmc"])
        mcmc.progress_bar = bar  # MCMC turns it off when CI is set
        mcmc.run(
            jax.random.PRNGKey(3),
            *args,
            **kwargs,
            extra_fields=STOCK_RUN_CONFIG["extra"],
        )
        draws.append(mcmc.get_samples()["mu"])
        counts.append(len(postfixes))
    assert draws[0].shape == (128,)
    np.testing.assert_allclose(draws[0], draws[1], rtol=1e-10)
    assert counts[0] == 0 and counts[1] >= 1  # a postfix per block with the bar


@pytest.mark.parametrize("jit_model_args", [False, True])
def test_rerun_on_new_data(jit_model_args):
    # the stock comparison's settings: without jit_model_args its compiled
    # programs serve these runs (the data are arguments of the programs)
    mcmc = _driver(
        STOCK_RUN_CONFIG["block_size"],
        **STOCK_RUN_CONFIG["mcmc"],
        jit_model_args=jit_model_args,
    )
    for value in (3.0, -3.0):
        args, kwargs = gaussian_data(value)
        mcmc.run(
            jax.random.PRNGKey(0),
            *args,
            **kwargs,
            extra_fields=STOCK_RUN_CONFIG["extra"],
        )
        np.testing.assert_allclose(np.mean(mcmc.get_samples()["mu"]), value, atol=0.1)


# vectorized chains through this driver: test_reliability.py's four chains of
# four normals (the same assertions) and the vectorized sweep test below
@pytest.mark.parametrize("chain_method", ["parallel"])
def test_chain_methods(chain_method):
    args, kwargs = gaussian_data(-1.0)
    mcmc = _driver(
        block_size=32, num_warmup=50, num_chains=3, chain_method=chain_method
    )
    mcmc.run(jax.random.PRNGKey(4), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.shape == (3, 200)
    assert not np.allclose(draws[0], draws[1])
    np.testing.assert_allclose(np.mean(draws), -1.0, atol=0.3)
    stats = mcmc.get_extra_fields(group_by_chain=True)
    assert stats["potential_energy"].shape == (3, 200)


def test_parallel_chains_with_the_packages_compiler_options(monkeypatch):
    """Under NumPyro's ``pmap`` (``chain_method="parallel"``) the programs the
    package jits with compiler options are part of the chains' program and
    run without them: JAX takes options on a top-level ``jax.jit`` only. (The
    tests' own ``XLA_FLAGS`` switch the package's options off; here they are
    on, as on a user's CPU or GPU.)"""
    options = {lowering.OPT_LEVEL: 0}
    monkeypatch.setattr(lowering, "compiler_options", lambda briefly=False: options)
    compile_cache.clear()  # functions jitted without options by other tests
    try:
        args, kwargs = gaussian_data(-1.0)
        mcmc = _driver(
            block_size=16, num_warmup=20, num_samples=32, num_chains=2,
            chain_method="parallel",
        )  # fmt: skip
        mcmc.run(jax.random.PRNGKey(4), *args, **kwargs)
    finally:
        compile_cache.clear()
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.shape == (2, 32) and np.all(np.isfinite(draws))
    assert not np.allclose(draws[0], draws[1])


def test_hessian_basis_gives_the_same_chain_in_fewer_iterations():
    # On a correlated Gaussian the step Jacobian I - eps H is exactly diagonal
    # in the eigenbasis of H, so the diagonal estimate is exact there: the
    # chain must not change and the solve must need far fewer iterations. With
    # a diagonal mass matrix: the Hessian one would whiten H to a multiple of
    # the identity, making the two bases the same.
    args, kwargs = make_ill_conditioned_gaussian_data(dim=6, condition_number=100.0)
    runs = {}
    for method, basis in (
        ("sequential", "whitened"),
        ("deer", "whitened"),
        ("deer", "hessian"),
    ):
        kernel = DEERMALA(
            ill_conditioned_gaussian,
            block_size=128,
            method=method,
            adapt_mass_matrix=True,
            solver=DEERSolver(solve_basis=basis, atol=1e-12, rtol=1e-10),
        )
        mcmc = MCMC(kernel, num_warmup=100, num_samples=512, progress_bar=False)
        mcmc.run(
            jax.random.PRNGKey(2),
            *args,
            **kwargs,
            extra_fields=("newton_iterations", "deer_converged"),
        )
        extra = mcmc.get_extra_fields()
        runs[method, basis] = (
            mcmc.get_samples()["x"],
            np.asarray(extra["newton_iterations"]),
            np.asarray(extra["deer_converged"]),
        )
    reference = runs["sequential", "whitened"][0]
    for key in (("deer", "whitened"), ("deer", "hessian")):
        np.testing.assert_allclose(runs[key][0], reference, atol=1e-8)
        assert np.all(runs[key][2]), key
    whitened = runs["deer", "whitened"][1].mean()
    hessian = runs["deer", "hessian"][1].mean()
    assert hessian < 0.5 * whitened, (hessian, whitened)


# 50 warmup steps and 128 draws in blocks of 64 from key 5, data 0.5: the
# sequential chain that the DEER runs below are compared with
SEQUENTIAL_RUN = {"num_warmup": 50, "num_samples": 128, "progress_bar": False}
# the fields that the runs of these settings collect: the collected fields are
# part of the warmup programs' compile key, so all of them share one warmup
# (the tests of these settings come one after the other, for the compile cache)
SEQUENTIAL_FIELDS = ("deer_converged",)


@pytest.fixture(scope="module")
def sequential_chain():
    """The draws of the sequential scan (the chain itself), run once."""
    args, kwargs = gaussian_data(0.5)
    reference = MCMC(
        DEERMALA(gaussian_mean_model, block_size=64, method="sequential"),
        **SEQUENTIAL_RUN,
    )
    reference.run(
        jax.random.PRNGKey(5), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS
    )
    return np.asarray(reference.get_samples()["mu"])


# the solver's settings change the work, not the chain; the full Jacobian
# (spectral-norm clipped by default) solves the chain in test_newton.py and
# test_hmc.py, and the kernel's block in test_mesh.py: through the driver it
# takes the stochastic one's path, so the default run leaves it out
@pytest.mark.parametrize(
    ("jacobian", "sweep"),
    [
        ("stochastic", 0),
        pytest.param("full", 0, marks=pytest.mark.slow),
        ("stochastic", 4),  # sequential segments first
    ],
)
def test_deer_and_sequential_methods_give_the_same_chain(
    sequential_chain, jacobian, sweep
):
    args, kwargs = gaussian_data(0.5)
    solver = DEERSolver(jacobian=jacobian, sweep=sweep, atol=1e-12, rtol=1e-10)
    kernel = DEERMALA(gaussian_mean_model, block_size=64, method="deer", solver=solver)
    mcmc = MCMC(kernel, **SEQUENTIAL_RUN)
    mcmc.run(jax.random.PRNGKey(5), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS)
    draws = mcmc.get_samples()["mu"]
    np.testing.assert_allclose(draws, sequential_chain, atol=1e-8)


def test_vectorized_chains_with_the_sweep_are_the_sequential_chains(sequential_chain):
    # chains solved together hold the sweep back by a traced step count; the
    # draws are each chain's sequential MALA chain: the sequential method's
    # chains one after the other, through the module's sequential chain's
    # compiled programs
    args, kwargs = gaussian_data(0.5)
    reference = MCMC(
        DEERMALA(gaussian_mean_model, block_size=64, method="sequential"),
        num_chains=2,
        chain_method="sequential",
        **SEQUENTIAL_RUN,
    )
    reference.run(
        jax.random.PRNGKey(6), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS
    )
    solver = DEERSolver(sweep=4, sweep_after=1, atol=1e-12, rtol=1e-10)
    kernel = DEERMALA(gaussian_mean_model, block_size=64, method="deer", solver=solver)
    mcmc = MCMC(
        kernel,
        num_warmup=50,
        num_samples=128,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(6), *args, **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.shape == (2, 128)
    assert not np.allclose(draws[0], draws[1])
    np.testing.assert_allclose(
        draws, reference.get_samples(group_by_chain=True)["mu"], atol=1e-8
    )


def test_unconverged_blocks_fall_back_and_warn(sequential_chain):
    args, kwargs = gaussian_data(0.5)
    solver = DEERSolver(max_iter=2, max_solves=1)
    kernel = DEERMALA(gaussian_mean_model, block_size=64, solver=solver, method="deer")
    mcmc = MCMC(kernel, num_warmup=50, num_samples=128, progress_bar=False)
    with pytest.warns(DEERConvergenceWarning, match="2 of 2 blocks"):
        mcmc.run(jax.random.PRNGKey(5), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS)
    assert not np.any(mcmc.get_extra_fields()["deer_converged"])
    # the states before each solve's front are DEER's (certified to the float64
    # tolerance), the rest were computed sequentially from the front
    np.testing.assert_allclose(mcmc.get_samples()["mu"], sequential_chain, atol=1e-8)
    # what the warning says to do to make it an error works
    with warnings.catch_warnings():
        warnings.simplefilter("error", DEERConvergenceWarning)
        with pytest.raises(
            DEERConvergenceWarning, match="num_warmup.*sweep=16.*simplefilter"
        ):
            # the same fields: the first run's compiled programs serve
            mcmc.run(
                jax.random.PRNGKey(6), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS
            )


def test_on_failure_warn_keeps_the_iterate_and_raise_stops(sequential_chain):
    args, kwargs = gaussian_data(0.5)
    solver = DEERSolver(max_iter=1, max_solves=1)
    chain = sequential_chain

    kernel = DEERMALA(
        gaussian_mean_model,
        block_size=64,
        solver=solver,
        on_failure="warn",
        method="deer",
    )
    mcmc = MCMC(kernel, num_warmup=50, num_samples=128, progress_bar=False)
    with pytest.warns(DEERConvergenceWarning, match="iteration limit.*NOT the chain"):
        mcmc.run(jax.random.PRNGKey(5), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS)
    draws = np.asarray(mcmc.get_samples()["mu"])
    # one iteration makes the first step of the block exact; the rest of the
    # block is the solve's iterate, not the chain (nor is the next block, which
    # starts from its last state)
    np.testing.assert_allclose(draws[0], chain[0], atol=1e-8)
    assert np.max(np.abs(draws - chain)) > 1e-6

    kernel = DEERMALA(
        gaussian_mean_model,
        block_size=64,
        solver=solver,
        on_failure="raise",
        method="deer",
    )
    mcmc = MCMC(kernel, num_warmup=50, num_samples=128, progress_bar=False)
    with pytest.raises(DEERConvergenceError, match="iteration limit"):
        mcmc.run(jax.random.PRNGKey(5), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS)
    # under stock MCMC the error comes through JAX's runtime error
    stock = StockMCMC(kernel, num_warmup=50, num_samples=128, progress_bar=False)
    with pytest.raises(RuntimeError, match="DEERConvergenceError.*iteration limit"):
        stock.run(jax.random.PRNGKey(5), *args, **kwargs)


def test_block_memory_is_checked_against_the_device(monkeypatch):
    """A block that needs more than the device has free fails before it runs."""
    from numpyro_deer.infer import memory as _memory

    with pytest.raises(ValueError, match="block_size=2 or smaller"):
        _memory.check_block_memory(10 * 2**30, 4 * 2**30, 8)
    _memory.check_block_memory(2**30, 4 * 2**30, 8)  # fits: no error
    _memory.check_block_memory(2**30, None, 8)  # device without statistics

    # the buffer of 64 draws (64 x (1 + 4) float64 = 2,560 bytes) fits in 4 KiB,
    # the compiled block step does not: the driver's check raises
    monkeypatch.setattr(_memory, "free_device_bytes", lambda device=None: 4096)
    args, kwargs = gaussian_data(1.0)
    # the sequential chain's kernel and sizes: its compiled programs serve this
    # run (on the CPU they were not checked, the CPU reporting no free memory),
    # and its block program's memory is checked now
    kernel = DEERMALA(gaussian_mean_model, block_size=64, method="sequential")
    mcmc = MCMC(kernel, **SEQUENTIAL_RUN)
    with pytest.raises(
        ValueError, match=r"DEERMALA\(block_size=64\) needs about .* per block"
    ):
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs, extra_fields=SEQUENTIAL_FIELDS)


# one case per code path in the default run: the simplex (a transform that
# changes the dimension) through the driver; the interval of Beta-Bernoulli
# is the same path, a program set of its own (`-m slow` runs it)
@pytest.mark.parametrize(
    ("model", "make_data", "posterior", "atol"),
    [
        pytest.param(
            beta_bernoulli,
            make_beta_bernoulli_data,
            beta_bernoulli_posterior,
            0.05,
            marks=pytest.mark.slow,
            id="beta_bernoulli",
        ),
        pytest.param(
            dirichlet_categorical,
            make_dirichlet_categorical_data,
            dirichlet_categorical_posterior,
            0.02,
            id="dirichlet_categorical",
        ),
    ],
)
def test_closed_form_posteriors(model, make_data, posterior, atol):
    """Beta-Bernoulli (constrained support) and Dirichlet-categorical (simplex)."""
    args, kwargs = make_data()
    mcmc = MCMC(
        DEERMALA(model, block_size=512, method="deer"),
        num_warmup=300,
        num_samples=1024,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    acc = float(np.mean(mcmc.get_extra_fields()["accept_prob"]))
    assert abs(acc - 0.9) < 0.1, model.__name__
    for site, moments in posterior(*args, **kwargs).items():
        draws = mcmc.get_samples()[site]
        np.testing.assert_allclose(
            np.mean(draws, 0), moments.mean, atol=atol, err_msg=site
        )


def test_non_block_kernels_run_as_in_numpyro():
    args, kwargs = gaussian_data(1.0)
    ours = MCMC(NUTS(gaussian_mean_model), num_warmup=50, num_samples=50)
    theirs = StockMCMC(NUTS(gaussian_mean_model), num_warmup=50, num_samples=50)
    for mcmc in (ours, theirs):
        mcmc.progress_bar = False
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    np.testing.assert_array_equal(ours.get_samples()["mu"], theirs.get_samples()["mu"])


@pytest.mark.parametrize("chain_method", ["sequential", "vectorized"])
def test_block_buffer_is_checked_before_init_allocates_it(monkeypatch, chain_method):
    """A buffer of draws larger than the free memory fails in ``init``, by name."""
    from numpyro_deer.infer import memory as _memory

    def no_buffer(*args, **kwargs):
        raise AssertionError("the buffer was allocated before the memory check")

    monkeypatch.setattr(_memory, "free_device_bytes", lambda device=None: 2048)
    monkeypatch.setattr("numpyro_deer.infer.initial.empty_block", no_buffer)
    args, kwargs = gaussian_data(1.0)
    mcmc = _driver(
        num_warmup=10, num_samples=64, num_chains=2, chain_method=chain_method
    )
    chains = 2 if chain_method == "vectorized" else 1
    with pytest.raises(
        ValueError,
        match=rf"block_size=64\) needs about .* for the buffer of its draws alone "
        rf"\({chains} x 64 x 1 values\).*Set block_size=\d+ or smaller",
    ):
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
