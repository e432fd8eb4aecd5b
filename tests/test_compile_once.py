"""Compile once: a second ``MCMC`` object and new data of the same shapes reuse
the compiled warmup, block and init functions (counted through
``jax.monitoring``'s backend-compile events, by function name)."""

import contextlib
import gc
import threading
import time
from collections import Counter

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from benchmarks.models import gaussian_mean_model
from numpyro_deer import DEERMALA, MCMC
from numpyro_deer.infer import compile_cache, loops, lowering, numpyro_compat

from .helpers import compile_log, gaussian_data

# 60 warmup steps: one middle adaptation window, so the Hessian window end
# (its own program, beside the warmup loop) is part of every run
SETTINGS = {"num_warmup": 60, "num_samples": 48}

LOG = compile_log()


def _run(
    data=3.0,
    progress_bar=False,
    jit_model_args=False,
    block_size=16,
    seed=0,
    model=gaussian_mean_model,
):
    args, kwargs = gaussian_data(data)
    mcmc = MCMC(
        DEERMALA(model, block_size=block_size),
        **SETTINGS,
        progress_bar=progress_bar,
        jit_model_args=jit_model_args,
    )
    mcmc.progress_bar = progress_bar  # MCMC turns it off when CI is set
    before = LOG.ours()
    mcmc.run(jax.random.PRNGKey(seed), *args, **kwargs)
    draws = np.asarray(mcmc.get_samples()["mu"])
    return draws, LOG.ours() - before


def _progress_model(y, sigma):
    """A model no other test runs: nothing in the process has compiled it."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


@pytest.fixture(scope="module")
def first():
    draws, compiled = _run()
    return draws, compiled


def test_first_run_compiles_each_program_once(first):
    _, compiled = first
    assert compiled == Counter(
        {
            "jit(init_one)": 1,
            "jit(step_size)": 1,
            "jit(warmup_loop)": 1,
            "jit(window_end)": 1,
            "jit(block_step)": 1,
        }
    )


def test_second_mcmc_object_compiles_nothing_and_draws_the_same(first):
    draws, compiled = _run()
    assert compiled == Counter()
    np.testing.assert_array_equal(draws, first[0])


def test_new_data_of_the_same_shape_compiles_nothing(first):
    # under jit_model_args=True the Python float among the model's arguments
    # is an argument of the loop too: its first run compiles the loop (the
    # init is shared), a run on new data of the same shapes nothing; the new
    # values are read afresh (the posterior mean moves)
    draws_a, compiled_a = _run(jit_model_args=True)
    draws_b, compiled_b = _run(data=-3.0, jit_model_args=True)
    assert set(compiled_a) <= {
        "jit(step_size)",
        "jit(warmup_loop)",
        "jit(window_end)",
        "jit(block_step)",
    }
    assert compiled_b == Counter()
    np.testing.assert_array_equal(draws_a, first[0])
    # gaussian_mean_model: 20 observations of y, prior N(0, 10): mean ~ y
    assert abs(float(np.mean(draws_a)) - 3.0) < 1.0
    assert abs(float(np.mean(draws_b)) + 3.0) < 1.0


def test_progress_bar_loops_compile_once():
    _, compiled = _run(progress_bar=True, seed=1, model=_progress_model)
    assert any("warmup_loop" in n for n in compiled)
    assert any("block_step" in n for n in compiled)
    _, again = _run(progress_bar=True, seed=2, model=_progress_model)
    assert again == Counter()


def _options_model(y, sigma):
    """``gaussian_mean_model`` under another function: its own compile key."""
    gaussian_mean_model(y, sigma)


def test_compiler_options_by_backend_unless_the_user_sets_the_flag(monkeypatch):
    options = lowering.compiler_options
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setattr(compile_cache.jax, "default_backend", lambda: "gpu")
    assert options() == {lowering.TRITON_GEMM: False}
    # the programs that run briefly are not autotuned either
    assert options(runs_briefly=True) == {
        lowering.TRITON_GEMM: False,
        lowering.AUTOTUNE: 0,
    }
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=true")
    assert options() is None
    assert options(runs_briefly=True) == {lowering.AUTOTUNE: 0}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=4")
    assert options(runs_briefly=True) == {lowering.TRITON_GEMM: False}
    monkeypatch.delenv("XLA_FLAGS")
    # on a CPU only the programs that run briefly skip LLVM's optimisation
    monkeypatch.setattr(compile_cache.jax, "default_backend", lambda: "cpu")
    assert options() is None
    assert options(runs_briefly=True) == {lowering.OPT_LEVEL: 0}
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=3")
    assert options(runs_briefly=True) is None
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(compile_cache.jax, "default_backend", lambda: "tpu")
    assert options(runs_briefly=True) is None


def test_programs_compile_with_the_options_and_once(first, monkeypatch):
    # every program of a run is jitted through lowering.jit, which
    # passes lowering.compiler_options() to XLA: an option XLA rejects
    # fails the compile
    built = []
    jit = lowering.jit

    def recording_jit(fun, runs_briefly=False, **kwargs):
        built.append((fun.__name__, runs_briefly))
        return jit(fun, runs_briefly, **kwargs)

    monkeypatch.setattr(lowering, "jit", recording_jit)
    monkeypatch.setattr(lowering, "compiler_options", lambda _=False: {"no_such": 1})
    with pytest.raises(Exception, match="no_such"):
        lowering.jit(lambda x: x + 1)(1.0)
    # the GPU's options (ignored by the CPU): the same draws, and a second
    # MCMC object compiles nothing (options given to jax.jit, not to each
    # compile, keep JAX's cache of the compiled program)
    options = {lowering.TRITON_GEMM: False}
    monkeypatch.setattr(lowering, "compiler_options", lambda _=False: options)
    draws, compiled = _run(model=_options_model)
    names = {name for name, _ in built}
    assert {"init_one", "step_size", "warmup_loop", "block_step"} <= names
    # the initial state and the step size search run briefly; the loops do not
    briefly = {name for name, short in built if short}
    assert briefly == {"init_one", "step_size"}
    assert any("block_step" in n for n in compiled)
    np.testing.assert_array_equal(draws, first[0])
    _, again = _run(model=_options_model)
    assert again == Counter()


def _unshared_model(y):
    """A model with latent shapes no other test samples (11 values)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([10]).to_event(1))
    numpyro.sample("y", dist.Normal(mu + x, 1.0).to_event(1), obs=y)


