"""Vectorized chains whose block does not fit the device: solved in groups.

The device's free memory is faked (``memory.free_device_bytes``) and the CPU
takes the accelerator's paths (``vmap`` of the chains, the DEER refill with
its stragglers set apart, in groups of chains when grouped), so the
driver's memory plan runs on the CPU: it compiles the block in groups of
chains, keeps the largest group that fits, warns, and gives the draws of the
block of all chains at once; where one chain alone does not fit it raises.
"""

import re
import warnings
from concurrent.futures import Future
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from benchmarks.models import gaussian_mean_model
from numpyro_deer import DEERMALA, MCMC
from numpyro_deer.infer import chains, compile_cache, driver, host_run, memory, program
from numpyro_deer.infer import kernel as kernel_module
from numpyro_deer.infer.method import MethodChoice

from .helpers import compile_log, compiled_now, gaussian_data

CHAINS = 7  # groups of 3 leave a remainder: 3 groups of 3, two slots repeated


def _run(key=3, kernel=None):
    args, kwargs = gaussian_data(0.5)
    if kernel is None:
        kernel = DEERMALA(gaussian_mean_model, block_size=32, method="deer")
    mcmc = MCMC(
        kernel,
        num_warmup=20,
        num_samples=64,
        num_chains=CHAINS,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(key), *args, **kwargs)
    return mcmc.get_samples(group_by_chain=True)["mu"]


@pytest.fixture
def accelerator_chains(monkeypatch):
    """The chains ``vmap``-ped as on an accelerator; every compiled block
    program's bytes recorded as the driver measures them."""
    monkeypatch.setattr(chains, "on_cpu", lambda: False)
    # and the DEER refill its accelerator path (stragglers set apart)
    monkeypatch.setattr(program, "on_cpu", lambda: False)
    measured = []
    compiled_bytes = memory.compiled_bytes

    def record(compiled):
        measured.append(compiled_bytes(compiled))
        return measured[-1]

    monkeypatch.setattr(memory, "compiled_bytes", record)
    return measured


def _fake_free(monkeypatch, free, window_end=False):
    """``free`` bytes on the device; unless ``window_end``, for the blocks
    alone (the Hessian mass matrix's window end, the other program planned
    in groups, is left out: a budget a block of one chain fits need not fit it)."""
    monkeypatch.setattr(memory, "free_device_bytes", lambda device=None: free)
    if not window_end:
        monkeypatch.setattr(host_run, "_PLANNED_STAGES", frozenset())


