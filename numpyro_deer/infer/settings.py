"""A block kernel's settings: its arguments, checked once and frozen.

:class:`KernelSettings` holds everything a kernel was built with; it never
changes after construction, so it is part of the compile-cache keys of the
kernel's programs (:meth:`KernelSettings.key`). :func:`check_kernel_arguments`
raises for an unusable argument, naming it and saying what to pass instead.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable

from ..core.newton import DEERSolver
from ..core.transition import Transition
from .convergence import ON_FAILURE
from .mesh import TimeMesh

MASS_ADAPTATIONS = (True, False, "hessian", "auto")
METHODS = ("auto", "deer", "sequential")


def check_kernel_arguments(
    name: str,
    *,
    model: Callable | None,
    potential_fn: Callable | None,
    step_size: float,
    adapt_step_size: bool,
    adapt_mass_matrix: bool | str,
    dense_mass: bool,
    target_accept_prob: float,
    block_size: int,
    method: str,
    solver: DEERSolver,
    on_failure: str,
) -> None:
    """Raise ``ValueError`` (naming the argument) for an unusable value."""
    if (model is None) == (potential_fn is None):
        raise ValueError(f"{name} needs exactly one of `model` or `potential_fn`.")
    if not (
        isinstance(block_size, numbers.Integral)
        and not isinstance(block_size, bool)
        and block_size >= 1
    ):
        raise ValueError(f"block_size={block_size!r}: use an integer >= 1.")
    if not (
        isinstance(step_size, numbers.Real)
        and not isinstance(step_size, bool)
        and math.isfinite(step_size)
        and step_size > 0
    ):
        raise ValueError(f"step_size={step_size!r}: use a finite positive number.")
    if not isinstance(adapt_step_size, bool):
        raise ValueError(f"adapt_step_size={adapt_step_size!r}: use True or False.")
    if not (
        isinstance(target_accept_prob, numbers.Real) and 0 < target_accept_prob < 1
    ):
        raise ValueError(
            f"target_accept_prob={target_accept_prob!r}: use a value in (0, 1)."
        )
    if not any(
        adapt_mass_matrix is value or adapt_mass_matrix == value
        for value in MASS_ADAPTATIONS
        if isinstance(value, str) == isinstance(adapt_mass_matrix, str)
    ):
        raise ValueError(
            f"adapt_mass_matrix={adapt_mass_matrix!r}: use 'auto' (the default), "
            "True (the draws' covariance), False or 'hessian' (the inverse mean "
            "Hessian)."
        )
    if not isinstance(dense_mass, bool):
        raise ValueError(
            f"{name} supports dense_mass=True or False, not a list of site groups."
        )
    if method not in METHODS:
        raise ValueError(
            f"method={method!r}: use 'auto' (the default: the faster for the "
            "device), 'deer' (parallel Newton) or 'sequential'."
        )
    if not isinstance(solver, DEERSolver):
        raise ValueError(
            f"solver={solver!r}: pass a DEERSolver, e.g. "
            "solver=DEERSolver(sweep=16); the solver's settings (jacobian, gate, "
            "tolerances, max_iter, sweep, solve_basis) are its fields."
        )
    if on_failure not in ON_FAILURE:
        raise ValueError(
            f"on_failure={on_failure!r}: use 'sequential' (finish the block one "
            "step after the other, exact), 'warn' or 'raise'."
        )


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """What a block kernel was built with (checked, never changed).

    Attributes:
        kernel: the kernel class's name, for errors and messages.
        transition: the taped transition (:class:`~numpyro_deer.core.MALA`,
            :class:`~numpyro_deer.core.HMC`, ...).
        block_size: transitions per block, at most (the run fits it).
        method: ``"auto"``, ``"deer"`` or ``"sequential"``.
        mesh: the :class:`~numpyro_deer.infer.mesh.TimeMesh` blocks are
            solved over, or ``None``.
        chain_group: vectorized chains solved side by side in a block:
            ``None`` all of them, else groups of this many, one group after
            the other (:func:`~numpyro_deer.infer.chains.map_chains`). Not a
            kernel argument: :class:`numpyro_deer.MCMC` sets it on a copy of
            the run's program when the block of all chains does not fit the
            device (:func:`~numpyro_deer.infer.memory.plan_chain_group`).
        adapt_num_steps: HMC's leapfrog count chosen at the end of warmup
            (``DEERHMC(num_steps="auto")``, :mod:`~numpyro_deer.infer.trajectory`).

    The other attributes are the kernel's arguments of the same names.
    """

    kernel: str
    transition: Transition
    step_size: float
    adapt_step_size: bool
    adapt_mass_matrix: bool | str
    dense_mass: bool
    target_accept_prob: float
    init_strategy: Callable
    block_size: int
    method: str
    solver: DEERSolver
    on_failure: str
    validate_model: bool
    mesh: TimeMesh | None
    chain_group: int | None = None
    adapt_num_steps: bool = False

    def key(self, blocks: bool = True) -> tuple:
        """The settings the kernel's programs depend on: with ``blocks``
        those of the block programs, else of warmup's (which use neither the
        solver nor the failure policy). The block size and method go into a
        program's key as the run resolved them; the initialisation strategy
        and the model check only into the initial state's."""
        common = (
            self.kernel,
            self.transition,
            self.step_size,
            self.adapt_step_size,
            self.adapt_mass_matrix,
            self.dense_mass,
            self.target_accept_prob,
            self.mesh,
            self.chain_group,
            self.adapt_num_steps,
        )
        return common + ((self.solver, self.on_failure) if blocks else ())
