"""What ``numpyro_deer.MCMC`` decides for a run, and what it tells the user.

``method="auto"``, the block size fitted to the run, the warning under stock
``numpyro.infer.MCMC``, the warmup check and the progress bar's chunks.
"""

import threading
import time
import warnings
from concurrent.futures import Future

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC as StockMCMC
from numpyro.infer import init_to_value

from benchmarks.models import BENCHMARK_MODELS, gaussian_mean_model
from numpyro_deer import (
    DEERMALA,
    MCMC,
    SlowDriverWarning,
    WarmupTransitWarning,
)
from numpyro_deer.infer import compile_cache, driver, memory
from numpyro_deer.infer import kernel as kernel_module
from numpyro_deer.infer.method import MethodChoice, fitted_block_size
from numpyro_deer.infer.progress import UPDATE_SECONDS, next_chunk
from numpyro_deer.infer.transit import warmup_transit

from .helpers import compile_log, compiled_now, gaussian_data

LOG = compile_log()


@pytest.mark.parametrize(
    "block_size, steps, fitted",
    [(4096, 1000, 1000), (4096, 10_000, 3334), (64, 200, 50), (64, 128, 64),
     (64, 1, 1), (64, 0, 64)],
)  # fmt: skip
def test_fitted_block_size(block_size, steps, fitted):
    assert fitted_block_size(block_size, steps) == fitted
    if steps:
        blocks = -(-steps // fitted)
        assert fitted <= block_size and 0 <= blocks * fitted - steps < blocks


def test_blocks_fit_the_run_and_leave_nothing_unused():
    """200 steps (100 draws, thinned) in blocks of at most 64: four blocks of
    50, the last one used up."""
    args, kwargs = gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=64, method="sequential")
    mcmc = MCMC(kernel, num_warmup=50, num_samples=200, thinning=2)
    mcmc.progress_bar = False
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    # the argument is kept; the run's blocks are fitted to it
    assert kernel.block_size == 64 and kernel.program.block_size == 50
    assert mcmc.last_state.block.z.shape[0] == 50
    assert int(mcmc.last_state.block.index) == 50  # the last block used up
    assert mcmc.get_samples()["mu"].shape == (100,)