def _unshared_mcmc(**options) -> MCMC:
    """``MCMC`` of ``DEERMALA(_unshared_model)`` (its own sizes: ``options``)."""
    kernel = DEERMALA(_unshared_model, block_size=16)
    return MCMC(kernel, progress_bar=False, **options)


# the kernel's and the driver's programs, and the few small programs the
# set-up compiles itself: the zero collection and whether the blocks need a
# refill (method="auto" on an accelerator)
SETUP_PROGRAMS = {
    "jit(init_one)",
    "jit(step_size)",
    "jit(warmup_loop)",
    "jit(window_end)",
    "jit(block_step)",
    "jit(_zeros)",
    "jit(all_need_refill)",
}


def test_run_set_up_compiles_no_one_op_programs():
    # eager jnp operations in the kernel's init or the driver's set-up would
    # each compile a program (~30 ms on the CPU) the first time in a process:
    # every compile asked for by this package's own code is one of the above
    before = len(LOG.events)
    mcmc = _unshared_mcmc(num_warmup=23, num_samples=37)
    mcmc.run(jax.random.PRNGKey(3), np.linspace(-1.0, 1.0, 10))
    events = LOG.events[before:]
    # the kernel's programs compile in the driver's threads, the rest here
    assert "jit(init_one)" in {name for name, _ in events}
    ours = Counter(name for name, where in events if where.startswith("numpyro_deer"))
    assert set(ours) <= SETUP_PROGRAMS, ours


def test_zero_collection_is_made_once_the_programs_are_lowered(monkeypatch):
    # the collection's zeros are a compiled program of their own (about 0.1 s
    # on a GPU): made before the programs are lowered, that compile delays
    # every one of theirs; made after, it runs beside them
    events = []
    lower_all = compile_cache.compile_in_background
    make_zeros = loops.zeros

    def lowered(programs):
        futures = lower_all(programs)
        events.append(("lowered", tuple(futures)))
        return futures

    def zeros(avals):
        events.append(("zeros", None))
        return make_zeros(avals)

    monkeypatch.setattr(compile_cache, "compile_in_background", lowered)
    monkeypatch.setattr(loops, "zeros", zeros)
    mcmc = _unshared_mcmc(num_warmup=13, num_samples=29)
    mcmc.run(jax.random.PRNGKey(6), np.linspace(-1.0, 1.0, 10))
    assert [kind for kind, _ in events] == ["lowered", "zeros"], events
    assert {"init", "warmup"} <= set(events[0][1])
    assert np.all(np.isfinite(mcmc.get_samples()["mu"]))


