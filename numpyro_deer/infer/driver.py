"""``numpyro_deer.MCMC``: a drop-in ``numpyro.infer.MCMC`` advancing a block per loop.

Stock ``MCMC`` calls the kernel once per draw; on a GPU that loop alone costs
more than a sequential MALA step (see the performance page of the docs). For a
block kernel (one with ``block_refill`` and ``block_emit``, such as
:class:`~numpyro_deer.DEERMALA`) this driver instead

* runs warmup as a compiled loop of the kernel's own ``sample`` (so warmup is
  exactly what stock ``MCMC`` does), in chunks for the progress bar;
* then, per loop iteration, refills the kernel's block (one DEER solve), maps
  NumPyro's postprocess over all its draws with :func:`jax.vmap`, and scatters
  them into the collection at the slots stock ``MCMC`` would use, thinning
  included.

The states, the collection and ``last_state`` are those stock ``MCMC`` builds, so
``get_samples``, ``print_summary``, ``extra_fields``, ``warmup``/``run``,
``post_warmup_state`` and ``arviz.from_numpyro`` behave the same, and the draws
are the same for the same key. Kernels that are not block kernels run through
the stock loop. The warmup loop and the block step are compiled in the
background, side by side, and each runs as soon as its own compile is done
(:mod:`~numpyro_deer.infer.host_run`); they are shared by every ``MCMC``
object with the same model, settings and shapes
(:mod:`~numpyro_deer.infer.compile_cache`), so a second ``run`` does not
compile them again.
"""

from __future__ import annotations

import logging
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.infer

from . import compile_cache, loops, memory
from . import numpyro_compat as compat
from .checks import translate_tracer_errors
from .convergence import (
    DEERConvergenceError,
    DEERConvergenceWarning,
    reraise_convergence_error,
    warn_unconverged,
)
from .diagnostics import warn_if_unconverged
from .host_run import (
    Programs,
    i32,
    initial_state,
    kernel_method,
    lower_programs,
    run_blocks,
    run_warmup,
    warmup_plan,
)
from .method import device_choice
from .progress import Progress
from .transit import WarmupTransitWarning, warmup_transit

logger = logging.getLogger("numpyro_deer")

__all__ = ["MCMC", "DEERConvergenceError", "DEERConvergenceWarning", "is_block_kernel"]


def is_block_kernel(kernel) -> bool:
    """Whether ``kernel`` offers the block protocol the driver uses."""
    names = ("block_warmup", "block_refill", "block_emit", "block_size")
    return all(hasattr(kernel, name) for name in names)


