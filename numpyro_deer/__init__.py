"""numpyro_deer: MALA for NumPyro, parallel across the chain length with DEER.

The kernel :class:`DEERMALA` computes blocks of MALA transitions with parallel
Newton iterations (DEER); :class:`MCMC` is a drop-in ``numpyro.infer.MCMC`` that
advances a whole block per loop iteration; :class:`DEERSolver` holds the
settings of a block's solve. The pure-JAX pieces (the taped transitions, the
Newton solver, the scans) are in :mod:`numpyro_deer.core`, which does not
import NumPyro: the NumPyro layer is imported when one of its names is first
used, so ``import numpyro_deer.core`` works without NumPyro installed.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from .core.gates import HardGate, SigmoidGate
from .core.jacobian import (
    AutoJacobian,
    DiagonalJacobian,
    FullJacobian,
    StochasticDiagonalJacobian,
)
from .core.newton import DEERSolver

__version__ = "0.1.0.dev0"

# name -> module of the NumPyro layer that defines it (imported on first use)
_NUMPYRO_LAYER = {
    "ConvergenceDiagnosticWarning": ".infer.diagnostics",
    "DEERConvergenceError": ".infer.convergence",
    "DEERConvergenceWarning": ".infer.convergence",
    "DEERHMC": ".infer.hmc",
    "DEERMALA": ".infer.mala",
    "MCMC": ".infer.driver",
    "SlowDriverWarning": ".infer.method",
    "WarmupTransitWarning": ".infer.transit",
    "UnsupportedModelError": ".infer.checks",
    "check_model": ".infer.checks",
}

if TYPE_CHECKING:  # pragma: no cover
    from .infer.checks import UnsupportedModelError, check_model
    from .infer.convergence import DEERConvergenceError, DEERConvergenceWarning
    from .infer.diagnostics import ConvergenceDiagnosticWarning
    from .infer.driver import MCMC
    from .infer.hmc import DEERHMC
    from .infer.mala import DEERMALA
    from .infer.method import SlowDriverWarning
    from .infer.transit import WarmupTransitWarning


def _public(obj):
    """Show ``obj`` as ``numpyro_deer.<name>`` (in reprs, errors, the docs)."""
    obj.__module__ = __name__
    return obj


for _obj in (
    AutoJacobian,
    DEERSolver,
    DiagonalJacobian,
    FullJacobian,
    HardGate,
    SigmoidGate,
    StochasticDiagonalJacobian,
):
    _public(_obj)


def __getattr__(name: str):
    if name in _NUMPYRO_LAYER:
        value = _public(getattr(import_module(_NUMPYRO_LAYER[name], __name__), name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'numpyro_deer' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NUMPYRO_LAYER))


__all__ = [
    "AutoJacobian",
    "ConvergenceDiagnosticWarning",
    "DEERConvergenceError",
    "DEERConvergenceWarning",
    "DEERHMC",
    "DEERMALA",
    "DEERSolver",
    "DiagonalJacobian",
    "FullJacobian",
    "HardGate",
    "MCMC",
    "SigmoidGate",
    "SlowDriverWarning",
    "StochasticDiagonalJacobian",
    "UnsupportedModelError",
    "WarmupTransitWarning",
    "check_model",
]