def test_auto_is_sequential_on_a_cpu():
    args, kwargs = gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=32)
    assert kernel.method == "auto"
    # the sizes of the sequential runs below, which reuse this run's programs
    mcmc = MCMC(kernel, num_warmup=50, num_samples=128, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    assert kernel.method_chosen == "sequential"
    assert kernel.method_choice.reason.startswith("CPU")
    assert kernel.method_choice.seconds == {}


@pytest.fixture
def accelerator(monkeypatch):
    """The accelerator's rule for ``method="auto"`` on this machine."""
    monkeypatch.setattr(
        driver, "device_choice", lambda: MethodChoice("deer", "test", {})
    )
    monkeypatch.setattr(kernel_module, "device_method", lambda: "deer")
    return monkeypatch


@pytest.mark.parametrize("progress_bar", [False, True])
def test_auto_measures_both_methods_on_an_accelerator(accelerator, progress_bar):
    """With the accelerator's rule and both programs compiled, the first two
    blocks are timed, one each way, and the faster is kept; the chain is the
    sequential method's."""
    accelerator.setattr(compile_cache, "compile_in_background", compiled_now)
    args, kwargs = gaussian_data(1.0)
    runs = {}
    for method in ("auto", "sequential"):
        kernel = DEERMALA(gaussian_mean_model, block_size=32, method=method)
        mcmc = MCMC(kernel, num_warmup=50, num_samples=128)
        mcmc.progress_bar = progress_bar
        mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
        runs[method] = (kernel, mcmc.get_samples()["mu"])
    kernel = runs["auto"][0]
    seconds = kernel.method_choice.seconds
    assert set(seconds) == {"deer", "sequential"} and kernel.method_choice.final
    assert kernel.method_chosen == min(seconds, key=seconds.get)
    assert "measured per block of 32" in kernel.method_choice.reason
    np.testing.assert_allclose(runs["auto"][1], runs["sequential"][1], rtol=1e-8)


def test_auto_does_not_wait_for_deer_to_compile(accelerator):
    """While DEER's program compiles, ``method="auto"`` samples sequentially;
    a run that ends first keeps a provisional choice, and the next run, with
    the program compiled, measures both, compiling nothing else. The draws
    are the chain either way."""
    held = {}

    def deer_held_back(lowered):
        lowered = dict(lowered)
        futures = compiled_now((k, v) for k, v in lowered.items() if k != "deer")
        if "deer" in lowered:
            held["deer"] = lowered["deer"]
            futures["deer"] = Future()  # never done in this run
        return futures

    # a warmup length of its own: no other test's programs are reused
    settings = dict(num_warmup=70, num_samples=128, progress_bar=False)
    args, kwargs = gaussian_data(1.0)
    accelerator.setattr(compile_cache, "compile_in_background", deer_held_back)
    kernel = DEERMALA(gaussian_mean_model, block_size=32)
    mcmc = MCMC(kernel, **settings)
    mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
    draws = mcmc.get_samples()["mu"]
    choice = kernel.method_choice
    assert "deer" in held and not choice.final
    assert kernel.method_chosen == "sequential" and set(choice.seconds) == {
        "sequential"
    }
    assert "the run ended before deer was compiled" in choice.reason
    assert int(mcmc.last_state.newton_iterations) == 0  # no DEER solve

    accelerator.setattr(compile_cache, "compile_in_background", compiled_now)
    before = LOG.ours()
    MCMC(kernel, **settings).run(jax.random.PRNGKey(2), *args, **kwargs)
    assert kernel.method_choice.final
    assert set(kernel.method_choice.seconds) == {"deer", "sequential"}
    # the first run's warmup loop serves (it does not depend on the method)
    compiled = LOG.ours() - before
    assert not any("warmup_loop" in name for name in compiled), compiled

    reference = MCMC(
        DEERMALA(gaussian_mean_model, block_size=32, method="sequential"), **settings
    )
    reference.run(jax.random.PRNGKey(1), *args, **kwargs)
    np.testing.assert_allclose(draws, reference.get_samples()["mu"], rtol=1e-8)


def test_auto_runs_of_one_block_lower_no_deer_block(accelerator):
    """Runs of one block each (resumed from ``post_warmup_state``) lower no
    DEER program (they could use it only by waiting for its compile): they
    are sequential and keep the provisional choice with its time per block.
    The next run of two blocks lowers DEER, times a block with it (the
    sequential scan's time kept from the first run) and completes the
    measurement. The draws are the sequential chain's."""
    lowered_names = []

    def recorded(lowered):
        lowered = dict(lowered)
        lowered_names.append(set(lowered))
        return compiled_now(lowered.items())

    # a warmup length of its own: no other test's programs are reused
    settings = dict(num_warmup=60, num_samples=32, progress_bar=False)
    args, kwargs = gaussian_data(1.0)
    accelerator.setattr(compile_cache, "compile_in_background", recorded)
    draws = {}
    for method in ("auto", "sequential"):
        kernel = DEERMALA(gaussian_mean_model, block_size=32, method=method)
        mcmc = MCMC(kernel, **settings)
        lowered_names.clear()
        runs = []
        for num_samples in (32, 32, 64):
            mcmc.num_samples = num_samples
            key = jax.random.PRNGKey(1) if not runs else mcmc.last_state.rng_key
            if runs:
                mcmc.post_warmup_state = mcmc.last_state
            mcmc.run(key, *args, **kwargs)
            runs.append(mcmc.get_samples()["mu"])
            if method == "auto" and len(runs) < 3:
                choice = kernel.method_choice
                assert "deer" not in lowered_names[-1]
                assert not choice.final and choice.block_size == 32
                assert set(choice.seconds) == {"sequential"}
                assert int(mcmc.last_state.newton_iterations) == 0
                if len(runs) == 1:
                    sequential_seconds = choice.seconds["sequential"]
        draws[method] = np.concatenate(runs)
        if method == "auto":
            assert "deer" in lowered_names[-1]
            assert kernel.method_choice.final
            assert set(kernel.method_choice.seconds) == {"deer", "sequential"}
            # the first run's time per sequential block, kept
            assert kernel.method_choice.seconds["sequential"] == sequential_seconds
    assert draws["auto"].shape == (128,)
    np.testing.assert_allclose(draws["auto"], draws["sequential"], rtol=1e-6)


class SlowLowered:
    """A stand-in for a lowered program whose compile waits for ``release``."""

    def __init__(self, events):
        self._lowering = object()  # what identifies the computation
        self.release = threading.Event()
        self.events = events

    def compile(self):
        self.events.append("compile started")
        self.release.wait(timeout=60)
        return "compiled"


def test_compiles_start_as_lowered_and_are_not_repeated():
    """Each compile starts as soon as its program is lowered (before the next
    is lowered), and a program still compiling is not compiled again."""
    events = []
    slow = SlowLowered(events)

    def lowered_one_by_one():
        yield "warmup", slow
        time.sleep(0.5)  # the next program's lowering
        events.append("second lowered")
        yield "block", jax.jit(lambda x: x + 1).lower(jnp.ones(3))

    futures = compile_cache.compile_in_background(lowered_one_by_one())
    assert events == ["compile started", "second lowered"]
    again = compile_cache.compile_in_background([("warmup", slow)])
    assert again["warmup"] is futures["warmup"] and not futures["warmup"].done()
    slow.release.set()
    assert futures["warmup"].result() == "compiled"
    assert events.count("compile started") == 1
    np.testing.assert_allclose(futures["block"].result()(jnp.ones(3)), 2.0)


def test_stock_mcmc_warns_once_per_run():
    args, kwargs = gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=16)
    mcmc = StockMCMC(kernel, num_warmup=10, num_samples=32, progress_bar=False)
    with pytest.warns(SlowDriverWarning, match="numpyro_deer.MCMC") as record:
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    assert len(record) == 1
    assert "warnings.simplefilter('ignore', numpyro_deer.SlowDriverWarning)" in str(
        record[0].message
    )
    ours = MCMC(kernel, num_warmup=10, num_samples=32, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowDriverWarning)
        ours.run(jax.random.PRNGKey(0), *args, **kwargs)


