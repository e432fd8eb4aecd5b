"""The NumPyro kernel of a taped transition whose blocks DEER solves.

:class:`DEERKernel` is a thin ``numpyro.infer.mcmc.MCMCKernel`` adapter, as
NumPyro's ``HMC`` is over ``hmc()``: its arguments are frozen into
:class:`~numpyro_deer.infer.settings.KernelSettings` at construction; ``init``
sets the model up (:func:`~.initial.initialize`) and freezes the run into a
:class:`~numpyro_deer.infer.program.BlockProgram`, whose pure functions are
the run's steps (NumPyro's ``_sample_fn``: the kernel's one attribute that
``init`` sets, as NumPyro's kernels do). A transition's public kernel
subclasses it and differs in the transition only: :class:`~numpyro_deer.DEERMALA`
(:mod:`numpyro_deer.infer.mala`), :class:`~numpyro_deer.DEERHMC`
(:mod:`numpyro_deer.infer.hmc`). What :class:`numpyro_deer.MCMC` needs of a
block kernel is declared in :mod:`numpyro_deer.infer.protocol`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import identity, is_prng_key

from ..core.newton import DEERSolver
from ..core.transition import Transition
from . import compile_cache
from .chains import float_params, has_chain_axis, latent_layout
from .checks import UnsupportedModelError, non_finite_sites_message
from .hessian_mass import resolve_mass_adaptation, resolve_solve_basis
from .initial import find_initial_params, initialize
from .memory import check_buffer_memory
from .mesh import MESH_CHOICE, check_chains, check_mesh, fit_to_mesh
from .method import (
    SLOW_DRIVER_MESSAGE,
    MethodChoice,
    MethodMemory,
    SlowDriverWarning,
    device_method,
    fitted_block_size,
)
from .program import BlockProgram
from .settings import KernelSettings, check_kernel_arguments


class InitProgram(NamedTuple):
    """A run's initial state, to compute (:meth:`DEERKernel.init_program`).

    Attributes:
        program: the jitted ``(params, key, dynamic args) -> (state, valid)``.
        arguments: its arguments.
        step_size: the jitted step size search ``(state, use, dynamic args)
            -> state`` (:meth:`~.program.BlockProgram.step_size`).
    """

    program: Callable
    arguments: tuple
    step_size: Callable


class DEERKernel(MCMCKernel):
    """A taped transition as a NumPyro kernel whose blocks DEER solves.

    ``transition`` is the :class:`~numpyro_deer.core.Transition` (warmup takes
    one step per draw on a one-step tape; sampling solves blocks of its
    steps); the other arguments are those of :class:`~numpyro_deer.DEERMALA`.
    Subclasses fix the transition and document the arguments.
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
        arguments = dict(
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
        check_kernel_arguments(
            name, model=model, potential_fn=potential_fn, **arguments
        )
        arguments.update(step_size=float(step_size), block_size=int(block_size))
        self._settings = KernelSettings(
            kernel=name,
            transition=transition,
            init_strategy=init_strategy,
            validate_model=validate_model,
            mesh=check_mesh(name, mesh, block_size, method),
            **arguments,
        )
        self._model = model
        self._potential_fn = potential_fn
        # with a mesh, blocks are DEER solves: nothing to measure
        self._methods = MethodMemory(None if mesh is None else MESH_CHOICE)
        # the warnings given in the current run (once each; see BlockProgram)
        self._warned: set[str] = set()
        self._sample_fn: BlockProgram | None = None

    # ------------------------------------------------------------ settings
    @property
    def model(self):
        return self._model

    @property
    def settings(self) -> KernelSettings:
        """The kernel's arguments, frozen."""
        return self._settings

    @property
    def program(self) -> BlockProgram | None:
        """The run set up by the last :meth:`init` (``None`` before)."""
        return self._sample_fn

    @property
    def block_size(self) -> int:
        """The ``block_size`` argument: transitions per block, at most. A run
        of :class:`numpyro_deer.MCMC` fits its blocks to its length (the
        size is ``state.block.z.shape[-2]``, and ``program.block_size``)."""
        return self._settings.block_size

    @property
    def method(self) -> str:
        """The ``method`` argument: ``"auto"``, ``"deer"`` or ``"sequential"``."""
        return self._settings.method

    @property
    def method_chosen(self) -> str:
        """The method blocks are computed with: ``method`` unless it is
        ``"auto"``, then what :class:`numpyro_deer.MCMC` chose by measuring
        both (:attr:`method_choice`), or before that the device's rule."""
        if self.method != "auto":
            return self.method
        choice = self._methods.choice
        return device_method() if choice is None else choice.method

    @property
    def method_choice(self) -> MethodChoice | None:
        """What ``method="auto"`` chose and why (reason, seconds per block of
        each method measured); ``None`` before the choice or without ``auto``."""
        return self._methods.choice

    def remember_method(self, choice: MethodChoice) -> None:
        """Keep ``method="auto"``'s choice for this kernel's later runs
        (:class:`numpyro_deer.MCMC` measures it)."""
        self._methods.choice = choice

    @property
    def block_multiple(self) -> int:
        """Block sizes must be multiples of this: the mesh's device count."""
        mesh = self._settings.mesh
        return 1 if mesh is None else mesh.size

    @property
    def mesh(self) -> Mesh | None:
        """The mesh blocks are solved over (``None``: one device)."""
        mesh = self._settings.mesh
        return None if mesh is None else mesh.mesh

    @property
    def solver(self) -> DEERSolver:
        return self._settings.solver

    @property
    def on_failure(self) -> str:
        return self._settings.on_failure

    @property
    def transition(self) -> Transition:
        return self._settings.transition

    @property
    def mass_adaptation(self) -> bool | str:
        """How warmup adapts the mass matrix: ``"hessian"``, ``True`` (NumPyro's
        windowed covariance) or ``False``; ``"auto"`` until :meth:`init`."""
        program = self._sample_fn
        if program is None:
            return self._settings.adapt_mass_matrix
        return program.mass_adaptation

    def compile_key(self) -> tuple | None:
        """The compile-cache key of the blocks of the run set up by the last
        :meth:`init` (``None`` before): see :meth:`BlockProgram.key`."""
        program = self._sample_fn
        return None if program is None else program.key(self.method_chosen)

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

    # ---------------------------------------------------------------- init
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        return self.start(
            self.init_program(
                rng_key, num_warmup, init_params, model_args, model_kwargs
            )
        )

    def start(self, init: InitProgram, call: Callable | None = None):
        """The initial state of :meth:`init_program`'s ``init``: its program
        run, the state checked (:meth:`~.program.BlockProgram.initialized`)
        and, if the step size is adapted, NumPyro's search on every chain.
        ``call(name, fn, *args)`` runs ``fn`` (``"init"``, ``"step_size"``;
        default ``fn(*args)``): :class:`numpyro_deer.MCMC` runs the programs
        it compiled in the background."""
        call = call or (lambda name, fn, *args: fn(*args))
        state = call("init", init.program, *init.arguments)
        state = self._sample_fn.initialized(state)
        if not self._settings.adapt_step_size:
            return state
        # every chain searches; a NumPy constant, not an eager jnp program
        use = np.ones(np.shape(state.i), bool)
        return call("step_size", init.step_size, state, use, init.arguments[2])

    def init_program(
        self,
        rng_key,
        num_warmup,
        init_params,
        model_args,
        model_kwargs,
        num_samples: int | None = None,
    ) -> InitProgram:
        """:meth:`init` up to the initial state, which
        ``kernel.program.initialized(init.program(*init.arguments))`` then
        computes.

        Sets up the run (:attr:`program`): the model checks and NumPyro's
        set-up of the potential are traced here (:func:`~.initial.initialize`,
        compiling nothing); NumPyro's search for the initial values runs
        inside the program. ``num_samples`` (NumPyro's, thinning included)
        fits the blocks to the run
        (:func:`~numpyro_deer.infer.method.fitted_block_size`); ``None``: blocks
        of ``block_size``. :class:`numpyro_deer.MCMC` compiles the program
        beside the run's other programs, whose shapes it knows from the
        program's output.
        """
        s = self._settings
        self._warned.clear()
        vectorized = not is_prng_key(rng_key)
        num_chains = rng_key.shape[0] if vectorized else None
        check_chains(s.kernel, s.mesh, num_chains, rng_key)
        search = setup = None
        if self._model is None:
            if init_params is None:
                raise ValueError(
                    f"{s.kernel}(potential_fn=...) needs `init_params`: pass them "
                    "to MCMC.run(rng_key, init_params=...)."
                )
        else:
            setup = initialize(
                self._model,
                rng_key,
                model_args,
                model_kwargs,
                s.init_strategy,
                s.validate_model,
            )
            if init_params is None:
                search = find_initial_params(self._model, s.init_strategy)
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
        flat, unravel = latent_layout(values, batched)
        if flat.size == 0:
            raise UnsupportedModelError(
                f"{s.kernel}: the model has no latent sample sites (nothing to "
                "sample): every numpyro.sample site is observed or the model has "
                "none. Use numpyro.infer.Predictive to draw from it."
            )
        block_size = s.block_size
        if num_samples is not None:
            block_size = fit_to_mesh(fitted_block_size(block_size, num_samples), s.mesh)
        check_buffer_memory(
            block_size,
            flat.size,
            flat.dtype,
            num_chains=num_chains or 1,
            kernel=s.kernel,
            multiple=self.block_multiple,
        )
        program = BlockProgram(
            settings=dataclasses.replace(
                s, solver=resolve_solve_basis(s.solver, flat.size, num_chains or 1)
            ),
            model=self._model,
            potential_fn=self._potential_fn,
            potential_fn_gen=None if setup is None else setup.potential_fn_gen,
            postprocess_fn=None if setup is None else setup.postprocess_fn,
            unravel=unravel,
            num_warmup=num_warmup,
            block_size=block_size,
            mass_adaptation=resolve_mass_adaptation(
                s.adapt_mass_matrix, s.dense_mass, flat.size, num_chains or 1
            ),
            latent=compile_cache.latent_signature(values, batched),
            method=self.method_chosen,
            sites_message=partial(
                non_finite_sites_message, self._model, model_args, model_kwargs
            ),
            warned=self._warned,
        )
        self._sample_fn = program
        dynamic, static = compile_cache.split_model_args(model_args, model_kwargs)
        return InitProgram(
            program.compiled_initial(static, vectorized, search),
            (init_params, rng_key, dynamic),
            program.compiled_step_size(static, vectorized),
        )

    # -------------------------------------------------------------- sample
    def sample(self, state, model_args, model_kwargs):
        # only numpyro.infer.MCMC calls sample (numpyro_deer.MCMC runs the
        # program's functions); it traces it once per compiled run
        program = self._sample_fn
        if program.first_warning("slow driver"):
            warnings.warn(
                SLOW_DRIVER_MESSAGE.format(name=self._settings.kernel),
                SlowDriverWarning,
                stacklevel=2,
            )
        return program(state, model_args, model_kwargs)

    def postprocess_fn(self, model_args, model_kwargs):
        program = self._sample_fn
        return (
            identity
            if program is None
            else program.postprocess(model_args, model_kwargs)
        )

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sample_fn"] = None  # the run's functions: set up again by init
        return state
