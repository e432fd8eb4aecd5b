"""numpyro_deer: MALA for NumPyro, parallel across the chain length with DEER.

The kernel :class:`DEERMALA` computes blocks of MALA transitions with parallel
Newton iterations (DEER); :class:`MCMC` is a drop-in ``numpyro.infer.MCMC`` that
advances a whole block per loop iteration. The pure-JAX core (taped MALA step,
associative scans, Newton solver) is exported for use without NumPyro models.
"""

from ._block import BlockBuffer as BlockBuffer
from ._block import DEERMALAState as DEERMALAState
from ._checks import UnsupportedModelError as UnsupportedModelError
from ._checks import check_model as check_model
from ._driver import MCMC as MCMC
from ._driver import DEERConvergenceWarning as DEERConvergenceWarning
from ._jacobian import DiagonalJacobian as DiagonalJacobian
from ._jacobian import FullJacobian as FullJacobian
from ._jacobian import Linearization as Linearization
from ._jacobian import StochasticDiagonalJacobian as StochasticDiagonalJacobian
from ._kernel import DEERMALA as DEERMALA
from ._mala import HardGate as HardGate
from ._mala import MALATape as MALATape
from ._mala import SigmoidGate as SigmoidGate
from ._mala import StepInfo as StepInfo
from ._mala import finish_chain as finish_chain
from ._mala import make_sequential_step as make_sequential_step
from ._mala import make_step_fn as make_step_fn
from ._mala import make_tape as make_tape
from ._mala import mala_proposal_step as mala_proposal_step
from ._mala import sequential_chain as sequential_chain
from ._newton import DEERSolver as DEERSolver
from ._newton import NewtonInfo as NewtonInfo
from ._newton import deer_solve as deer_solve
from ._newton import newton_iterates as newton_iterates
from ._scan import scan_dense as scan_dense
from ._scan import scan_diagonal as scan_diagonal
from ._scan import scan_sequential as scan_sequential
from ._sharded import sharded_deer_solve as sharded_deer_solve
from ._sharded import time_mesh as time_mesh
from ._sweep import SequentialStep as SequentialStep

__version__ = "0.1.0.dev0"

__all__ = [
    "BlockBuffer",
    "DEERConvergenceWarning",
    "DEERMALA",
    "DEERMALAState",
    "DEERSolver",
    "DiagonalJacobian",
    "FullJacobian",
    "HardGate",
    "Linearization",
    "MALATape",
    "MCMC",
    "NewtonInfo",
    "SequentialStep",
    "SigmoidGate",
    "StepInfo",
    "StochasticDiagonalJacobian",
    "UnsupportedModelError",
    "check_model",
    "deer_solve",
    "finish_chain",
    "make_sequential_step",
    "make_step_fn",
    "make_tape",
    "mala_proposal_step",
    "newton_iterates",
    "scan_dense",
    "scan_diagonal",
    "scan_sequential",
    "sequential_chain",
    "sharded_deer_solve",
    "time_mesh",
]
