"""The NumPyro kernel: a taped transition solved in blocks by DEER.

:class:`_DEERKernel` is the kernel for any :class:`~numpyro_deer.core.Transition`
(initialisation, warmup with NumPyro's adaptation, the block buffer, the
failure policy). A transition's public kernel subclasses it:
:class:`~numpyro_deer.DEERMALA` (:mod:`numpyro_deer.infer.mala`) for MALA.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import identity, is_prng_key

from ..core.newton import DEERSolver
from ..core.transition import Transition
from . import compile_cache
from .arguments import check_kernel_arguments
from .block import emit_draw, needs_refill, refill_block
from .chains import (
    check_initial_potential,
    float_params,
    has_chain_axis,
    latent_layout,
    map_chains,
    on_cpu,
)
from .checks import (
    UnsupportedModelError,
    non_finite_sites_message,
    translate_tracer_errors,
)
from .convergence import raise_unconverged, warn_unconverged
from .hessian_mass import hessian_mass, hessian_window_ends, resolve_mass_adaptation
from .initial import (
    check_initial_values,
    find_initial_params,
    initial_state,
    initialize,
)
from .memory import check_buffer_memory
from .mesh import MESH_CHOICE, check_chains, check_mesh, fit_to_mesh
from .method import (
    SLOW_DRIVER_MESSAGE,
    MethodChoice,
    SlowDriverWarning,
    device_method,
    fitted_block_size,
)
from .warmup import (
    Adapter,
    batched_hessian_window_end,
    build_adapter,
    restart_step_size,
    warmup_step,
)

MATMUL_PRECISION = "highest"
"""Precision of the kernel's matrix products (``jax.default_matmul_precision``):
float32 products are not computed in TF32 on GPUs, which would make the batched
and the sequential evaluation of a step differ far beyond float32 rounding."""


class _DEERKernel(MCMCKernel):
    """A taped transition as a NumPyro kernel whose blocks DEER solves.

    ``transition`` is the :class:`~numpyro_deer.core.Transition` (warmup takes
    one :meth:`~numpyro_deer.core.Transition.step` per draw on a one-step tape;
    sampling solves blocks of its steps); the other arguments are those of
    :class:`~numpyro_deer.DEERMALA`. Subclasses fix the transition and document the
    arguments.
    """

    sample_field = "z"

    def __init__(
        self,
        transition: Transition,
        model: Callable | None = None,
        potential_fn: Callable | None = None,
        *,
        step_size: float = 1.0,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool | str = "auto",
        dense_mass: bool = False,
        target_accept_prob: float = 0.9,
        init_strategy: Callable = init_to_uniform,
        block_size: int = 4096,
        method: str = "auto",
        solver: DEERSolver = DEERSolver(),
        on_failure: str = "sequential",
        validate_model: bool = True,
        mesh: Mesh | None = None,
    ):
        name = type(self).__name__
        check_kernel_arguments(
            name,
            model=model,
            potential_fn=potential_fn,
            step_size=step_size,
            adapt_step_size=adapt_step_size,
            adapt_mass_matrix=adapt_mass_matrix,
            dense_mass=dense_mass,
            target_accept_prob=target_accept_prob,
            block_size=block_size,
            method=method,
            solver=solver,
            on_failure=on_failure,
        )
        self._mesh = check_mesh(name, mesh, block_size, method)
        self._transition = transition
        self._solver = solver
        self._method = method
        self._on_failure = on_failure
        self._model = model
        self._potential_fn = potential_fn
        self._step_size = float(step_size)
        self._block_size = int(block_size)
        # the block size of the run: fitted to it by numpyro_deer.MCMC
        self._run_block_size = self._block_size
        self._run_steps = None
        # with a mesh, blocks are DEER solves: nothing to measure
        self._method_choice = None if self._mesh is None else MESH_CHOICE
        self._trial_method = None
        self._warned_slow_driver = False
        self._adapt_step_size = adapt_step_size
        self._adapt_mass_matrix = adapt_mass_matrix
        # "auto" resolved against the latent dimension at init
        self._mass_adaptation = adapt_mass_matrix
        self._dense_mass = dense_mass
        self._target_accept_prob = target_accept_prob
        self._init_strategy = init_strategy
        self._validate_model = validate_model
        self._num_warmup = 0
        self._potential_fn_gen = None
        self._postprocess_fn = None
        self._unravel = None
        self._sites_message = None
        self._latent = None
        self._sample_fn = None
        self._step_size_fn = None
        self._warned_unconverged = False

    # ------------------------------------------------------------------ props
    @property
    def model(self):
        return self._model

    @property
    def block_size(self) -> int:
        """Transitions per block: ``block_size``, or after :meth:`init` under
        :class:`numpyro_deer.MCMC` the size fitted to the run (see
        :func:`~numpyro_deer.infer.method.fitted_block_size`)."""
        return self._run_block_size

    @property
    def method(self) -> str:
        """The ``method`` argument: ``"auto"``, ``"deer"`` or ``"sequential"``."""
        return self._method

    @property
    def method_chosen(self) -> str:
        """The method blocks are computed with: ``method`` unless it is
        ``"auto"``, then what :class:`numpyro_deer.MCMC` chose by measuring
        both (:attr:`method_choice`), or before that the device's rule."""
        return self._resolved_method()

    @property
    def method_choice(self) -> MethodChoice | None:
        """What ``method="auto"`` chose and why (reason, seconds per block of
        each method measured); ``None`` before the choice or without ``auto``."""
        return self._method_choice

    def _resolved_method(self) -> str:
        if self._method != "auto":
            return self._method
        if self._trial_method is not None:
            return self._trial_method
        if self._method_choice is not None:
            return self._method_choice.method
        return device_method()

    def _set_method_choice(self, choice: MethodChoice | None) -> None:
        self._method_choice = choice

    def fit_block_size(self, num_steps: int | None) -> None:
        """Fit the block size of the next :meth:`init` to ``num_steps``
        sampling steps per chain (NumPyro's ``num_samples``, which counts
        the steps before thinning); ``None``:
        ``block_size`` as given. :class:`numpyro_deer.MCMC` calls this."""
        self._run_steps = num_steps

    @property
    def block_multiple(self) -> int:
        """Block sizes must be multiples of this: the mesh's device count."""
        return 1 if self._mesh is None else self._mesh.size

    @property
    def mesh(self) -> Mesh | None:
        """The mesh blocks are solved over (``None``: one device)."""
        return None if self._mesh is None else self._mesh.mesh

    @property
    def solver(self) -> DEERSolver:
        return self._solver

    @property
    def on_failure(self) -> str:
        return self._on_failure

    @property
    def transition(self) -> Transition:
        return self._transition

    @property
    def default_fields(self):
        return (
            "z",
            "diverging",
            "potential_energy",
            "accept_prob",
            "adapt_state.step_size",
        )

    def get_diagnostics_str(self, state):
        return f"acc. prob={state.mean_accept_prob:.2f}"

    # --------------------------------------------------------------- potential
    def _potential(self, model_args, model_kwargs) -> Callable:
        if self._potential_fn_gen is not None:
            model_kwargs = {} if model_kwargs is None else model_kwargs
            return self._potential_fn_gen(*model_args, **model_kwargs)
        return self._potential_fn

    def _potential_flat(self, model_args, model_kwargs) -> Callable:
        potential = self._potential(model_args, model_kwargs)
        unravel = self._unravel
        return lambda x: potential(unravel(x))

    @property
    def mass_adaptation(self) -> bool | str:
        """How warmup adapts the mass matrix: ``"hessian"``, ``True`` (NumPyro's
        windowed covariance) or ``False``; ``"auto"`` until :meth:`init`."""
        return self._mass_adaptation

    def compile_key(self, block_method: bool = True) -> tuple | None:
        """What the kernel's traced functions depend on besides their arguments.

        The model function (or potential), the kernel's settings (its mesh
        included), the warmup length and the structure, shapes and dtypes of
        the latent values (set by :meth:`init`; ``None`` before). Kernels with
        equal keys trace to the same functions, so their compiled functions are
        shared (:mod:`~numpyro_deer.infer.compile_cache`). ``block_method=False``
        leaves out the method blocks are computed with: the key of what warmup
        traces.
        """
        if self._latent is None:
            return None
        return (
            type(self),
            self._model if self._model is not None else self._potential_fn,
            self._transition,
            self._solver,
            # the method blocks are traced with (method="auto" tries both)
            self._resolved_method() if block_method else None,
            self._on_failure,
            self._run_block_size,
            self._step_size,
            self._adapt_step_size,
            self._mass_adaptation,
            self._dense_mass,
            self._target_accept_prob,
            self._num_warmup,
            self._latent,
            MATMUL_PRECISION,
            self._mesh,
        )

    def _adapter(self, potential_flat, window_end=True) -> Adapter:
        return build_adapter(
            potential_flat,
            self._num_warmup,
            mass_adaptation=self._mass_adaptation,
            dense_mass=self._dense_mass,
            adapt_step_size=self._adapt_step_size,
            target_accept_prob=self._target_accept_prob,
            window_end=window_end,
            transition=self._transition,
        )

    # -------------------------------------------------------------------- init
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        program, arguments = self.init_program(
            rng_key, num_warmup, init_params, model_args, model_kwargs
        )
        state = self.initialized(program(*arguments))
        if not self._adapt_step_size:
            return state
        # every chain searches; a NumPy constant, not an eager jnp program
        use = np.ones(np.shape(state.i), bool)
        return self._step_size_fn(state, use, arguments[2])

    def init_program(
        self, rng_key, num_warmup, init_params, model_args, model_kwargs
    ) -> tuple[Callable, tuple]:
        """:meth:`init` up to the initial state: ``(program, arguments)``,
        ``program(*arguments)`` the jitted computation of the state, which
        :meth:`initialized` finishes.

        The model checks and NumPyro's set-up of the potential are traced
        here (:func:`~.initial.initialize`, compiling nothing); NumPyro's
        search for the initial values runs inside the program.
        :class:`numpyro_deer.MCMC` compiles the program beside the run's other
        programs, whose shapes it knows from the program's output. NumPyro's
        search for a starting step size is left out of the program: it is
        :meth:`block_step_size` (see :meth:`init`).
        """
        self._num_warmup = num_warmup
        self._warned_unconverged = False
        self._warned_slow_driver = False
        self._run_block_size = (
            self._block_size
            if self._run_steps is None
            else fit_to_mesh(
                fitted_block_size(self._block_size, self._run_steps), self._mesh
            )
        )
        vectorized = not is_prng_key(rng_key)
        num_chains = rng_key.shape[0] if vectorized else None
        check_chains(type(self).__name__, self._mesh, num_chains, rng_key)
        search = None
        if self._model is None:
            if init_params is None:
                raise ValueError(
                    "DEERMALA(potential_fn=...) needs `init_params`: pass them to "
                    "MCMC.run(rng_key, init_params=...)."
                )
        else:
            setup = initialize(
                self._model,
                rng_key,
                model_args,
                model_kwargs,
                self._init_strategy,
                self._validate_model,
            )
            self._potential_fn_gen = setup.potential_fn_gen
            self._postprocess_fn = setup.postprocess_fn
            if init_params is None:
                search = find_initial_params(self._model, self._init_strategy)
        if init_params is not None and vectorized:
            if not has_chain_axis(init_params, num_chains):
                raise ValueError(
                    "init_params for vectorized chains need a leading axis of "
                    f"length num_chains={num_chains} on every site."
                )
        # one chain's values (shapes and dtypes): the model's, or the user's
        batched = search is None and vectorized
        if search is not None:
            values = setup.shapes
        else:
            values = jax.eval_shape(float_params, init_params)
        flat, self._unravel = latent_layout(values, batched)
        if flat.size == 0:
            raise UnsupportedModelError(
                "DEERMALA: the model has no latent sample sites (nothing to "
                "sample): every numpyro.sample site is observed or the model has "
                "none. Use numpyro.infer.Predictive to draw from it."
            )
        self._mass_adaptation = resolve_mass_adaptation(
            self._adapt_mass_matrix, self._dense_mass, flat.size
        )
        check_buffer_memory(
            self._run_block_size,
            flat.size,
            flat.dtype,
            num_chains=num_chains or 1,
            kernel=type(self).__name__,
            multiple=self.block_multiple,
        )
        self._latent = compile_cache.latent_signature(values, batched)
        self._sites_message = partial(
            non_finite_sites_message, self._model, model_args, model_kwargs
        )
        dynamic, static = compile_cache.split_model_args(model_args, model_kwargs)
        searched = None if search is None else self._init_strategy
        init_fn = compile_cache.cached(
            ("init", self.compile_key(), vectorized, static, searched),
            lambda: self._build_init(static, vectorized, search),
        )
        self._step_size_fn = compile_cache.cached(
            ("step size", self.compile_key(False), vectorized, static),
            lambda: self._build_step_size(static, vectorized),
        )
        self._sample_fn = partial(self._sample, batched=vectorized)
        return init_fn, (init_params, rng_key, dynamic)

    def initialized(self, output):
        """The state :meth:`init_program`'s program computed (``output``: the
        state, and whether the initial values NumPyro's search found are
        valid), placed over the mesh (if any) and checked.

        Raises:
            RuntimeError: NumPyro's search found no valid initial values (the
                message names the sites whose log density is not finite).
            ValueError: a chain's initial potential energy is not finite.
        """
        state, valid = output
        check_initial_values(valid, self._sites_message)
        if self._mesh is not None:
            state = self._mesh.place(state, chains=jnp.ndim(state.i) > 0)
        check_initial_potential(state.potential_energy)
        return state

    def _build_init(self, static, vectorized: bool, search: Callable | None):
        """The jitted initial state ``(params, key, dynamic args) -> (state,
        valid)``, one chain's or (``vectorized``) every chain's.

        With ``search`` (:func:`~.initial.find_initial_params`) ``params`` is
        ``None`` and the initial values are searched from a key split off
        ``key``. Built on a copy of the kernel (see :mod:`.compile_cache`),
        with the model's array arguments as arguments.
        """
        kernel = compile_cache.snapshot(self)

        def init_one(params, key, dynamic):
            args, kwargs = compile_cache.join_model_args(static, dynamic)
            key, key_model = jax.random.split(key)
            valid = jnp.ones((), bool)
            if search is not None:
                with translate_tracer_errors():
                    params, valid = search(key_model, args, kwargs)
            potential_flat = kernel._potential_flat(args, kwargs)
            with kernel._precision():
                state = initial_state(
                    float_params(params),
                    key,
                    potential_flat,
                    kernel._adapter(potential_flat).init,
                    kernel._step_size,
                    kernel._run_block_size,
                )
            return state, valid

        if vectorized:
            return compile_cache.jit(jax.vmap(init_one, in_axes=(0, 0, None)))
        return compile_cache.jit(init_one)

    def _build_step_size(self, static, vectorized: bool):
        """:meth:`block_step_size` jitted, ``(state, use, dynamic args) ->
        state``, on a copy of the kernel like :meth:`_build_init`'s."""
        kernel = compile_cache.snapshot(self)

        def step_size(state, use, dynamic):
            args, kwargs = compile_cache.join_model_args(static, dynamic)
            return kernel.block_step_size(state, use, args, kwargs, vectorized)

        return compile_cache.jit(step_size)

    # ------------------------------------------------------------------ sample
    @staticmethod
    def _precision():
        return jax.default_matmul_precision(MATMUL_PRECISION)

    def block_warmup(
        self, state, model_args, model_kwargs, batched=False, window_end=True
    ):
        """One warmup step (the driver calls this while ``i < num_warmup``);
        ``window_end=False`` leaves the Hessian window end to the caller
        (:attr:`window_ends`)."""
        with self._precision(), translate_tracer_errors():
            return self._block_warmup(
                state, model_args, model_kwargs, batched, window_end
            )

    @property
    def adapts_step_size(self) -> bool:
        """Whether warmup searches and adapts the step size."""
        return self._adapt_step_size

    @property
    def window_ends(self) -> tuple[int, ...]:
        """The iteration counts ``state.i`` after which warmup takes the
        Hessian mass (after :meth:`init`; ``()`` unless the mass matrix is the
        Hessian one): :class:`numpyro_deer.MCMC` runs its warmup loop with
        ``window_end=False`` and, at each of these counts,
        :meth:`block_window_end` then :meth:`block_step_size`, as programs
        that compile beside the loop."""
        if self._mass_adaptation != "hessian":
            return ()
        return hessian_window_ends(self._num_warmup)

    def block_step_size(self, state, use, model_args, model_kwargs, batched=False):
        """NumPyro's step size search and restart where ``use`` (one flag per
        chain if batched; :func:`~.warmup.restart_step_size`): after the
        initial state, and after a Hessian window end."""
        potential_flat = self._potential_flat(model_args, model_kwargs)
        find = self._adapter(potential_flat).find_step_size

        def one(s, u):
            x = ravel_pytree(s.z)[0]
            return s._replace(adapt_state=restart_step_size(s.adapt_state, x, find, u))

        with self._precision(), translate_tracer_errors():
            if batched:
                return self._map_chains(lambda a: one(*a), (state, use))
            return one(state, use)

    def block_window_end(self, state, model_args, model_kwargs, batched=False):
        """``(state, finite)``: each chain's metric the inverse mean Hessian at
        its curvature points where that is finite
        (:func:`~.hessian_mass.hessian_mass`); its step size is
        :meth:`block_step_size`'s, where ``finite``."""
        potential_flat = self._potential_flat(model_args, model_kwargs)

        def one(s):
            adapt, finite = hessian_mass(
                s.adapt_state, potential_flat, s.curvature_points
            )
            return s._replace(adapt_state=adapt), finite

        with self._precision(), translate_tracer_errors():
            return self._map_chains(one, state) if batched else one(state)

    def _map_chains(self, fn, state):
        """``fn`` over the chains: split over the mesh's chain axis with a
        mesh (see :meth:`TimeMesh.map_chains`), else :func:`map_chains`."""
        if self._mesh is not None:
            return self._mesh.map_chains(fn, state)
        return map_chains(fn, state)

    def _block_warmup(self, state, model_args, model_kwargs, batched, window_end=True):
        potential_flat = self._potential_flat(model_args, model_kwargs)
        # vectorized chains take the Hessian metric once for all (see
        # batched_hessian_window_end), not inside vmap; on the CPU without a
        # mesh the chains are mapped one after the other (see map_chains), so
        # each chain's window end is a plain cond
        vmapped = self._mesh is not None or not on_cpu()
        hessian = window_end and self._mass_adaptation == "hessian"
        shared_end = batched and hessian and vmapped
        adapter = self._adapter(
            potential_flat, window_end=window_end and not shared_end
        )
        step = partial(
            warmup_step,
            potential_flat=potential_flat,
            adapter_update=adapter.update,
            num_warmup=self._num_warmup,
            unravel=self._unravel,
            transition=self._transition,
        )
        if not batched:
            return step(state)
        new = self._map_chains(step, state)
        if not shared_end:
            return new
        adapt = batched_hessian_window_end(
            state.adapt_state,
            new.adapt_state,
            potential_flat,
            new.curvature_points,
            jax.vmap(lambda z: ravel_pytree(z)[0])(new.z),
            self._num_warmup,
            adapter.find_step_size,
        )
        new = new._replace(adapt_state=adapt)
        return new if self._mesh is None else self._mesh.split_chains(new)

    def block_refill(self, state, model_args, model_kwargs, batched=False):
        """Solve a new block where the buffer is used up or the key was replaced."""
        with self._precision(), translate_tracer_errors():
            return self._block_refill(state, model_args, model_kwargs, batched)

    def _block_refill(self, state, model_args, model_kwargs, batched):
        potential_flat = self._potential_flat(model_args, model_kwargs)
        ravel = lambda z: ravel_pytree(z)[0]  # noqa: E731

        solver = self._solver

        def refill(s):
            return refill_block(
                s,
                potential_flat,
                ravel,
                solver,
                self._resolved_method(),
                self._on_failure,
                self._transition,
                self._mesh,
            )

        if batched:
            fresh = jax.vmap(needs_refill)(state)
            new = jax.lax.cond(
                jnp.any(fresh), lambda s: self._map_chains(refill, s), identity, state
            )
        else:
            fresh = needs_refill(state)
            new = jax.lax.cond(fresh, refill, identity, state)
        if self._on_failure == "raise":
            # the error comes from the host, through the compiled program
            result = jnp.where(fresh, new.block.info.result, 0)
            jax.lax.cond(
                jnp.any(result != 0),
                lambda: jax.debug.callback(raise_unconverged, result),
                lambda: None,
            )
        return new

    def block_emit(self, state, k, batched=False):
        """The state after handing out buffer entry ``k`` (all chains if batched)."""
        emit = partial(emit_draw, unravel=self._unravel, num_warmup=self._num_warmup)
        if batched:
            return jax.vmap(emit, in_axes=(0, None))(state, k)
        return emit(state, k)

    def _sample(self, state, model_args, model_kwargs, batched):
        """One draw: a warmup step, or the next entry of the (refilled) block.

        With ``batched`` (vectorized chains) the chains share one iteration
        count and one block index, so both branches are chosen once for all.
        """

        def warmup(s):
            return self._block_warmup(s, model_args, model_kwargs, batched)

        def sampling(s):
            s = self._block_refill(s, model_args, model_kwargs, batched)
            index = s.block.index[0] if batched else s.block.index
            # a block just solved (index 0) that did not converge is reported
            # from the host; the driver counts blocks itself instead
            failed = (index == 0) & ~s.block.info.converged
            if self._on_failure == "raise":  # raised by the refill already
                return self.block_emit(s, index, batched=batched)
            jax.lax.cond(
                jnp.any(failed),
                lambda: jax.debug.callback(
                    self._report_unconverged,
                    jnp.sum(failed, dtype=jnp.int32),
                    jnp.max(jnp.where(failed, s.block.info.result, 0)),
                ),
                lambda: None,
            )
            return self.block_emit(s, index, batched=batched)

        i = state.i[0] if batched else state.i
        return jax.lax.cond(i < self._num_warmup, warmup, sampling, state)

    def _report_unconverged(self, failed, result) -> None:
        """Warn, once per ``init``, that a block's solve did not converge."""
        if self._warned_unconverged:
            return
        self._warned_unconverged = True
        warn_unconverged(int(failed), None, self._on_failure, 1 << int(result))

    def sample(self, state, model_args, model_kwargs):
        # only numpyro.infer.MCMC calls sample (numpyro_deer.MCMC uses the
        # block methods); it traces it once per compiled run
        if not self._warned_slow_driver:
            self._warned_slow_driver = True
            warnings.warn(
                SLOW_DRIVER_MESSAGE.format(name=type(self).__name__),
                SlowDriverWarning,
                stacklevel=2,
            )
        with self._precision(), translate_tracer_errors():
            return self._sample_fn(state, model_args, model_kwargs)

    def postprocess_fn(self, model_args, model_kwargs):
        if self._postprocess_fn is None:
            return identity
        model_kwargs = {} if model_kwargs is None else model_kwargs
        return self._postprocess_fn(*model_args, **model_kwargs)

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in (
            "_sample_fn",
            "_potential_fn_gen",
            "_postprocess_fn",
            "_unravel",
            "_sites_message",
            "_latent",
            "_step_size_fn",
        ):
            state[name] = None
        return state