def test_vectorized_chains_are_put_first_without_a_compile(monkeypatch):
    # NumPyro swaps the (draws, chains) axes of a vectorized run with an eager
    # jnp.swapaxes per collected field (a compile each, per shape); the driver
    # transposes on the host instead: the same arrays, nothing compiled for it
    def run(key):
        mcmc = _unshared_mcmc(  # shapes of this test's own
            num_warmup=19, num_samples=41, num_chains=2, chain_method="vectorized"
        )
        before = len(LOG.events)
        mcmc.run(key, np.linspace(-1.0, 1.0, 10), extra_fields=("potential_energy",))
        return mcmc, [name for name, _ in LOG.events[before:]]

    mcmc, compiled = run(jax.random.PRNGKey(5))
    assert not [name for name in compiled if "swapaxes" in name], compiled
    grouped = mcmc.get_samples(group_by_chain=True)["mu"]
    energy = mcmc.get_extra_fields(group_by_chain=True)["potential_energy"]
    assert grouped.shape == (2, 41) and energy.shape == (2, 41)
    assert isinstance(grouped, jax.Array)
    # the flat draws too are reshaped on the host, not by NumPyro's eager
    # jnp.reshape per field
    before = len(LOG.events)
    flat = mcmc.get_samples()
    assert not [name for name, _ in LOG.events[before:] if "reshape" in name]
    assert isinstance(flat["mu"], jax.Array) and flat["x"].shape == (82, 10)
    np.testing.assert_array_equal(flat["mu"], np.reshape(grouped, -1))
    np.testing.assert_array_equal(
        mcmc.get_extra_fields()["potential_energy"], np.reshape(energy, -1)
    )

    # NumPyro's own swap gives the same arrays (and compiles it)
    monkeypatch.setattr(
        numpyro_compat,
        "chains_first_on_the_host",
        lambda mcmc, block_kernel: contextlib.nullcontext(),
    )
    monkeypatch.setattr(numpyro_compat, "flat_states_on_the_host", lambda mcmc: None)
    stock, compiled = run(jax.random.PRNGKey(5))
    assert [name for name in compiled if "swapaxes" in name]
    before = len(LOG.events)
    np.testing.assert_array_equal(stock.get_samples()["x"], flat["x"])
    assert [name for name, _ in LOG.events[before:] if "reshape" in name]
    np.testing.assert_array_equal(stock.get_samples(group_by_chain=True)["mu"], grouped)
    np.testing.assert_array_equal(
        stock.get_extra_fields(group_by_chain=True)["potential_energy"], energy
    )


def _warmup_first_model(y, sigma):
    """``gaussian_mean_model`` under another function: its own compile key."""
    gaussian_mean_model(y, sigma)


def test_initial_state_compiles_beside_the_programs_from_their_shapes():
    # the initial state's program compiles in the driver's threads, beside
    # the warmup loop, and the programs lowered from its output's shapes are
    # those a run after warmup() lowers from the warmed-up state: a fresh run
    # of another MCMC object compiles nothing
    args, kwargs = gaussian_data(3.0)
    before = len(LOG.threads)
    mcmc = MCMC(DEERMALA(_warmup_first_model, block_size=16), **SETTINGS)
    mcmc.progress_bar = False
    mcmc.warmup(jax.random.PRNGKey(0), *args, **kwargs)
    mcmc.run(mcmc.post_warmup_state.rng_key, *args, **kwargs)
    threads = dict(LOG.threads[before:])
    assert threads["jit(init_one)"] != threading.main_thread().name
    again = MCMC(DEERMALA(_warmup_first_model, block_size=16), **SETTINGS)
    again.progress_bar = False
    mark, before = LOG.ours(), len(LOG.events)
    again.run(jax.random.PRNGKey(1), *args, **kwargs)
    assert LOG.ours() - mark == Counter()
    # nor anything else: NumPyro's search for the initial point is part of
    # the initial state's program, the model's set-up is only traced
    assert LOG.events[before:] == []


MODEL_CALLS = []


def _counted_model(y, sigma):
    """``gaussian_mean_model``, counting its executions (each one a trace)."""
    MODEL_CALLS.append(None)
    gaussian_mean_model(y, sigma)


