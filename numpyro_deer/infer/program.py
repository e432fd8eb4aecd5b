"""A block kernel's run, as pure functions: :class:`BlockProgram`.

A kernel's ``init`` sets the model up once (NumPyro's ``initialize_model``,
the latent layout, the block size fitted to the run, the mass adaptation
resolved) and freezes the result, with the kernel's
:class:`~numpyro_deer.infer.settings.KernelSettings`, into a
:class:`BlockProgram` whose methods are the run's steps, each a pure function
of the state and the model's arguments (as NumPyro's ``hmc()`` returns
``init_kernel, sample_kernel`` under a thin ``HMC``): :meth:`~BlockProgram.warmup`,
:meth:`~BlockProgram.step_size`, :meth:`~BlockProgram.window_end`,
:meth:`~BlockProgram.refill` (a block by the method passed in) and
:meth:`~BlockProgram.emit`. Called with a state, it is the kernel's ``sample``
for ``numpyro.infer.MCMC``; :class:`numpyro_deer.MCMC` compiles the same
functions into its loops (:mod:`~numpyro_deer.infer.loops`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from numpyro.infer.hmc_util import build_adaptation_schedule
from numpyro.util import identity

from ..core.warmup_cost import gradients_per_transition
from . import compile_cache, lowering
from .block import emit_draw
from .chains import float_params, map_chains, on_cpu
from .checks import translate_tracer_errors
from .convergence import raise_unconverged, warn_unconverged
from .hessian_mass import hessian_mass, hessian_window_ends, is_hessian_window_end
from .initial import check_initial, initial_state
from .refill import refill_chains
from .settings import KernelSettings
from .trajectory import choose_num_steps
from .warmup import (
    Adapter,
    build_adapter,
    restart_step_size,
    shared_schedule,
    warmup_step,
)

MATMUL_PRECISION = "highest"
"""Precision of the kernel's matrix products (``jax.default_matmul_precision``):
float32 products are not computed in TF32 on GPUs, which would make the batched
and the sequential evaluation of a step differ far beyond float32 rounding."""


@dataclasses.dataclass(frozen=True, eq=False)
class BlockProgram:
    """A kernel's run after ``init``: its settings, the model's set-up and
    the run's sizes, frozen; the run's steps as pure functions.

    Attributes:
        settings: the kernel's settings.
        model: the NumPyro model, or ``None`` (a potential function).
        potential_fn: the potential given instead of a model, else ``None``.
        potential_fn_gen: NumPyro's ``potential_fn(*args, **kwargs)``
            builder, or ``None``.
        postprocess_fn: NumPyro's ``postprocess_fn`` builder, or ``None``.
        unravel: flat unconstrained values -> one chain's latent dict.
        num_warmup: warmup steps of the run.
        block_size: transitions per block of the run (fitted to it).
        mass_adaptation: ``"hessian"``, ``True`` or ``False`` (``"auto"``
            resolved).
        latent: the latent values' structure, shapes and dtypes.
        method: the method blocks are computed with in :meth:`__call__`
            (stock ``MCMC``); :class:`numpyro_deer.MCMC` passes its own.
        sites_message: ``() -> str``, the sites whose log density is not
            finite at the initial values (for the error).
        warned: the warnings the kernel's current run gave already (each
            is given once per run): the kernel's set, cleared by each
            ``init``, so a sampler NumPyro compiled for an earlier run
            reports to the current one.
    """

    settings: KernelSettings
    model: Callable | None
    potential_fn: Callable | None
    potential_fn_gen: Callable | None
    postprocess_fn: Callable | None
    unravel: Callable
    num_warmup: int
    block_size: int
    mass_adaptation: bool | str
    latent: tuple
    method: str
    sites_message: Callable[[], str]
    warned: set = dataclasses.field(default_factory=set)

    def first_warning(self, name: str) -> bool:
        """Whether warning ``name`` is given for the first time this run."""
        new = name not in self.warned
        self.warned.add(name)
        return new

    # ----------------------------------------------------------- derived
    def key(self, method: str | None) -> tuple:
        """What the run's traced functions depend on besides their arguments:
        the model (or potential), the settings, the run's sizes and the
        latent layout; ``method`` that of the blocks (``None``: warmup's
        programs, which depend neither on it nor on the solver). Programs
        with equal keys are shared (:mod:`~numpyro_deer.infer.compile_cache`)."""
        return (
            self.model if self.model is not None else self.potential_fn,
            self.settings.key(blocks=method is not None),
            method,
            self.block_size,
            self.mass_adaptation,
            self.num_warmup,
            self.latent,
            MATMUL_PRECISION,
        )

    @property
    def adapts_step_size(self) -> bool:
        """Whether warmup searches and adapts the step size."""
        return self.settings.adapt_step_size

    @property
    def window_ends(self) -> tuple[int, ...]:
        """The iteration counts ``state.i`` after which warmup takes the
        Hessian mass (``()`` unless the mass matrix is the Hessian one):
        :class:`numpyro_deer.MCMC` runs its warmup loop with
        ``window_end=False`` and, at each of these counts,
        :meth:`window_end` then :meth:`step_size`, as programs of their own."""
        if self.mass_adaptation != "hessian":
            return ()
        return hessian_window_ends(self.num_warmup)

    def potential_flat(self, args, kwargs) -> Callable:
        """The potential energy on one chain's flat unconstrained values,
        tracing the model once per shape (:func:`~.compile_cache.flat_potential`)."""
        return compile_cache.flat_potential(
            self.potential_fn, self.potential_fn_gen, self.unravel, args, kwargs
        )

    def postprocess(self, args, kwargs) -> Callable:
        """NumPyro's postprocessing of one chain's latent values."""
        if self.postprocess_fn is None:
            return identity
        return self.postprocess_fn(*args, **({} if kwargs is None else kwargs))

    def adapter(self, potential_flat: Callable) -> Adapter:
        """NumPyro's ``warmup_adapter`` for this run
        (:func:`~.warmup.build_adapter`)."""
        s = self.settings
        return build_adapter(
            potential_flat,
            self.num_warmup,
            mass_adaptation=self.mass_adaptation,
            dense_mass=s.dense_mass,
            adapt_step_size=s.adapt_step_size,
            target_accept_prob=s.target_accept_prob,
            transition=s.transition,
        )

    # ----------------------------------------------------------- steps
    def initial(self, params, key, args, kwargs, search: Callable | None):
        """``(state, valid)``: one chain's initial state at ``params``, or
        (``search``, :func:`~.initial.find_initial_params`) at the values
        NumPyro's search finds from a key split off ``key``; NumPyro's step
        size search is :meth:`step_size`'s."""
        key, key_model = jax.random.split(key)
        valid = jnp.ones((), bool)
        if search is not None:
            with translate_tracer_errors():
                params, valid = search(key_model, args, kwargs)
        potential_flat = self.potential_flat(args, kwargs)
        with _precision():
            state = initial_state(
                float_params(params), key, potential_flat,
                self.adapter(potential_flat).init, self.settings.step_size,
                self.block_size, gradients_per_transition(self.settings.transition),
            )  # fmt: skip
        return state, valid

    def initialized(self, output):
        """The state the initial program computed (``output``: the state, and
        whether NumPyro's search found valid values), placed over the mesh
        (if any) and checked.

        Raises:
            RuntimeError: NumPyro's search found no valid initial values (the
                message names the sites whose log density is not finite).
            ValueError: a chain's initial potential energy is not finite.
        """
        state, valid = output
        check_initial(valid, state.potential_energy, self.sites_message)
        mesh = self.settings.mesh
        if mesh is not None:
            state = mesh.place(state, chains=jnp.ndim(state.i) > 0)
        return state

    def step_size(self, state, use, args, kwargs, batched: bool = False):
        """NumPyro's step size search and restart where ``use`` (one flag per
        chain if batched; :func:`~.warmup.restart_step_size`): after the
        initial state, and after a Hessian window end."""
        with _precision(), translate_tracer_errors():
            find = self.adapter(self.potential_flat(args, kwargs)).find_step_size

            def one(s, u):
                x = ravel_pytree(s.z)[0]
                adapt = restart_step_size(s.adapt_state, x, find, u)
                return s._replace(adapt_state=adapt)

            if batched:
                return self._map_chains(lambda a: one(*a), (state, use))
            return one(state, use)

    def window_end(self, state, args, kwargs, batched: bool = False):
        """``(state, finite)``: each chain's metric the inverse mean Hessian at
        its curvature points where that is finite
        (:func:`~.hessian_mass.hessian_mass`); its step size is
        :meth:`step_size`'s, where ``finite``."""
        potential_flat = self.potential_flat(args, kwargs)

        def one(s):
            adapt, finite = hessian_mass(
                s.adapt_state, potential_flat, s.curvature_points, batched
            )
            return s._replace(adapt_state=adapt), finite

        with _precision(), translate_tracer_errors():
            return self._map_chains(one, state) if batched else one(state)

    def warmup(self, state, args, kwargs, batched: bool = False, window_end=True):
        """One warmup step: the transition in the current metric, then
        NumPyro's adaptation (:func:`~.warmup.warmup_step`).

        With the Hessian mass and ``window_end``, a step that ends a middle
        window of NumPyro's schedule is followed by :meth:`window_end` then
        :meth:`step_size`, under one ``cond`` for all chains (they share the
        iteration count); ``window_end=False`` leaves that to the caller
        (:attr:`window_ends`).
        """
        with _precision(), translate_tracer_errors():
            potential_flat = self.potential_flat(args, kwargs)
            step = partial(
                warmup_step,
                potential_flat=potential_flat,
                adapter_update=self.adapter(potential_flat).update,
                num_warmup=self.num_warmup,
                unravel=self.unravel,
                transition=self.settings.transition,
            )
            shared = shared_schedule(step, state) if batched else step
            new = self._map_chains(shared, state) if batched else step(state)
            if self.settings.adapt_num_steps:
                new = choose_num_steps(new, self.num_warmup)
        if not (window_end and self.mass_adaptation == "hessian"):
            return new
        first = (lambda t: jax.tree.map(lambda a: a[0], t)) if batched else identity
        num_windows = len(build_adaptation_schedule(self.num_warmup))
        ends = is_hessian_window_end(
            first(state.adapt_state), first(new.adapt_state), num_windows
        )

        def end(s):
            s, finite = self.window_end(s, args, kwargs, batched)
            if not self.adapts_step_size:
                return s
            return self.step_size(s, finite, args, kwargs, batched)

        new = jax.lax.cond(ends, end, identity, new)
        mesh = self.settings.mesh
        return new if mesh is None or not batched else mesh.split_chains(new)

    def refill(
        self,
        state,
        args,
        kwargs,
        method: str,
        batched: bool = False,
        stragglers: bool | None = None,
    ):
        """A new block by ``method`` (``"deer"`` or ``"sequential"``) where the
        buffer is used up or the key was replaced; with
        ``on_failure="raise"`` an unconverged block raises from the host.

        Batched DEER blocks off the CPU (``stragglers`` overrides) are solved
        side by side with the unconverged chains set apart
        (:func:`~.refill.refill_chains`); on the CPU
        :func:`~.chains.map_chains` runs one chain at a time."""
        s = self.settings
        stragglers = not on_cpu() if stragglers is None else stragglers
        with _precision(), translate_tracer_errors():
            potential = self.potential_flat(args, kwargs)
            # only a run without warmup starts with coinciding curvature points
            fresh, new = refill_chains(
                state, potential, s, method, batched, stragglers,
                self._map_chains, pilot=self.num_warmup == 0,
            )  # fmt: skip
        if s.on_failure == "raise":
            result = jnp.where(fresh, new.block.info.result, 0)
            jax.lax.cond(
                jnp.any(result != 0),
                lambda: jax.debug.callback(raise_unconverged, result),
                lambda: None,
            )
        return new

    def emit(self, state, k, batched: bool = False):
        """The state after handing out buffer entry ``k`` (all chains if batched)."""
        emit = partial(emit_draw, unravel=self.unravel, num_warmup=self.num_warmup)
        if batched:
            return jax.vmap(emit, in_axes=(0, None))(state, k)
        return emit(state, k)

    def __call__(self, state, args, kwargs):
        """One draw, for ``numpyro.infer.MCMC``: a warmup step, or the next
        entry of the (refilled) block. Vectorized chains share one iteration
        count and one block index, so both branches are chosen once for all.
        """
        batched = jnp.ndim(state.i) > 0

        def warmup(s):
            return self.warmup(s, args, kwargs, batched)

        def sampling(s):
            s = self.refill(s, args, kwargs, self.method, batched)
            index = s.block.index[0] if batched else s.block.index
            if self.settings.on_failure != "raise":  # raised by the refill
                # a block just solved (index 0) that did not converge
                failed = (index == 0) & ~s.block.info.converged
                jax.lax.cond(
                    jnp.any(failed),
                    lambda: jax.debug.callback(
                        self._report_unconverged,
                        jnp.sum(failed, dtype=jnp.int32),
                        jnp.max(jnp.where(failed, s.block.info.result, 0)),
                    ),
                    lambda: None,
                )
            return self.emit(s, index, batched)

        i = state.i[0] if batched else state.i
        with _precision(), translate_tracer_errors():
            return jax.lax.cond(i < self.num_warmup, warmup, sampling, state)

    def _report_unconverged(self, failed, result) -> None:
        if self.first_warning("unconverged"):
            s = self.settings
            warn_unconverged(
                int(failed), None, s.on_failure, 1 << int(result), 2, s.kernel
            )

    def _map_chains(self, fn, state):
        """``fn`` over the chains: split over the mesh's chain axis with a
        mesh (:meth:`~.mesh.TimeMesh.map_chains`), else :func:`~.chains.map_chains`
        (in groups of ``settings.chain_group`` chains, if set)."""
        s = self.settings
        if s.mesh is not None:
            return s.mesh.map_chains(fn, state)
        return map_chains(fn, state, s.chain_group)

    # ------------------------------------------------------ compiled
    def compiled_initial(self, static, vectorized: bool, search: Callable | None):
        """:meth:`initial` jitted, ``(params, key, dynamic args) -> (state,
        valid)``, one chain's or (``vectorized``) every chain's, with the
        model's array arguments as arguments (see
        :func:`~.compile_cache.split_model_args`); cached under :meth:`key`."""
        strategy = None if search is None else self.settings.init_strategy

        def build():
            def init_one(params, key, dynamic):
                args, kwargs = compile_cache.join_model_args(static, dynamic)
                return self.initial(params, key, args, kwargs, search)

            fn = init_one
            if vectorized:
                fn = jax.vmap(init_one, in_axes=(0, 0, None))
            return lowering.jit(fn, runs_briefly=True)

        key = ("init", self.key(None), vectorized, static, strategy)
        return compile_cache.cached(key, build)

    def compiled_step_size(self, static, vectorized: bool):
        """:meth:`step_size` jitted, ``(state, use, dynamic args) -> state``."""

        def build():
            def step_size(state, use, dynamic):
                args, kwargs = compile_cache.join_model_args(static, dynamic)
                return self.step_size(state, use, args, kwargs, vectorized)

            return lowering.jit(step_size, runs_briefly=True)

        key = ("step size", self.key(None), vectorized, static)
        return compile_cache.cached(key, build)


def _precision():
    return jax.default_matmul_precision(MATMUL_PRECISION)
