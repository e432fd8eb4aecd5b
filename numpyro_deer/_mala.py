r"""The taped MALA transition and its sequential reference chain.

All randomness of a block of ``T`` MALA steps is drawn first (the *tape*): a
standard normal vector ``xi_t`` and a uniform ``u_t`` per step, one key per step.
One step is then a deterministic map ``s_t = f_t(s_{t-1})`` (Zoltowski et al.,
2025, section 3):

.. math::

    y &= x - \epsilon M \nabla U(x) + \sqrt{2 \epsilon} L \xi_t,
        \qquad M = L L^T, \\
    \log a &= U(x) - U(y) + \log q(x \mid y) - \log q(y \mid x), \\
    f_t(x) &= y \text{ if } \log u_t < \log a \text{ else } x,

with ``U`` the potential energy (negative log density), ``q`` the Gaussian
proposal density with mean ``x - eps M grad U(x)`` and covariance ``2 eps M``
(Roberts and Tweedie, 1996), and ``M`` an optional preconditioner given through
its square root ``L`` (diagonal ``(D,)`` or dense lower-triangular ``(D, D)``).

A proposal whose potential or log ratio is not finite is rejected and flagged as
``diverging``. The gate ``where(log u < log a, y, x)`` is discontinuous; its
derivative, needed by the Newton solver, is a strategy (:class:`HardGate`,
:class:`SigmoidGate`). The forward value never depends on the strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ._sweep import SequentialStep

PotentialFn = Callable[[Array], Array]


class MALATape(NamedTuple):
    """Pre-drawn randomness of ``T`` MALA steps.

    Attributes:
        noise: standard normal proposal noise ``xi``, shape ``(T, D)``.
        log_u: log of the uniform accept variable, shape ``(T,)``.
    """

    noise: Array
    log_u: Array


class StepInfo(NamedTuple):
    """What one MALA step reports besides its new state.

    Attributes:
        potential_energy: ``U`` at the returned state.
        accept_prob: ``min(1, exp(log a))``; 0 for a non-finite proposal.
        accepted: whether the proposal was taken.
        diverging: whether the proposal had a non-finite potential or ratio.
    """

    potential_energy: Array
    accept_prob: Array
    accepted: Array
    diverging: Array


def make_tape(rng_key: Array, num_steps: int, dim: int, dtype=None) -> MALATape:
    """Draw the tape of ``num_steps`` steps: one key per step, split once."""
    dtype = jnp.result_type(float) if dtype is None else dtype

    def one(key):
        k_noise, k_u = jax.random.split(key)
        noise = jax.random.normal(k_noise, (dim,), dtype)
        log_u = jnp.log(jax.random.uniform(k_u, (), dtype))
        return noise, log_u

    noise, log_u = jax.vmap(one)(jax.random.split(rng_key, num_steps))
    return MALATape(noise, log_u)


# --------------------------------------------------------------------------- gates
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
        if not self.temperature > 0:
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


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _gated_select(gate: Gate, margin: Array, y: Array, x: Array) -> Array:
    return jnp.where(margin > 0, y, x)


@_gated_select.defjvp
def _gated_select_jvp(gate, primals, tangents):
    margin, y, x = primals
    d_margin, dy, dx = tangents
    return _gated_select(gate, margin, y, x), gate.tangent(
        margin, y, x, d_margin, dy, dx
    )


# ---------------------------------------------------------------- preconditioning
def _mul_sqrt(mass_sqrt, v):
    """``L v``."""
    if mass_sqrt is None:
        return v
    return mass_sqrt * v if mass_sqrt.ndim == 1 else mass_sqrt @ v


def _mul_mass(mass_sqrt, v):
    """``M v = L L^T v``."""
    if mass_sqrt is None:
        return v
    if mass_sqrt.ndim == 1:
        return mass_sqrt**2 * v
    return mass_sqrt @ (mass_sqrt.T @ v)


def _solve_sqrt(mass_sqrt, v):
    """``L^{-1} v``."""
    if mass_sqrt is None:
        return v
    if mass_sqrt.ndim == 1:
        return v / mass_sqrt
    return jax.scipy.linalg.solve_triangular(mass_sqrt, v, lower=True)


# -------------------------------------------------------------------- transition
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
    drift = step_size * _mul_mass(mass_sqrt, grad_x)
    y = x - drift + jnp.sqrt(2 * step_size) * _mul_sqrt(mass_sqrt, noise)
    potential_y, grad_y = jax.value_and_grad(potential_fn)(y)
    # log q(y | x) = -|xi|^2 / 2 exactly; log q(x | y) from the reverse residual.
    reverse = _solve_sqrt(mass_sqrt, x - y + step_size * _mul_mass(mass_sqrt, grad_y))
    log_ratio = (
        potential_x
        - potential_y
        - jnp.sum(reverse**2) / (4 * step_size)
        + 0.5 * jnp.sum(noise**2)
    )
    diverging = ~(jnp.isfinite(log_ratio) & jnp.isfinite(potential_y))
    log_ratio = jnp.where(diverging, -jnp.inf, log_ratio)
    margin = log_ratio - log_u
    x_new = _gated_select(gate, margin, y, x)
    accepted = margin > 0
    potential_new = jnp.where(accepted, potential_y, potential_x)
    grad_new = jnp.where(accepted, grad_y, grad_x)
    accept_prob = jnp.exp(jnp.minimum(log_ratio, 0.0))
    return (
        x_new,
        potential_new,
        grad_new,
        StepInfo(potential_new, accept_prob, accepted, diverging),
    )


def make_step_fn(
    potential_fn: PotentialFn,
    step_size: Array,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
) -> Callable[[Array, MALATape], tuple[Array, StepInfo]]:
    """The taped transition ``f_t`` as a function ``(x, tape_t) -> (x_new, info)``.

    This is the map the Newton solver linearises; it recomputes ``U(x)`` and its
    gradient, so it is a pure function of ``x`` and the tape entry.
    """

    step = _carried_step(potential_fn, step_size, mass_sqrt, gate)

    def step_fn(x: Array, tape_t: MALATape) -> tuple[Array, StepInfo]:
        (x_new, _, _), info = step(_carry_at(potential_fn, x), tape_t)
        return x_new, info

    return step_fn


def make_sequential_step(
    potential_fn: PotentialFn,
    step_size: Array,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
) -> SequentialStep:
    """The step of :func:`make_step_fn` with ``(x, U(x), grad U(x))`` carried.

    For the sweep's sequential segments (``DEERSolver(sweep=k)``): each step
    then costs one gradient evaluation instead of two.
    """
    step = _carried_step(potential_fn, step_size, mass_sqrt, gate)

    def init(x):
        return _carry_at(potential_fn, x)

    def advance(carry, tape_t):
        carry, _ = step(carry, tape_t)
        return carry, carry[0]

    return SequentialStep(init, advance)


def _carry_at(potential_fn: PotentialFn, x: Array) -> tuple[Array, Array, Array]:
    """``(x, U(x), grad U(x))``: what :func:`_carried_step` carries."""
    return (x, *jax.value_and_grad(potential_fn)(x))


def _carried_step(potential_fn, step_size, mass_sqrt, gate: Gate = HardGate()):
    """One MALA step on ``(x, U(x), grad U(x))`` with tape entry ``tape_t``.

    The sequential loops carry the triple, so a step costs one gradient
    evaluation; :func:`make_step_fn` recomputes ``U(x)`` and its gradient first.
    """

    def step(carry, tape_t):
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

    return step


def sequential_chain(
    potential_fn: PotentialFn,
    x0: Array,
    tape: MALATape,
    step_size: Array,
    mass_sqrt: Array | None = None,
) -> tuple[Array, StepInfo]:
    """The reference: the same taped chain with :func:`jax.lax.scan`.

    The gradient at the current state is carried, so each step costs one
    gradient evaluation. Given the same tape, this and the DEER solution are
    the same chain.

    Returns:
        ``(states, infos)`` with states ``s_1 .. s_T`` of shape ``(T, D)``.
    """

    step = _carried_step(potential_fn, step_size, mass_sqrt)

    def body(carry, tape_t):
        carry, info = step(carry, tape_t)
        return carry, (carry[0], info)

    _, (states, infos) = jax.lax.scan(body, _carry_at(potential_fn, x0), tape)
    return states, infos


def finish_chain(
    potential_fn: PotentialFn,
    x0: Array,
    tape: MALATape,
    step_size: Array,
    states: Array,
    infos: StepInfo,
    start: Array,
) -> tuple[Array, StepInfo]:
    """Complete a partly solved block sequentially from step ``start``.

    ``states[:start]`` (with their ``infos``) are kept, and steps
    ``start .. T-1`` are computed one after the other from ``states[start - 1]``
    (``x0`` when ``start == 0``) with the same tape, as :func:`sequential_chain`
    does. Used when a DEER solve stops before the end of its block: only the
    steps past its front are recomputed, so a block's cost is never more than
    the solve's iterations plus ``T - front`` sequential steps.
    """
    num_steps = states.shape[0]
    x_start = jnp.where(start > 0, states[jnp.maximum(start - 1, 0)], x0)
    step = _carried_step(potential_fn, step_size, None)

    def body(t, carry):
        chain, states, infos = carry
        chain, info = step(chain, jax.tree.map(lambda a: a[t], tape))
        states = states.at[t].set(chain[0])
        infos = jax.tree.map(lambda a, v: a.at[t].set(v), infos, info)
        return chain, states, infos

    carry = (_carry_at(potential_fn, x_start), states, infos)
    _, states, infos = jax.lax.fori_loop(start, num_steps, body, carry)
    return states, infos