@pytest.mark.parametrize("method", ["deer", "sequential"])
def test_block_program_traces_the_model_at_most_once(method):
    # the potential is a jitted function of the values and the model's
    # arrays: a program's evaluations, gradients, vmaps and linearizations
    # of it reuse one trace of the model per shape (a DEER block traced the
    # model 9 times, a sequential one twice, when every use traced it)
    args, kwargs = gaussian_data(3.0)
    kernel = DEERMALA(_counted_model, block_size=16, method=method)
    mcmc = MCMC(kernel, **SETTINGS, num_chains=2, chain_method="vectorized")
    mcmc.progress_bar = False
    mcmc.warmup(jax.random.PRNGKey(0), *args, **kwargs)
    MODEL_CALLS.clear()
    mcmc.run(mcmc.post_warmup_state.rng_key, *args, **kwargs)
    assert len(MODEL_CALLS) <= 1, len(MODEL_CALLS)
    assert np.isfinite(np.asarray(mcmc.get_samples()["mu"])).all()


def test_second_run_traces_no_postprocessing():
    """The collected fields' shapes come from a jitted function kept with the
    run's programs: a second ``MCMC`` object traces the postprocessing
    (``postprocess_fn``) nowhere."""
    calls = []

    def postprocess_fn(z):
        calls.append(None)
        return z

    args, kwargs = gaussian_data(3.0)
    for _ in range(2):
        calls.clear()
        mcmc = MCMC(
            DEERMALA(gaussian_mean_model, block_size=16),
            num_warmup=0,
            num_samples=16,
            postprocess_fn=postprocess_fn,
            progress_bar=False,
        )
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    assert calls == []


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 2), (16, 8)])
def test_programs_compile_one_per_core_at_most_eight(monkeypatch, cores, workers):
    monkeypatch.setattr(
        compile_cache.os, "sched_getaffinity", lambda pid: set(range(cores))
    )
    assert compile_cache.compile_workers() == workers


def test_background_compiles_run_at_most_the_workers_at_once(monkeypatch):
    # six programs with two workers: two at a time, every one compiled
    monkeypatch.setattr(compile_cache, "compile_workers", lambda: 2)
    lock, running, most = threading.Lock(), [0], [0]

    class Lowered:
        def compile(self):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            return "compiled"

    futures = compile_cache.compile_in_background(
        (f"program {i}", Lowered()) for i in range(6)
    )
    assert [f.result(timeout=10) for f in futures.values()] == ["compiled"] * 6
    assert most[0] == 2


def test_the_collector_is_paused_while_programs_are_lowered():
    seen = []

    def programs():
        seen.append(gc.isenabled())
        yield "double", jax.jit(lambda x: 2 * x).lower(1.0)
        seen.append(gc.isenabled())

    assert gc.isenabled()
    futures = compile_cache.compile_in_background(programs())
    assert seen == [False, False]
    assert gc.isenabled()
    assert futures["double"].result(timeout=30)(3.0) == 6.0
    # left as it was: a caller that paused it finds it paused
    gc.disable()
    try:
        compile_cache.compile_in_background(programs())
        assert not gc.isenabled()
    finally:
        gc.enable()

    def failing():
        yield from ()
        raise RuntimeError("lowering failed")

    with pytest.raises(RuntimeError, match="lowering failed"):
        compile_cache.compile_in_background(failing())
    assert gc.isenabled()


def test_initial_state_traced_once(monkeypatch):
    # the driver takes the initial state's shapes from the trace it lowers
    # (under the lowering configuration; forced on here as on a GPU, where
    # it differs from the default), so a first run traces it once
    def config():
        return lowering._THREEFRY_KERNEL(True)

    monkeypatch.setattr(compile_cache, "lowering_config", config)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    before = LOG.traces["init_one"]
    mcmc = MCMC(DEERMALA(model, block_size=16), **SETTINGS, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), jax.numpy.ones(3))
    assert LOG.traces["init_one"] - before == 1


@pytest.mark.parametrize("workers", [2, 8])
def test_block_lowered_second_where_every_program_has_a_worker(
    first, monkeypatch, workers
):
    # five programs: with fewer workers they compile in the order the run
    # needs them; with a worker each, the block (the longest compile) right
    # after the initial state. The draws do not depend on the order.
    monkeypatch.setattr(compile_cache, "compile_workers", lambda: workers)
    names = []
    background = compile_cache.compile_in_background

    def spy(lowered):
        return background((names.append(n) or (n, low)) for n, low in lowered)

    monkeypatch.setattr(compile_cache, "compile_in_background", spy)
    draws, _ = _run()
    warmup = ["step_size", "warmup", "window_end"]
    assert len(names) == 5 and names[0] == "init"
    if workers == 2:
        assert names[1:4] == warmup and names[4] not in warmup
    else:
        assert names[2:] == warmup and names[1] not in warmup
    np.testing.assert_array_equal(draws, first[0])


