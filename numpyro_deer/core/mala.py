r"""MALA as a taped transition.

The tape of ``T`` MALA steps is a standard normal vector ``xi_t`` and a
uniform ``u_t`` per step, one key per step. One step is (Roberts and Tweedie,
1996)

.. math::

    y &= x - \epsilon M \nabla U(x) + \sqrt{2 \epsilon} L \xi_t,
        \qquad M = L L^T, \\
    \log a &= U(x) - U(y) + \log q(x \mid y) - \log q(y \mid x), \\
    f_t(x) &= y \text{ if } \log u_t < \log a \text{ else } x,

with ``U`` the potential energy (negative log density), ``q`` the Gaussian
proposal density with mean ``x - eps M grad U(x)`` and covariance ``2 eps M``,
and ``M`` an optional preconditioner given through its square root ``L``
(diagonal ``(D,)`` or dense upper-triangular ``(D, D)``).

A proposal whose potential or log ratio is not finite is rejected and flagged as
``diverging``; so is one whose energy error ``-log a`` exceeds
:data:`~numpyro_deer.core.transition.MAX_DELTA_ENERGY` (1000, NumPyro's
``max_delta_energy``). The selection goes through
:func:`~numpyro_deer.core.gates.gated_select`, whose derivative is the gate
strategy; the forward value never depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from .gates import Gate, HardGate
from .metric import mul_mass, mul_sqrt, solve_sqrt
from .transition import Carry, PotentialFn, StepInfo, flat_draw, metropolis_accept


class MALATape(NamedTuple):
    """Pre-drawn randomness of ``T`` MALA steps.

    Attributes:
        noise: standard normal proposal noise ``xi``, shape ``(T, D)``.
        log_u: log of the uniform accept variable, shape ``(T,)``.
    """

    noise: Array
    log_u: Array


def make_tape(rng_key: Array, num_steps: int, dim: int, dtype=None) -> MALATape:
    """Draw the tape of ``num_steps`` steps: the noise and the accept variables
    each as one flat draw (:func:`~numpyro_deer.core.transition.flat_draw`)."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    k_noise, k_u = jax.random.split(rng_key)
    noise = flat_draw(jax.random.normal, k_noise, (num_steps, dim), dtype)
    log_u = jnp.log(jax.random.uniform(k_u, (num_steps,), dtype))
    return MALATape(noise, log_u)


def mala_proposal_step(
    potential_fn: PotentialFn,
    x: Array,
    potential_x: Array,
    grad_x: Array,
    noise: Array,
    log_u: Array,
    step_size: Array,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
) -> tuple[Array, Array, Array, StepInfo]:
    """One MALA step from ``x`` whose potential and gradient are already known.

    Returns:
        ``(x_new, potential_new, grad_new, info)``.
    """
    drift = step_size * mul_mass(mass_sqrt, grad_x)
    y = x - drift + jnp.sqrt(2 * step_size) * mul_sqrt(mass_sqrt, noise)
    potential_y, grad_y = jax.value_and_grad(potential_fn)(y)
    # log q(y | x) = -|xi|^2 / 2 exactly; log q(x | y) from the reverse residual.
    reverse = solve_sqrt(mass_sqrt, x - y + step_size * mul_mass(mass_sqrt, grad_y))
    log_ratio = (
        potential_x
        - potential_y
        - jnp.sum(reverse**2) / (4 * step_size)
        + 0.5 * jnp.sum(noise**2)
    )
    return metropolis_accept(
        gate, log_ratio, log_u, (y, potential_y, grad_y), (x, potential_x, grad_x)
    )


@dataclass(frozen=True)
class MALA:
    """The Metropolis-adjusted Langevin step as a :class:`Transition`."""

    def make_tape(self, key: Array, num_steps: int, dim: int, dtype=None) -> MALATape:
        return make_tape(key, num_steps, dim, dtype)

    def step(
        self,
        potential_fn: PotentialFn,
        step_size: Array,
        carry: Carry,
        tape_t: MALATape,
        mass_sqrt: Array | None = None,
        gate: Gate = HardGate(),
    ) -> tuple[Carry, StepInfo]:
        x, potential_x, grad_x = carry
        x, potential_x, grad_x, info = mala_proposal_step(
            potential_fn,
            x,
            potential_x,
            grad_x,
            tape_t.noise,
            tape_t.log_u,
            step_size,
            mass_sqrt,
            gate,
        )
        return (x, potential_x, grad_x), info

    def rotate_tape(self, tape: MALATape, basis: Array) -> MALATape:
        return tape._replace(noise=tape.noise @ basis)