def test_warmup_check_on_a_chain_started_far_from_its_mode():
    """Eight schools from ``mu = 150`` (30 prior standard deviations): its
    potential energy falls from about 1,000 to 45 over some 200 MALA steps,
    so after 100 warmup steps the chain is still on its way."""
    bench = BENCHMARK_MODELS["eight_schools"]
    args, kwargs = bench.make_data()
    kernel = DEERMALA(
        bench.model, block_size=32, init_strategy=init_to_value(values={"mu": 150.0})
    )
    mcmc = MCMC(kernel, num_warmup=100, num_samples=32, progress_bar=False)
    with pytest.warns(WarmupTransitWarning, match="Try num_warmup=400") as record:
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    assert "still drifting at the end of warmup" in str(record[0].message)


# one model in the default run (the hierarchical one, the harder for the
# check); the other is the same code path (`-m slow` runs it)
@pytest.mark.parametrize(
    "name",
    ["eight_schools", pytest.param("logistic_regression", marks=pytest.mark.slow)],
)
def test_warmup_check_is_silent_after_the_recommended_warmup(name):
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    kernel = DEERMALA(bench.model, block_size=32)
    mcmc = MCMC(kernel, num_warmup=bench.num_warmup, num_samples=32)
    mcmc.progress_bar = False
    with warnings.catch_warnings():
        warnings.simplefilter("error", WarmupTransitWarning)
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)


def test_warmup_transit_statistic():
    rng = np.random.default_rng(0)
    stationary = rng.normal(size=(4, 400))
    assert warmup_transit(stationary, 400) is None
    falling = stationary + np.linspace(10.0, 0.0, 400)
    message = warmup_transit(falling, 400)
    assert "chains 0, 1, 2, 3 of 4" in message and "num_warmup=1600" in message
    assert warmup_transit(falling[:, :99], 99) is None  # too short to judge


def test_warmup_chunks_aim_at_a_few_seconds():
    assert next_chunk(0, 1000, 0.0, 0) == 10
    # 10 steps took 0.01 s: at most four times as many next
    assert next_chunk(10, 990, 0.01, 10) == 40
    # 1000 steps per second: about UPDATE_SECONDS worth
    assert next_chunk(500, 5000, 0.5, 500) == int(1000 * UPDATE_SECONDS)
    assert next_chunk(900, 7, 0.5, 500) == 7


def test_auto_falls_back_to_sequential_where_deer_does_not_fit(accelerator):
    """A DEER block larger than the device's free memory (the memory check
    raises for it alone): ``method="auto"`` keeps the sequential scan, says
    why, and the run gives the sequential chain; ``method="deer"`` raises."""
    check = memory.check_block_program

    def deer_too_large(kernel, name, compiled, checked):
        if name == "deer":
            raise ValueError("DEERMALA(block_size=32) needs about 9.00 GiB")
        return check(kernel, name, compiled, checked)

    accelerator.setattr(compile_cache, "compile_in_background", compiled_now)
    accelerator.setattr(memory, "check_block_program", deer_too_large)
    settings = dict(num_warmup=50, num_samples=128, progress_bar=False)
    args, kwargs = gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=32)
    mcmc = MCMC(kernel, **settings)
    mcmc.run(jax.random.PRNGKey(1), *args, **kwargs)
    choice = kernel.method_choice
    assert kernel.method_chosen == "sequential" and choice.final
    assert "does not fit" in choice.reason and "9.00 GiB" in choice.reason
    assert set(choice.seconds) == {"sequential"}
    reference = MCMC(
        DEERMALA(gaussian_mean_model, block_size=32, method="sequential"), **settings
    )
    reference.run(jax.random.PRNGKey(1), *args, **kwargs)
    np.testing.assert_allclose(
        mcmc.get_samples()["mu"], reference.get_samples()["mu"], rtol=1e-8
    )
    deer = DEERMALA(gaussian_mean_model, block_size=32, method="deer")
    with pytest.raises(ValueError, match="9.00 GiB"):
        MCMC(deer, **settings).run(jax.random.PRNGKey(1), *args, **kwargs)


@pytest.mark.parametrize("device", ["cpu", "accelerator"])
def test_auto_with_chains_in_pmap_takes_the_device_rule(device, request):
    """Inside ``pmap`` (``chain_method="parallel"``) nothing is timed: the
    default ``method="auto"`` takes the device's rule without looking at the
    (traced) state."""
    if device == "accelerator":
        request.getfixturevalue("accelerator")
    args, kwargs = gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=32)
    mcmc = MCMC(
        kernel,
        num_warmup=40,
        num_samples=64,
        num_chains=2,
        chain_method="parallel",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(5), *args, **kwargs)
    assert mcmc.get_samples(group_by_chain=True)["mu"].shape == (2, 64)
    expected = "sequential" if device == "cpu" else "deer"
    assert kernel.method_chosen == expected
    assert kernel.method_choice.seconds == {}
