"""The pure-JAX core of numpyro_deer: taped transitions solved by parallel Newton.

Nothing here imports NumPyro. A :class:`Transition` (:class:`MALA`, :class:`HMC`) is a
taped Markov step ``s_t = f_t(s_{t-1})`` on flat arrays; :func:`deer_solve`
finds a whole block of such steps with parallel Newton iterations whose linear
step is an associative scan, and :func:`sequential_chain` computes the same
chain one step after the other. Example::

    import jax
    from numpyro_deer.core import MALA, DEERSolver, deer_solve, make_step_fn

    mala = MALA()
    tape = mala.make_tape(jax.random.key(0), 1024, dim, x0.dtype)
    step_fn = make_step_fn(mala, potential_fn, step_size)
    states, infos, info = deer_solve(step_fn, x0, tape, jax.random.key(1))
"""

from .certificate import leading_passed, step_passes
from .gates import Gate, HardGate, SigmoidGate, gated_select
from .hessian import curvature_basis, mean_hessian, mean_hessian_eigh
from .hmc import (
    HMC,
    HMCTape,
    hmc_proposal_step,
    leapfrog,
    make_hmc_tape,
    num_steps_for,
)
from .jacobian import (
    AutoJacobian,
    DiagonalJacobian,
    FullJacobian,
    JacobianStrategy,
    Linearization,
    StochasticDiagonalJacobian,
)
from .mala import MALA, MALATape, make_tape, mala_proposal_step
from .metric import (
    mass_matrix_sqrt,
    mul_mass,
    mul_sqrt,
    mul_sqrt_t,
    solve_sqrt,
    whiten,
)
from .newton import RESULTS, DEERSolver, NewtonInfo, deer_solve, newton_iterates
from .scan import scan_dense, scan_diagonal, scan_sequential
from .sharded import sharded_deer_solve, time_mesh
from .transition import (
    MAX_DELTA_ENERGY,
    SequentialStep,
    StepFn,
    StepInfo,
    Transition,
    carry_at,
    finish_chain,
    make_sequential_step,
    make_step_fn,
    plain_sequential_step,
    sequential_chain,
)

__all__ = [
    "HMC",
    "HMCTape",
    "MALA",
    "MAX_DELTA_ENERGY",
    "RESULTS",
    "AutoJacobian",
    "DEERSolver",
    "DiagonalJacobian",
    "FullJacobian",
    "Gate",
    "HardGate",
    "JacobianStrategy",
    "Linearization",
    "MALATape",
    "NewtonInfo",
    "SequentialStep",
    "SigmoidGate",
    "StepFn",
    "StepInfo",
    "StochasticDiagonalJacobian",
    "Transition",
    "carry_at",
    "curvature_basis",
    "deer_solve",
    "finish_chain",
    "gated_select",
    "hmc_proposal_step",
    "leading_passed",
    "leapfrog",
    "make_hmc_tape",
    "make_sequential_step",
    "make_step_fn",
    "make_tape",
    "mala_proposal_step",
    "mass_matrix_sqrt",
    "mean_hessian",
    "mean_hessian_eigh",
    "mul_mass",
    "mul_sqrt",
    "mul_sqrt_t",
    "newton_iterates",
    "num_steps_for",
    "plain_sequential_step",
    "scan_dense",
    "scan_diagonal",
    "scan_sequential",
    "sequential_chain",
    "sharded_deer_solve",
    "solve_sqrt",
    "step_passes",
    "time_mesh",
    "whiten",
]
