"""``numpyro_deer.MCMC``: a drop-in ``numpyro.infer.MCMC`` advancing a block per loop.

Stock ``MCMC`` calls the kernel once per draw; on a GPU that loop alone costs
more than a sequential MALA step (see the performance page of the docs). For a
block kernel (:class:`~numpyro_deer.infer.protocol.BlockKernel`, such as
:class:`~numpyro_deer.DEERMALA`) this driver instead

* runs warmup as a compiled loop of the run's own warmup step (so warmup is
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
(:mod:`~numpyro_deer.infer.host_run`); every ``MCMC`` object with the same
model, settings and shapes shares them (:mod:`~numpyro_deer.infer.compile_cache`).
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
    HostRun,
    Programs,
    block_methods,
    i32,
    initial_state,
    kernel_method,
    lower_programs,
    program_in_groups,
    run_blocks,
    run_warmup,
    warmup_plan,
)
from .keys import chain_keys
from .method import device_choice
from .progress import Progress
from .protocol import is_block_kernel
from .transit import WarmupTransitWarning, warmup_transit

logger = logging.getLogger("numpyro_deer")

__all__ = ["MCMC", "DEERConvergenceError", "DEERConvergenceWarning"]


class MCMC(numpyro.infer.MCMC):
    """``numpyro.infer.MCMC`` with a fast path for block kernels.

    Same constructor, methods and results as :class:`numpyro.infer.MCMC`. With
    a block kernel (:class:`~numpyro_deer.DEERMALA`,
    :class:`~numpyro_deer.DEERHMC`: :class:`~numpyro_deer.infer.protocol.BlockKernel`)
    it advances one block of draws per loop iteration; other kernels run
    exactly as in NumPyro.

    Args:
        sampler: the kernel.
        num_warmup: warmup steps per chain.
        num_samples: draws per chain (steps, thinning included).
        num_chains: chains.
        thinning: keep every ``thinning``-th draw.
        postprocess_fn: NumPyro's post-processing of the latent values
            (default: the kernel's).
        chain_method: ``"parallel"``, ``"sequential"`` or ``"vectorized"``.
        progress_bar: show a progress bar (with the draws per second).
        progress_rate: NumPyro's progress bar update rate (stock loop only).
        jit_model_args: compile the model arguments as arguments (NumPyro's).

    Example::

        from numpyro_deer import DEERMALA, MCMC

        mcmc = MCMC(DEERMALA(model), num_warmup=1000, num_samples=100_000)
        mcmc.run(jax.random.PRNGKey(0), X, y)
    """

    def __init__(
        self,
        sampler,
        *,
        num_warmup: int,
        num_samples: int,
        num_chains: int = 1,
        thinning: int = 1,
        postprocess_fn=None,
        chain_method: str = "parallel",
        progress_bar: bool = True,
        progress_rate: int | None = None,
        jit_model_args: bool = False,
    ):
        super().__init__(
            sampler,
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            thinning=thinning,
            postprocess_fn=postprocess_fn,
            chain_method=chain_method,
            progress_bar=progress_bar,
            progress_rate=progress_rate,
            jit_model_args=jit_model_args,
        )
        self._chain_stats = []
        self._flat_collection = None

    def __getstate__(self):
        state = super().__getstate__()
        state["_chain_stats"] = []
        state["_flat_collection"] = None
        return state

    def run(self, rng_key, *args, **kwargs):
        # pmap's chains (chain_method="parallel") report failed blocks: warn once
        self._chain_stats = []
        self._flat_collection = None
        phase = compat.run_phase(self)  # "warmup" inside warmup()
        block = is_block_kernel(self.sampler)
        keys = chain_keys(rng_key, self.num_chains)  # NumPyro's split, no compile
        with reraise_convergence_error(), compat.chains_first_on_the_host(self, block):
            result = super().run(keys, *args, **kwargs)
            # host callbacks bring the counts asynchronously: wait for them all
            jax.effects_barrier()
        if self._flat_collection is not None:
            # one chain: the flat draws are the block loop's own collection
            compat.set_flat_states(self, self._flat_collection)
            self._flat_collection = None
        stats, self._chain_stats = self._chain_stats, []
        if stats:
            blocks, failed, bits = zip(*stats, strict=True)
            combined = (sum(blocks), sum(failed), int(np.bitwise_or.reduce(bits)))
            self._warn_failed_blocks(combined)
        if phase != "warmup":
            warn_if_unconverged(self)  # the draws' ESS and R-hat, once
        return result

    def _get_states_flat(self):  # reshaped on the host, no compile per field
        compat.flat_states_on_the_host(self)
        return super()._get_states_flat()

    def _record_chain_stats(self, blocks, failed, bits) -> None:
        self._chain_stats.append((int(blocks), int(failed), int(bits)))

    def _warn_failed_blocks(self, stats) -> None:
        # one transfer from the device for the three counters
        blocks, failed, bits = (int(s) for s in jax.device_get(tuple(stats)))
        if failed:
            kernel = self.sampler
            warn_unconverged(
                failed, blocks, kernel.on_failure, bits, 4, type(kernel).__name__
            )

    # ------------------------------------------------------------------ run
    def _single_chain_mcmc(self, init, args, kwargs, collect_fields, remove_sites):
        if not is_block_kernel(self.sampler):
            return super()._single_chain_mcmc(
                init, args, kwargs, collect_fields, remove_sites
            )
        compat.check_mcmc_internals(self)
        kernel = self.sampler
        rng_key, init_state, init_params = init
        init_state, init_program = self._initial_state(
            rng_key, init_state, init_params, args, kwargs
        )
        program = kernel.program
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
        total = upper - n_warmup
        choose = self._method_to_choose(init_state, total, batched, traced)
        settings = loops.LoopSettings(
            tuple(collect_fields),
            tuple(remove_sites),
            batched,
            size,
            thinning,
            static,
            self.postprocess_fn,
            collect_warmup=start_idx < n_warmup,
        )

        def fns(method, chain_group=None):
            grouped = memory.with_chain_group(program, chain_group)
            return loops.loop_fns(grouped, method, settings)

        method = kernel_method(kernel)
        with translate_tracer_errors():
            proto = jax.eval_shape(fns(method).collected, init_state, dynamic)
        # the warmup trace: one entry at least (a run without warmup writes none)
        energy = init_state.potential_energy
        trace = jax.ShapeDtypeStruct(
            (max(n_warmup, 1),) + jnp.shape(energy), jnp.result_type(energy)
        )
        collection = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((size,) + s.shape, s.dtype), proto
        )
        if traced:
            # inside pmap or jit: one compiled loop, no progress bar; the
            # failed-block counts travel out with the state (see _run_parallel)
            collection, trace = loops.zeros((collection, trace))
            state, collection, stats, _, _ = fns(method).run_all(
                init_state, collection, trace, n_warmup, total, start_idx, dynamic
            )
            jax.debug.callback(self._record_chain_stats, *stats)
        else:
            run = HostRun(
                kernel=kernel,
                fns=fns,
                init=init_program,
                plan=warmup_plan(program, first, n_warmup),
                total=total,
                start=i32(start_idx),
                dynamic=dynamic,
                batched=batched,
            )
            with translate_tracer_errors():
                state, collection = self._run_on_host(
                    run, (init_state, collection, trace), phase, choose
                )
        if len(collect_fields) == 1:
            collection = (collection,)
        collected = dict(zip(collect_fields, collection, strict=True))
        if self.num_chains == 1 and not traced:
            self._flat_collection = collected
        return collected, state

    def _initial_state(self, rng_key, init_state, init_params, args, kwargs):
        """``(state, init_program)``: the run's initial state, and how to
        compute it if that is left to the run.

        A block kernel starting afresh on the host (no state given, no mesh,
        not inside ``pmap``) gives ``init_program``
        (:class:`~numpyro_deer.infer.kernel.InitProgram`) and ``state`` holds
        only its shapes and dtypes (traced as it is lowered: one trace serves
        both): :meth:`_run_on_host` compiles the program beside the warmup
        loop and blocks, whose compiles start from those shapes. Otherwise
        ``init_program`` is ``None``. Either way the kernel's blocks are fitted
        to the run (NumPyro's ``num_samples`` counts steps, thinning included).
        """
        kernel = self.sampler
        if init_state is not None and kernel.program is not None:
            return init_state, None
        data = {"model_args": args, "model_kwargs": kwargs}
        init = kernel.init_program(
            rng_key, self.num_warmup, init_params, **data, num_samples=self.num_samples
        )
        if (
            init_state is None
            and kernel.mesh is None
            and not isinstance(rng_key, jax.core.Tracer)
        ):
            with translate_tracer_errors():
                shapes, _ = compile_cache.eval_shape(init.program, *init.arguments)
            return shapes, init
        if init_state is not None:
            return init_state, None
        return kernel.start(init), None

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
        """Whether this run measures which method is faster (``method="auto"``):
        on an accelerator, in one process (each would go by its own clock),
        until a run measured both, when the first block step solves a whole
        block. Else an ``"auto"`` kernel without a choice takes the device's
        rule (a provisional choice is kept)."""
        kernel = self.sampler
        if kernel.method != "auto":
            return False
        current = kernel.method_choice
        if current is not None and current.final:
            return False
        choice = device_choice()
        size = loops.buffer_size(state, batched)
        if (
            choice.method == "sequential"
            or traced
            or jax.process_count() > 1
            or total < size
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

    def _run_on_host(self, run: HostRun, carry, phase, choose: bool):
        """Warmup in chunks, then one block per call, from the host (``carry``'s
        collection and trace: shapes, made zero once the programs are lowered).

        The initial state's program (``run.init``, if the state is still to
        compute: ``carry``'s state holds its shapes), the step size search,
        the warmup loop, the Hessian window end (as the warmup plan needs
        them) and the block programs (:func:`~.host_run.block_methods`) are
        lowered, then compiled in the background, side by side (``Programs``);
        each runs once compiled, a block program's memory checked before its
        first block. The progress bar advances after each warmup chunk and
        each block. To measure the methods of ``method="auto"``
        (``choose``) the first block after warmup is computed sequentially,
        the first block after the DEER program is compiled with DEER, and the
        faster computes the rest; blocks in between are sequential. A run that
        ends before DEER is compiled, or of one block (DEER not lowered),
        keeps a provisional choice (``final`` false), completed later.
        """
        kernel, plan = run.kernel, run.plan
        trials = ["sequential", "deer"] if choose else []
        methods = block_methods(run, carry[0], trials)
        stages = (["warmup"] if plan.steps else []) + [f"{m} blocks" for m in methods]
        state, collection, trace = carry
        with Progress(plan.steps + run.total, self.progress_bar, phase) as progress:
            if stages:
                progress.compiling(" and ".join(stages))
            lowered = lower_programs(
                run, state, collection, trace, methods, bool(trials)
            )
            checked = run.fns(kernel_method(kernel)).checked
            programs = Programs(
                lowered,
                progress,
                partial(
                    memory.fit_program,
                    kernel,
                    self.num_chains,
                    run,
                    checked=checked,
                    grouped=partial(program_in_groups, run),
                    ungrouped=tuple(trials[1:]),  # method="auto": DEER never grouped
                ),
                placed=kernel.mesh is not None,
            )
            # the zero collection's program compiles here, beside the others
            collection, trace = loops.zeros((collection, trace))
            if run.init is not None:
                state = initial_state(programs, run)
            if plan.steps:
                state, collection, trace = run_warmup(
                    programs, progress, (state, collection, trace), run
                )
                self._check_warmup(trace, plan.steps)
            state, collection, stats = run_blocks(
                programs, progress, run, trials, self._choose, (state, collection)
            )
        self._warn_failed_blocks(stats)
        return state, collection

    def _choose(self, choice) -> None:
        self.sampler.remember_method(choice)
        logger.info("method='auto': %s (%s)", choice.method, choice.reason)