def test_second_mcmc_object_lowers_none_of_its_programs(first, monkeypatch):
    # the programs compiled by a run are taken as they are by the next:
    # nothing is lowered again (compile_cache.lower hands back what was
    # compiled); other tests of this module may have cleared the cache
    _run()
    kinds = []
    lower = compile_cache.lower

    def spy(fun, *args):
        program = lower(fun, *args)
        kinds.append(type(program).__name__)
        return program

    monkeypatch.setattr(compile_cache, "lower", spy)
    draws, compiled = _run()
    assert kinds == ["_Compiled"] * 5  # init, step size, warmup, window end, block
    assert compiled == Counter()
    np.testing.assert_array_equal(draws, first[0])


class _Spy:
    """A jitted function whose lowerings are counted."""

    def __init__(self, fun):
        self.fun, self.lowered = jax.jit(fun), 0

    def lower(self, *args):
        self.lowered += 1
        return self.fun.lower(*args)


def test_lower_keeps_a_program_by_its_signature(monkeypatch):
    monkeypatch.setattr(compile_cache, "_programs", type(compile_cache._programs)())
    spy = _Spy(lambda x, n: x * n)
    x = np.ones(3, np.float32)
    compiled = compile_cache.lower(spy, x, np.int32(2)).compile()
    again = compile_cache.lower(spy, jax.numpy.zeros(3, np.float32), np.int32(5))
    assert spy.lowered == 1 and again.compile() is compiled
    np.testing.assert_array_equal(again.compile()(x, np.int32(3)), 3 * x)
    # another shape, dtype, weak type, placement or function: lowered again
    others = [
        (spy, np.ones(4, np.float32), np.int32(2)),
        (spy, np.ones(3, np.float16), np.int32(2)),
        (spy, x, jax.numpy.asarray(2)),  # weakly typed
        (spy, jax.device_put(x, jax.devices()[0]), np.int32(2)),  # committed
        (_Spy(lambda x, n: x * n), x, np.int32(2)),
    ]
    for fun, *args in others:
        before = fun.lowered
        compile_cache.lower(fun, *args).compile()
        assert fun.lowered == before + 1
    # so does a configuration that changes the trace
    before = spy.lowered
    with jax.default_matmul_precision("highest"):
        compile_cache.lower(spy, x, np.int32(2)).compile()
        compile_cache.lower(spy, x, np.int32(2)).compile()
    assert spy.lowered == before + 1
    # a leaf that is not an array: lowered every time, nothing kept
    kept, before = len(compile_cache._programs), spy.lowered
    compile_cache.lower(spy, x, 2).compile()
    compile_cache.lower(spy, x, 2).compile()
    assert spy.lowered == before + 2 and len(compile_cache._programs) == kept
    compile_cache.clear()
    assert len(compile_cache._programs) == 0


def test_gpu_programs_are_lowered_with_jaxs_threefry_kernel(monkeypatch):
    """On a GPU the driver lowers its programs with JAX's random bits through
    its CUDA kernel, a setting that is part of a kept program's signature; on
    a CPU nothing changes. JAX's global setting is never touched."""
    setting = lambda: getattr(jax.config, lowering.THREEFRY_KERNEL)  # noqa: E731
    spy = _Spy(lambda x: x + 1)
    x = np.ones(3, np.float32)
    with lowering.lowering_config():
        assert not setting()
    monkeypatch.setattr(compile_cache, "_programs", type(compile_cache._programs)())
    monkeypatch.setattr(lowering.jax, "default_backend", lambda: "gpu")
    plain = compile_cache.signature(spy, (x,))
    with lowering.lowering_config():
        assert setting()
        assert compile_cache.signature(spy, (x,)) != plain
    assert not setting()
    seen = []
    monkeypatch.setattr(spy, "fun", _Recording(spy.fun, setting, seen))
    compile_cache.lower(spy, x)
    assert seen == [True]


class _Recording:
    """A jitted function whose ``lower`` records ``probe()`` when called."""

    def __init__(self, fun, probe, seen):
        self.fun, self.probe, self.seen = fun, probe, seen

    def lower(self, *args):
        self.seen.append(self.probe())
        return self.fun.lower(*args)


def test_lower_keeps_no_program_whose_compile_failed(monkeypatch):
    monkeypatch.setattr(compile_cache, "_programs", type(compile_cache._programs)())

    class Failing:
        def __init__(self):
            self.lowered = 0

        def lower(self, *args):
            self.lowered += 1
            return self

        def compile(self):
            raise MemoryError("out of memory")

    fun = Failing()
    for _ in range(2):
        with pytest.raises(MemoryError):
            compile_cache.lower(fun, np.ones(2)).compile()
    assert fun.lowered == 2
