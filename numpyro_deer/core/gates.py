r"""The accept gate of a Metropolis step and its derivative.

A Metropolis-adjusted step ends with ``x_new = where(log u < log a, y, x)``:
``y`` the proposal, ``x`` the current state, ``a`` the acceptance ratio and
``u`` the tape's uniform. The selection is discontinuous; the Newton solver
needs a derivative of it, and that derivative is a strategy. The forward value
never depends on the strategy, so the chain does not either: only how fast the
solver converges. Every transition of :mod:`numpyro_deer.core` (MALA, HMC)
selects through :func:`gated_select`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax import Array


@dataclass(frozen=True)
class HardGate:
    """Derivative of the accept gate with the decision held constant.

    ``d f = d y`` where the step accepts and ``d x`` where it rejects.
    """

    def tangent(self, margin, y, x, d_log_a, dy, dx):
        del d_log_a
        return jnp.where(margin > 0, dy, dx)


@dataclass(frozen=True)
class SigmoidGate:
    """Straight-through sigmoid gate (Zoltowski et al., 2025, section 4.2).

    The forward value stays the exact hard decision; the tangent is that of
    ``s y + (1 - s) x`` with ``s = sigmoid((log a - log u) / temperature)``, so
    a step near its accept threshold passes some sensitivity to ``log a``.

    Attributes:
        temperature: width of the sigmoid in units of the log ratio.
    """

    temperature: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.temperature, int | float) and self.temperature > 0):
            raise ValueError(
                f"SigmoidGate(temperature={self.temperature!r}): the temperature "
                "must be a positive number."
            )

    def tangent(self, margin, y, x, d_log_a, dy, dx):
        finite = jnp.isfinite(margin)
        s = jax.nn.sigmoid(jnp.where(finite, margin, 0.0) / self.temperature)
        ds = s * (1 - s) / self.temperature * d_log_a
        mixed = s * dy + (1 - s) * dx + (y - x) * ds
        # A proposal with a non-finite ratio is rejected outright: its tangent
        # is that of staying put, and nothing non-finite from y leaks in.
        return jnp.where(finite, mixed, dx)


Gate = HardGate | SigmoidGate

_GATES = {"hard": HardGate, "sigmoid": SigmoidGate}


def gate_from_name(gate: str | Gate) -> Gate:
    """``"hard"`` or ``"sigmoid"`` as a gate object; a gate object as it is."""
    if isinstance(gate, HardGate | SigmoidGate):
        return gate
    if isinstance(gate, str) and gate in _GATES:
        return _GATES[gate]()
    raise ValueError(
        f"gate={gate!r} is not a gate treatment: use 'hard', 'sigmoid', "
        "HardGate() or SigmoidGate(temperature=...)."
    )


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def gated_select(gate: Gate, margin: Array, y: Array, x: Array) -> Array:
    """``where(margin > 0, y, x)`` with the tangent of ``gate``.

    ``margin = log a - log u``: the step accepts where it is positive.
    """
    return jnp.where(margin > 0, y, x)


@gated_select.defjvp
def _gated_select_jvp(gate, primals, tangents):
    margin, y, x = primals
    d_margin, dy, dx = tangents
    return gated_select(gate, margin, y, x), gate.tangent(
        margin, y, x, d_margin, dy, dx
    )
