"""A block kernel's run from the host: programs compiled in the background,
warmup in chunks, then one block per call.

:func:`lower_programs` lowers a run's programs one by one; :class:`Programs`
holds them by name, each compiling in a thread as soon as it is lowered
(:func:`~numpyro_deer.infer.compile_cache.compile_in_background`) and waited
for when first run, so warmup runs while the blocks still compile.
:func:`run_warmup` advances warmup in chunks sized for the progress bar;
:func:`run_blocks` computes one block per call and, for ``method="auto"``,
measures both methods (:func:`next_method`). The driver,
:class:`numpyro_deer.MCMC`, builds the programs and calls these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import numpy as np

from . import compile_cache, loops
from .memory import CompileOutOfMemory, is_out_of_memory
from .method import MethodChoice, measured_choice, pending_choice, unfit_choice
from .progress import Progress, block_postfix, next_chunk, warmup_postfix

# what the progress bar calls the programs that are not block steps
_STAGES = {
    "init": "the initial state",
    "step_size": "the step size search",
    "warmup": "warmup",
    "window_end": "the Hessian mass matrix",
}


# stages whose memory is checked like a block's (vectorized chains solved in
# groups where they do not fit): the Hessian holds 16 D gradients per chain
_PLANNED_STAGES = frozenset({"window_end"})


class Programs:
    """A run's programs by name, compiling in the background.

    Args:
        lowered: ``(name, lowered program)`` pairs (``"init"``, ``"warmup"``,
            or a method's name for a block step), each compile started as
            soon as its program is lowered.
        progress: the run's progress bar; says what the run waits for.
        check_memory: ``check_memory(name, compiled)`` for a block program
            or the Hessian window end, called once before it first runs: the
            program to run (the same, or one that fits the device's memory),
            or raises if none fits.
        placed: over a mesh, put each call's arguments where the compiled
            program expects them (a program's outputs can come back with
            other shardings than it was compiled for).
    """

    def __init__(
        self,
        lowered: Iterable[tuple[str, Any]],
        progress: Progress,
        check_memory: Callable[[str, Any], None],
        placed: bool,
    ):
        self._compiling = compile_cache.compile_in_background(lowered)
        self._compiled = {}
        self._progress = progress
        self._check_memory = check_memory
        self._placed = placed

    def ready(self, name: str) -> bool:
        """Whether ``name`` is compiled (running it will not wait)."""
        if name in self._compiled:
            return True
        return name in self._compiling and self._compiling[name].done()

    def get(self, name: str, args=None):
        """The compiled program ``name``, waiting for its compile. A block
        program (or window end) whose compile runs out of device memory goes
        to ``check_memory`` as :class:`~.memory.CompileOutOfMemory` with the
        shapes of ``args``."""
        if name not in self._compiled:
            if not self._compiling[name].done():
                self._progress.compiling(_STAGES.get(name, f"{name} blocks"))
            planned = name not in _STAGES or name in _PLANNED_STAGES
            try:
                compiled = self._compiling[name].result()
            except Exception as error:
                if not planned or args is None or not is_out_of_memory(error):
                    raise
                compiled = CompileOutOfMemory(error, jax.tree.map(shape_of, args))
            if planned:
                compiled = self._check_memory(name, compiled)
            self._compiled[name] = compiled
        return self._compiled[name]

    def __call__(self, name: str, *args):
        program = self.get(name, args)
        if self._placed:
            leaves, treedef = jax.tree.flatten(args)
            shardings = treedef.flatten_up_to(program.input_shardings[0])
            args = treedef.unflatten(map(placed, leaves, shardings))
        return program(*args)


def placed(x, sharding):
    """``x`` where a compiled program expects it. A value replicated over the
    processes of a multi-process mesh (a loop counter a program returned)
    that the program takes on one device goes through the host: each process
    holds all of it, and ``jax.device_put`` cannot move an array that is not
    fully addressable to one device."""
    if sharding is None:  # an argument the program does not use
        return x
    if (
        isinstance(x, jax.Array)
        and len(sharding.device_set) == 1
        and not x.is_fully_addressable
    ):
        x = np.asarray(x)  # fully replicated: this process's copy
    return jax.device_put(x, sharding)


def program_in_groups(run: HostRun, name: str, group: int):
    """The jitted program ``name`` (a block step by that method, or
    ``"window_end"``) with the vectorized chains in groups of ``group``."""
    if name == "window_end":
        return run.fns(kernel_method(run.kernel), group).window_end
    return run.fns(name, group).block_step


def shape_of(x) -> jax.ShapeDtypeStruct:
    """``x``'s shape, dtype and weak type."""
    weak = getattr(getattr(x, "aval", None), "weak_type", False)
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, weak_type=weak)


class HostRun(NamedTuple):
    """What a run from the host computes, besides its carry.

    Attributes:
        kernel: the block kernel (:class:`~numpyro_deer.infer.protocol.BlockKernel`).
        fns: ``fns(method, chain_group=None)``, the run's loop functions
            with blocks by ``method`` (:class:`~.loops.LoopFns`), vectorized
            chains solved in groups of ``chain_group`` if given.
        init: the initial state's program if the run computes it
            (:class:`~numpyro_deer.infer.kernel.InitProgram`), else ``None``.
        plan: the warmup plan (:class:`WarmupPlan`).
        total: sampling steps.
        start: the first collected iteration (NumPyro's ``start_idx``).
        dynamic: the model's array arguments.
        batched: vectorized chains.
    """

    kernel: Any
    fns: Callable
    init: Any
    plan: WarmupPlan
    total: int
    start: jax.Array
    dynamic: tuple
    batched: bool


def block_methods(run: HostRun, state, trials: list[str]) -> list[str]:
    """The block programs a run lowers: none for a run without sampling
    steps, the kernel's method's, or for ``method="auto"`` measuring both
    (``trials``) the sequential scan's, and DEER's where a block follows the
    first: a run of one block could use DEER only by waiting for its compile,
    which ``"auto"`` never does, and tracing DEER's block delays the run (on
    an H100, 1.8 to 4.1 s of a first run of 1,024 chains of eight schools)."""
    if run.total == 0:
        return []
    if not trials:
        return [kernel_method(run.kernel)]
    if run.total > loops.buffer_size(state, run.batched):
        return list(trials)
    return trials[:1]


def lower_programs(run: HostRun, state, collection, trace, methods, trial: bool):
    """A run's programs lowered one by one: ``(name, lowered)`` in the order
    their compiles start (one an earlier run compiled at the same signature
    is taken as it is: :func:`~.compile_cache.lower`).

    ``"init"`` (if ``run.init``), ``"step_size"``, ``"warmup"`` and
    ``"window_end"`` as the warmup plan needs them, then a block step per
    name in ``methods``: by that method if ``trial`` (``method="auto"``
    measuring both), else by the kernel's; the order the run needs them, and
    to compile them in while they queue for fewer workers. The loop counters
    are lowered from their shape. Where each program has a worker
    (:func:`~.compile_cache.compile_workers`), the first block step, the
    longest compile and the run's last, is lowered right after the initial
    state instead (on an H100, eight schools' 1,024 chains compiled it from
    1.8 to 3.3 s, the warmup's programs by 2.5 s).
    """
    zero = jax.ShapeDtypeStruct((), np.int32)
    plan, dynamic = run.plan, run.dynamic
    loop = run.fns(kernel_method(run.kernel))

    def block(name):
        block_step = run.fns(name if trial else kernel_method(run.kernel)).block_step
        counters = (zero, zero, zero)
        args = (state, collection, zero, counters, zero, zero, run.start, dynamic)
        return compile_cache.lower(block_step, *args)

    warmup = []
    if plan.search and (run.init is not None or plan.stops):
        use = jax.ShapeDtypeStruct(np.shape(state.i), bool)
        warmup.append(("step_size", loop.step_size, (state, use, dynamic)))
    if plan.steps:
        args = (state, collection, trace, zero, zero, run.start, dynamic)
        warmup.append(("warmup", loop.warmup, args))
    if plan.stops:
        warmup.append(("window_end", loop.window_end, (state, dynamic)))
    count = (run.init is not None) + len(warmup) + len(methods)
    early = list(methods[:1]) if compile_cache.compile_workers() >= count else []
    if run.init is not None:
        yield "init", compile_cache.lower(run.init.program, *run.init.arguments)
    for name in early:
        yield name, block(name)
    for name, fun, args in warmup:
        yield name, compile_cache.lower(fun, *args)
    for name in methods[len(early) :]:
        yield name, block(name)


class WarmupPlan(NamedTuple):
    """What a run's warmup computes from the host.

    Attributes:
        steps: warmup steps in this run.
        stops: the counts of those steps after which the kernel's Hessian
            window end runs (``"window_end"`` then ``"step_size"``).
        search: whether the step size is searched (after the initial state
            and each window end).
    """

    steps: int
    stops: tuple[int, ...]
    search: bool


def warmup_plan(program, first: int, steps: int) -> WarmupPlan:
    """The warmup plan of ``steps`` steps from iteration count ``first``
    (the program's ``window_ends`` and ``adapts_step_size``)."""
    stops = tuple(e - first for e in program.window_ends if first < e <= first + steps)
    return WarmupPlan(steps, stops, program.adapts_step_size)


def initial_state(programs: Programs, run: HostRun):
    """The initial state ``run.init`` computes (the kernel's ``start``), by
    the programs compiled in the background."""

    def call(name, fn, *args):
        if name == "step_size":  # a device array: compiles nothing eagerly
            args = (args[0], jax.device_put(args[1]), run.dynamic)
        return programs(name, *args)

    return run.kernel.start(run.init, call)


def run_warmup(programs: Programs, progress: Progress, carry, run: HostRun):
    """The warmup steps in chunks, and the window ends at the plan's stops;
    ``carry`` is ``(state, collection, trace)``, returned advanced. Chunks
    are sized by the last chunk's time (:func:`~.progress.next_chunk`), over
    several processes without it (fourfold growth): every process must pass
    the same counters."""
    plan, dynamic = run.plan, run.dynamic
    timed = jax.process_count() == 1
    programs.get("warmup")
    progress.running("warmup")
    done, last, seconds = 0, 0, 0.0
    while done < plan.steps:
        stop = min([s for s in plan.stops if s > done] + [plan.steps])
        chunk = min(next_chunk(done, plan.steps - done, seconds, last), stop - done)
        tic = time.perf_counter()
        carry = programs(
            "warmup", *carry, i32(done), i32(done + chunk), run.start, dynamic
        )
        progress.postfix(warmup_postfix(carry[0]))  # waits for the chunk
        # untimed (0 s): next_chunk grows the chunk fourfold
        seconds = time.perf_counter() - tic if timed else 0.0
        last = chunk
        done += chunk
        if done in plan.stops:
            state, finite = programs("window_end", carry[0], dynamic)
            if plan.search:
                state = programs("step_size", state, finite, dynamic)
            carry = (state, *carry[1:])
        progress.advance(chunk)
    return carry


def run_blocks(
    programs: Programs,
    progress: Progress,
    run: HostRun,
    trials: list[str],
    choose: Callable[[MethodChoice], None],
    carry,
):
    """The ``run.total`` sampling steps, one block per call; ``carry`` is
    ``(state, collection)``. Returns ``(state, collection, stats)``.

    With ``trials`` (``["sequential", "deer"]``, ``method="auto"`` measuring
    both), each method's first block is timed on its own (:func:`next_method`
    picks it) and ``choose`` receives the faster; a run that ends before DEER
    is compiled passes a provisional choice with the sequential scan's time,
    which a later run of blocks of the same size starts from (it then times
    only DEER), and where DEER's compiled block does not fit the device's
    free memory the sequential scan is chosen.
    """
    state, collection = carry
    kernel, total, batched = run.kernel, run.total, run.batched
    chains = int(np.size(state.i))
    # the loop's counters, sent to the device at once, before the first block
    done, *stats, n_offset, last = i32s(0, 0, 0, 0, run.plan.steps, total)
    stats = tuple(stats)
    size = loops.buffer_size(state, batched)
    timings = measured_before(kernel.method_choice, size) if trials else {}
    limit = int(loops.max_block_steps(total, size))
    steps = count = 0  # count: int(done), read after each block
    while count < total and steps < limit:
        name = next_method(trials, timings, programs, kernel)
        args = (state, collection, done, stats, n_offset, last, run.start, run.dynamic)
        try:
            programs.get(name, args)
        except ValueError as err:  # the memory check's
            if name != "deer" or not trials:
                raise
            choose(unfit_choice(str(err), timings, size))
            trials, name = [], "sequential"
        if steps == 0:
            progress.running("sample")
        before, tic = count, time.perf_counter()
        state, collection, done, stats = programs(name, *args)
        count = int(done)  # waits for the block
        consumed = count - before
        seconds = time.perf_counter() - tic
        steps += 1
        if name in trials and name not in timings:
            timings[name] = seconds
            if len(timings) == len(trials):
                choose(measured_choice(timings, size))
        if progress.shows:  # the postfix's numbers wait for the device
            progress.postfix(block_postfix(state, name, consumed * chains, seconds))
        progress.advance(consumed)
    if trials and len(timings) < len(trials):
        choose(pending_choice(timings, size))
    check_progress(done, total, state, batched)
    return state, collection, stats


def measured_before(choice: MethodChoice | None, size: int) -> dict:
    """The seconds per block an earlier run of blocks of ``size`` measured
    for a provisional choice (the sequential scan's), else none."""
    if choice is None or choice.final or choice.block_size != size:
        return {}
    return dict(choice.seconds)


def next_method(trials: list, timings: dict, programs: Programs, kernel) -> str:
    """The method of the next block: a trial of ``method="auto"`` still to
    measure (DEER only once its program is compiled, the sequential scan until
    then), else the kernel's."""
    if not trials or len(timings) == len(trials):
        return kernel_method(kernel)
    if "sequential" in timings and programs.ready("deer"):
        return "deer"
    return "sequential"


def kernel_method(kernel) -> str:
    """The method a block kernel computes blocks with, as it stands."""
    return kernel.method_chosen


def check_progress(done, total: int, state, batched: bool) -> None:
    """Raise if the block loop stopped before every draw was handed out."""
    if int(done) < total:
        size = loops.buffer_size(state, batched)
        raise RuntimeError(
            f"numpyro_deer.MCMC: the block loop stopped after "
            f"{loops.max_block_steps(total, size)} iterations "
            f"with {int(done)} of {total} draws: the state's block buffer (size "
            f"{size}) and the loop disagree about the "
            "draws left. Please report this with the model and settings."
        )


def i32(n) -> jax.Array:
    """``n`` as an int32 scalar on the device, compiling nothing (where
    ``jnp.asarray(n, jnp.int32)`` compiles a conversion the first time)."""
    return jax.device_put(np.int32(n))


def i32s(*values) -> tuple[jax.Array, ...]:
    """:func:`i32` of each value, sent to the device by one call."""
    return tuple(jax.device_put(tuple(np.int32(n) for n in values)))