class MCMC(numpyro.infer.MCMC):
    """``numpyro.infer.MCMC`` with a fast path for block kernels.

    Same constructor, methods and results as :class:`numpyro.infer.MCMC`. With
    a :class:`~numpyro_deer.DEERMALA` kernel it advances one block of draws per
    loop iteration; other kernels run exactly as in NumPyro.

    Example::

        from numpyro_deer import DEERMALA, MCMC

        mcmc = MCMC(DEERMALA(model), num_warmup=1000, num_samples=100_000)
        mcmc.run(jax.random.PRNGKey(0), X, y)
    """

    def __init__(self, sampler, **kwargs):
        super().__init__(sampler, **kwargs)
        self._block_fns = {}
        self._chain_stats = []

    def __getstate__(self):
        state = super().__getstate__()
        state["_block_fns"] = {}
        state["_chain_stats"] = []
        return state

    def run(self, *args, **kwargs):
        # chains run inside pmap (chain_method="parallel") report their
        # failed-block counts from the devices; warn once here
        self._chain_stats = []
        phase = compat.run_phase(self)  # "warmup" inside warmup()
        with reraise_convergence_error():
            result = super().run(*args, **kwargs)
            # the counts arrive through host callbacks, which JAX runs
            # asynchronously: wait for every pending one before reading them
            jax.effects_barrier()
        stats, self._chain_stats = self._chain_stats, []
        if stats:
            blocks, failed, bits = zip(*stats, strict=True)
            combined = (sum(blocks), sum(failed), int(np.bitwise_or.reduce(bits)))
            self._warn_failed_blocks(combined)
        if phase != "warmup":
            warn_if_unconverged(self)  # the draws' ESS and R-hat, once
        return result

    def _record_chain_stats(self, blocks, failed, bits) -> None:
        self._chain_stats.append((int(blocks), int(failed), int(bits)))

    def _warn_failed_blocks(self, stats) -> None:
        blocks, failed, bits = (int(s) for s in stats)
        if failed:
            on_failure = getattr(self.sampler, "on_failure", "sequential")
            warn_unconverged(failed, blocks, on_failure, bits, stacklevel=4)

    # ------------------------------------------------------------- loop fns
    def _loop_fns(self, collect_fields, remove_sites, batched, size, static):
        """The compiled loops for these settings, shared by every ``MCMC`` object.

        The model's array arguments are arguments of the compiled loops (never
        closed over), so new data of the same shape, or a buffer refilled in
        place, reuses them and is read afresh; ``static`` (see
        :func:`~numpyro_deer.infer.compile_cache.split_model_args`) holds the
        argument tree and its non-array leaves (Python numbers, strings,
        ``None``: the ones shapes depend on), compared by value. The loops are
        kept in :mod:`~numpyro_deer.infer.compile_cache` under the kernel's
        :meth:`compile_key` and these settings, so a second ``MCMC`` object for
        the same model, settings and shapes compiles none of them again; they
        are also listed on the object (``_block_fns``).
        """
        settings = (
            collect_fields,
            remove_sites,
            batched,
            size,
            self.thinning,
            static,
            self.postprocess_fn,
        )
        kernel_key = getattr(self.sampler, "compile_key", lambda: None)()
        shared = None if kernel_key is None else ("loops", kernel_key, settings)
        try:
            fns = self._block_fns.get((kernel_key, settings))
        except TypeError:  # unhashable non-array arguments: no caching
            return loops.build_loop_fns(self.sampler, *settings)
        if fns is None:
            fns = compile_cache.cached(
                shared, lambda: loops.build_loop_fns(self.sampler, *settings)
            )
            if shared is not None:
                # warmup does not depend on the blocks' method: one set of
                # warmup programs for all (method="auto" measures both, then
                # keeps one)
                warmup_key = ("warmup", self.sampler.compile_key(False), settings)
                warm = compile_cache.cached(
                    warmup_key, lambda: (fns.warmup, fns.step_size, fns.window_end)
                )
                fns = fns._replace(
                    warmup=warm[0], step_size=warm[1], window_end=warm[2]
                )
            self._block_fns[(kernel_key, settings)] = fns
        return fns

    # ------------------------------------------------------------------ run
    def _single_chain_mcmc(self, init, args, kwargs, collect_fields, remove_sites):
        if not is_block_kernel(self.sampler):
            return super()._single_chain_mcmc(
                init, args, kwargs, collect_fields, remove_sites
            )
        compat.check_mcmc_internals(self)
        rng_key, init_state, init_params = init
        init_state, init_program = self._initial_state(
            rng_key, init_state, init_params, args, kwargs
        )
        lower, upper, size, phase = compat.collection_params(self)
        thinning = self.thinning
        size = (upper - lower) // thinning if size is None else size // thinning
        start_idx = lower + (upper - lower) % thinning
        batched = jnp.ndim(init_state.i) > 0
        first, n_warmup = self._warmup_range(init_state, upper)
        dynamic, static = compile_cache.split_model_args(
            args, kwargs, self._jit_model_args
        )
        traced = isinstance(init_state.i, jax.core.Tracer)
        choose = self._method_to_choose(init_state, upper - n_warmup, batched, traced)

        def loop_fns():
            return self._loop_fns(collect_fields, remove_sites, batched, size, static)

        fns = loop_fns()
        with translate_tracer_errors():
            proto = jax.eval_shape(fns.collected, init_state, dynamic)
        total = upper - n_warmup
        # one entry at least: a run without warmup writes nothing to it
        trace_shape = (max(n_warmup, 1),) + jnp.shape(init_state.potential_energy)
        collection, trace = loops.zeros(
            (
                jax.tree.map(
                    lambda s: jax.ShapeDtypeStruct((size,) + s.shape, s.dtype), proto
                ),
                jax.ShapeDtypeStruct(
                    trace_shape, jnp.result_type(init_state.potential_energy)
                ),
            )
        )
        if traced:
            # inside pmap or jit: one compiled loop, no progress bar; the
            # failed-block counts travel out with the state (see _run_parallel)
            state, collection, stats, _, _ = fns.run_all(
                init_state, collection, trace, n_warmup, total, start_idx, dynamic
            )
            jax.debug.callback(self._record_chain_stats, *stats)
        else:
            with translate_tracer_errors():
                state, collection = self._run_on_host(
                    loop_fns,
                    init_state,
                    collection,
                    trace,
                    warmup_plan(self.sampler, first, n_warmup),
                    total,
                    start_idx,
                    phase,
                    dynamic,
                    batched,
                    choose,
                    fns.checked,
                    init_program,
                )
        if len(collect_fields) == 1:
            collection = (collection,)
        return dict(zip(collect_fields, collection, strict=True)), state

    def _initial_state(self, rng_key, init_state, init_params, args, kwargs):
        """``(state, init_program)``: the run's initial state, and how to
        compute it if that is left to the run.

        A block kernel starting afresh on the host (no state given, no mesh,
        not inside ``pmap``) gives ``init_program`` (``(program, arguments)``,
        see :meth:`~numpyro_deer.infer.kernel._DEERKernel.init_program`) and
        ``state`` holds only its shapes and dtypes: :meth:`_run_on_host`
        compiles the program beside the warmup loop and the blocks, whose
        compiles start from those shapes. Otherwise ``init_program`` is
        ``None``.
        """
        kernel = self.sampler
        if init_state is not None and getattr(kernel, "_sample_fn", None) is not None:
            return init_state, None
        if hasattr(kernel, "fit_block_size"):
            # NumPyro's num_samples counts the steps, thinning included
            kernel.fit_block_size(self.num_samples)
        data = {"model_args": args, "model_kwargs": kwargs}
        if (
            init_state is None
            and hasattr(kernel, "init_program")
            and getattr(kernel, "mesh", None) is None
            and not isinstance(rng_key, jax.core.Tracer)
        ):
            program, arguments = kernel.init_program(
                rng_key, self.num_warmup, init_params, **data
            )
            with translate_tracer_errors():
                shapes, _ = jax.eval_shape(program, *arguments)
            return shapes, (program, arguments)
        state = kernel.init(rng_key, self.num_warmup, init_params, **data)
        return (state if init_state is None else init_state), None

    def _check_block_memory(self, name: str, compiled, checked: set) -> None:
        """Compare a compiled block program's memory with the device's.

        Raises ``ValueError`` with a ``block_size`` that fits, before the
        block runs. Devices without memory statistics (the CPU) are not
        checked, and each block program once.
        """
        free = memory.free_device_bytes()
        if free is None or name in checked:
            return
        memory.check_block_memory(
            memory.compiled_bytes(compiled),
            free,
            self.sampler.block_size,
            kernel=type(self.sampler).__name__,
            multiple=getattr(self.sampler, "block_multiple", 1),
        )
        checked.add(name)

    def _warmup_range(self, state, upper: int) -> tuple[int, int]:
        """``(first, steps)``: the iteration count this ``run`` starts from,
        and how many of its loop iterations are warmup steps."""
        if isinstance(state.i, jax.core.Tracer):
            first = self.num_warmup if compat.has_post_warmup_state(self) else 0
        elif isinstance(state.i, jax.ShapeDtypeStruct):
            first = 0  # a fresh state, still to compute (see _initial_state)
        else:
            first = int(np.min(np.asarray(state.i)))
        return first, max(0, min(upper, self.num_warmup - first))

    def _method_to_choose(self, state, total: int, batched: bool, traced: bool):
        """Whether this run measures which method is faster (``method="auto"``).

        Only on an accelerator, until a run has measured both methods, when
        the first block step solves a block and the run has at least two
        blocks. Otherwise an ``"auto"`` kernel without a choice takes the
        device's rule (a provisional choice is kept).
        """
        kernel = self.sampler
        if getattr(kernel, "method", None) != "auto":
            return False
        current = kernel.method_choice
        if current is not None and current.final:
            return False
        choice = device_choice()
        size = loops.buffer_size(state, batched)
        if (
            choice.method == "sequential"
            or traced
            or total < 2 * size
            # a fresh state (still to compute, see _initial_state) needs one
            or not (
                isinstance(state.i, jax.ShapeDtypeStruct)
                or bool(loops.all_need_refill(state, batched))
            )
        ):
            if current is None:
                self._choose(choice)
            return False
        return True

    def _check_warmup(self, trace, n_warmup: int) -> None:
        """Warn if a chain was still in transit at the end of a full warmup."""
        if n_warmup == 0 or n_warmup < self.num_warmup:
            return
        energies = np.asarray(trace)
        energies = energies.T if energies.ndim == 2 else energies[None]
        message = warmup_transit(energies, n_warmup)
        if message is not None:
            warnings.warn(message, WarmupTransitWarning, stacklevel=5)

    def _run_on_host(
        self,
        loop_fns,
        state,
        collection,
        trace,
        plan,
        total,
        start_idx,
        phase,
        dynamic,
        batched,
        choose,
        checked,
        init_program,
    ):
        """Warmup in chunks, then one block per call, from the host.

        The initial state's program (``init_program``, if the state is still
        to compute: ``state`` holds its shapes), the step size search, the
        warmup loop, the Hessian window end (as the warmup ``plan`` needs
        them) and the block programs are lowered, then compiled in the
        background, side by side
        (:class:`~numpyro_deer.infer.host_run.Programs`); each runs as soon as
        its own compile is done, and a block program's memory is checked
        before its first block. The progress bar advances
        after each warmup chunk and each block. To measure the methods of
        ``method="auto"`` (``choose``) the first block after warmup is computed
        sequentially, the first block after the DEER program is compiled with
        DEER, and the faster computes the rest; blocks in between are
        sequential. A run that ends before DEER is compiled keeps a
        provisional choice (``MethodChoice.final`` false), measured again by
        the next run.
        """  # fmt: skip
        kernel = self.sampler
        start = i32(start_idx)
        trials = ["sequential", "deer"] if choose else []
        methods = (trials or [kernel_method(kernel)]) if total > 0 else []
        stages = (["warmup"] if plan.steps else []) + [f"{m} blocks" for m in methods]

        def set_trial(name):
            kernel._trial_method = name

        with Progress(plan.steps + total, self.progress_bar, phase) as progress:
            if stages:
                progress.compiling(" and ".join(stages))
            lowered = lower_programs(
                init_program, loop_fns, plan, methods, bool(trials), state,
                collection, trace, total, start, dynamic, set_trial,
            )  # fmt: skip
            programs = Programs(
                lowered,
                progress,
                partial(self._check_block_memory, checked=checked),
                placed=getattr(kernel, "mesh", None) is not None,
            )
            if init_program is not None:
                state = initial_state(programs, kernel, init_program, plan, dynamic)
            if plan.steps:
                state, collection, trace = run_warmup(
                    programs, progress, (state, collection, trace), plan, start,
                    dynamic,
                )  # fmt: skip
                self._check_warmup(trace, plan.steps)
            state, collection, stats = run_blocks(
                programs, progress, kernel, trials, self._choose,
                (state, collection), plan.steps, total, start, dynamic, batched,
            )  # fmt: skip
        self._warn_failed_blocks(stats)
        return state, collection

    def _choose(self, choice) -> None:
        self.sampler._set_method_choice(choice)
        logger.info("method='auto': %s (%s)", choice.method, choice.reason)