def test_chains_that_do_not_fit_are_solved_in_groups(accelerator_chains, monkeypatch):
    compile_log()  # listening from the first compile on
    measured = accelerator_chains
    whole = _run()  # the CPU reports no free memory: nothing checked
    assert measured == []
    everything = _whole_block_bytes()
    measured.clear()

    budget = int(0.6 * everything)
    _fake_free(monkeypatch, budget)
    with pytest.warns(UserWarning, match=r"in \d+ groups of \d+ chains") as record:
        grouped = _run()
    message = next(
        str(w.message) for w in record if "vectorized chains" in str(w.message)
    )
    assert f"all {CHAINS} vectorized chains" in message and "DEERMALA" in message
    groups, size = map(int, re.search(r"in (\d+) groups of (\d+)", message).groups())
    assert 1 <= size < CHAINS and groups == -(-CHAINS // size)
    # the all-chains program (measured by the check, then by the plan) did not
    # fit; the last program compiled is the one chosen, and it fits
    assert measured[0] == everything > budget
    assert 1 <= len(measured) - 2 <= memory.MAX_COMPILES
    assert measured[-1] <= budget
    # the chains do not interact: the same draws, group by group
    np.testing.assert_allclose(grouped, whole, rtol=1e-10, atol=0)

    # a second run plans again from the programs compiled by the first: it
    # compiles nothing, warns again, and gives the same draws
    compiles = dict(compile_log().ours())
    with pytest.warns(UserWarning, match=rf"in {groups} groups of {size} chains"):
        again = _run()
    assert dict(compile_log().ours()) == compiles
    np.testing.assert_array_equal(again, grouped)


def test_one_chain_that_does_not_fit_raises(accelerator_chains, monkeypatch):
    # 12,000 bytes hold the buffer of draws (7 x 32 x (1 + 4) float64 values,
    # checked in init) but not one chain's block program
    _fake_free(monkeypatch, 12_000)
    with pytest.raises(
        ValueError,
        match=r"DEERMALA\(block_size=32\) needs about .* per block with one of its "
        rf"{CHAINS} vectorized chains at a time, but the device has 11.72 KiB "
        r"free\. Set block_size=\d+ or smaller\.",
    ):
        _run()
    assert accelerator_chains[-1] > 12_000


def test_auto_never_groups_its_deer_trial(accelerator_chains, monkeypatch):
    """Where DEER's block of all chains does not fit but the sequential
    scan's does, ``method="auto"`` takes the sequential scan and says why: no
    program in groups is compiled (the calling thread would wait for those
    compiles), and the draws are the sequential scan's."""
    everything = _whole_block_bytes()
    measured = accelerator_chains
    measured.clear()
    budget = int(0.6 * everything)
    _fake_free(monkeypatch, budget)
    monkeypatch.setattr(compile_cache, "compile_in_background", compiled_now)
    monkeypatch.setattr(driver, "device_choice", lambda: MethodChoice("deer", "", {}))
    monkeypatch.setattr(kernel_module, "device_method", lambda: "deer")
    kernel = DEERMALA(gaussian_mean_model, block_size=32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        auto = _run(kernel=kernel)
    assert not [w for w in record if "groups of" in str(w.message)]
    choice = kernel.method_choice
    assert kernel.method_chosen == "sequential" and choice.final
    assert "does not fit" in choice.reason and "Set block_size=" in choice.reason
    # the sequential block (fits), then DEER's of all chains (does not, read
    # by the check and the plan): no program of a group compiled
    assert measured[0] <= budget < everything
    assert measured[1:] == [everything, everything]
    sequential = _run(
        kernel=DEERMALA(gaussian_mean_model, block_size=32, method="sequential")
    )
    np.testing.assert_allclose(auto, sequential, rtol=1e-10, atol=0)


def _whole_block_bytes() -> int:
    """The bytes of the block program of all chains at once, as the driver's
    check measures them: 1 byte free (the buffer check in init skipped), and
    the run stopped where the plan would start, with those bytes."""

    def stop(required, free, *args, **kwargs):
        raise _Measured(required)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory, "plan_chain_group", stop)
        patch.setattr("numpyro_deer.infer.kernel.check_buffer_memory", _nothing)
        patch.setattr(memory, "free_device_bytes", lambda device=None: 1)
        patch.setattr(host_run, "_PLANNED_STAGES", frozenset())
        with pytest.raises(_Measured) as measured:
            _run()
    return measured.value.args[0]


def _nothing(*args, **kwargs):
    return None


class _Measured(Exception):
    pass


# ---------------------------------------------------------------- the plan


class _Program(SimpleNamespace):
    def memory_analysis(self):
        return SimpleNamespace(
            argument_size_in_bytes=self.bytes,
            output_size_in_bytes=0,
            temp_size_in_bytes=0,
        )


def _plan(bytes_of, free, chains=256):
    compiled = []

    def compile_group(g):
        compiled.append(g)
        return _Program(bytes=bytes_of(g), group=g)

    plan = memory.plan_chain_group(bytes_of(chains), free, chains, compile_group, 4096)
    return plan, compiled


def test_plan_on_a_line_takes_the_largest_group_that_fits():
    # arguments of every chain (10 GB) plus 0.3 GB per chain; 40 GB free
    plan, compiled = _plan(lambda g: 10e9 + 0.3e9 * g, 40e9)
    assert plan.required <= 40e9 and plan.compiled.group == plan.size
    assert len(compiled) <= memory.MAX_COMPILES
    # on the line, groups of 86 fit 36 GB (FILL of 40); balanced: 3 of 86
    assert plan.size == 86 and plan.groups == 3


def test_plan_of_memory_through_zero_fits_at_the_first_guess():
    plan, compiled = _plan(lambda g: 0.15e9 * g, 39e9)
    assert compiled == [plan.size] and plan.size * plan.groups >= 256
    assert plan.required <= 39e9


def test_plan_from_one_chain_widens_the_group_on_the_measured_line():
    # the all-chains compile ran out of memory (required unknown): one chain's
    # bytes (0.7 GB fixed + 76 MB per chain) drawn through zero give groups of
    # 64; the line through both measured points gives 2 groups of 512
    def bytes_of(g):
        return 0.7e9 + 0.076e9 * g

    compiled = []

    def compile_group(g):
        compiled.append(g)
        return _Program(bytes=bytes_of(g), group=g)

    plan = memory.plan_chain_group(None, 58.3e9, 1024, compile_group, 512)
    assert compiled == [1, 64, 512]
    assert (plan.size, plan.groups) == (512, 2) and plan.required <= 58.3e9
    assert plan.compiled.group == 512

    # a wider group whose compile runs out of memory keeps the planned one
    def compile_or_fail(g):
        if g == 512:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying")
        return _Program(bytes=bytes_of(g), group=g)

    plan = memory.plan_chain_group(None, 58.3e9, 1024, compile_or_fail, 512)
    assert (plan.size, plan.groups) == (64, 16)


def test_plan_falls_back_to_groups_of_one_chain_then_raises():
    # far from linear: the guesses miss, a chain alone fits
    plan, compiled = _plan(lambda g: 1e9 if g == 1 else 60e9, 10e9)
    assert plan.size == 1 and plan.groups == 256
    assert len(compiled) <= memory.MAX_COMPILES and compiled[-1] == 1
    with pytest.raises(ValueError, match=r"block_size=4096\) .* one of its 256"):
        _plan(lambda g: 12e9 + g, 10e9)


def _compile_runs_out_of_memory(monkeypatch, program: str):
    """The background compile of ``program`` fails as XLA's autotuner does
    when it allocates the program's largest buffers while compiling."""
    background = compile_cache.compile_in_background

    def out_of_memory(lowered):
        futures = background(lowered)
        for name in futures:
            if name == program:
                failed = Future()
                failed.set_exception(
                    RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying")
                )
                futures[name] = failed
        return futures

    monkeypatch.setattr(compile_cache, "compile_in_background", out_of_memory)


def test_a_block_whose_compile_runs_out_of_memory_is_solved_in_groups(
    accelerator_chains, monkeypatch
):
    # the block program of all chains fails to compile at all
    whole = _run()
    budget = int(0.6 * _whole_block_bytes())
    _fake_free(monkeypatch, budget)
    _compile_runs_out_of_memory(monkeypatch, "deer")
    accelerator_chains.clear()
    with pytest.warns(UserWarning, match="ran out of device memory while compiling"):
        grouped = _run()
    # one chain's program first, then the largest group that fits
    assert accelerator_chains[-1] <= budget and len(accelerator_chains) >= 2
    np.testing.assert_allclose(grouped, whole, rtol=1e-10, atol=0)


def test_a_hessian_window_end_that_runs_out_of_memory_is_solved_in_groups(
    accelerator_chains, monkeypatch
):
    # the Hessian mass matrix of every chain at once (16 D gradients per
    # chain) is the warmup's largest program: planned like a block
    whole = _run()
    _fake_free(monkeypatch, 2**40, window_end=True)  # the blocks fit
    _compile_runs_out_of_memory(monkeypatch, "window_end")
    accelerator_chains.clear()
    with pytest.warns(UserWarning) as record:
        grouped = _run()
    messages = [str(w.message) for w in record]
    assert any(
        f"the Hessian mass matrix of all {CHAINS} vectorized chains ran out of "
        "device memory while compiling" in m
        for m in messages
    ), messages
    # one chain's window end was compiled and measured, and it fits
    assert accelerator_chains and accelerator_chains[0] <= 2**40
    np.testing.assert_allclose(grouped, whole, rtol=1e-10, atol=0)


@pytest.mark.parametrize(
    "stats, free",
    [
        # no allocator statistics beyond the limit: the limit less what is in use
        ({"bytes_limit": 100, "bytes_in_use": 30}, 70),
        # a grown region with a free block of 25 and 40 not yet grown: 40 in
        # one piece, although 70 are free
        (
            {"bytes_limit": 100, "bytes_in_use": 30, "pool_bytes": 60}
            | {"largest_free_block_bytes": 25},
            40,
        ),
        # the free block inside the pool is the larger piece
        (
            {"bytes_limit": 100, "bytes_in_use": 5, "pool_bytes": 90}
            | {"largest_free_block_bytes": 80},
            80,
        ),
        # never more than the bytes free
        (
            {"bytes_limit": 100, "bytes_in_use": 50, "pool_bytes": 0}
            | {"largest_free_block_bytes": 0},
            50,
        ),
    ],
)
def test_free_bytes_are_those_the_allocator_can_give_in_one_piece(stats, free):
    device = SimpleNamespace(memory_stats=lambda: stats)
    assert memory.free_device_bytes(device) == free
    assert memory.free_device_bytes(SimpleNamespace(memory_stats=lambda: None)) is None
