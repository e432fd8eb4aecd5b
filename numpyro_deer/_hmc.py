r"""The taped HMC transition and its sequential reference chain.

All randomness of a block of ``T`` HMC transitions is drawn first (the *tape*):
a standard normal momentum ``xi_t``, a uniform ``u_t`` and, optionally, a step
size factor ``c_t`` per transition, one key per transition. One transition with
``L`` leapfrog steps (Duane et al., 1987; Neal, 2011, section 5.3.3) is then a
deterministic map ``s_t = f_t(s_{t-1})``, which the DEER solver linearises
exactly as it does a MALA step (Zoltowski et al., 2025, section 3).

With the preconditioner ``M = L L^T`` (the inverse mass matrix, given through
its square root ``L``, diagonal ``(D,)`` or dense lower-triangular ``(D, D)``)
and the whitened momentum ``r = L^T p ~ N(0, I)``, the kinetic energy is
``|r|^2 / 2`` and one leapfrog step of size ``eps_t = c_t eps`` is

.. math::

    r &\leftarrow r - \tfrac{\epsilon_t}{2} L^T \nabla U(x), \qquad
    x \leftarrow x + \epsilon_t L r, \qquad
    r \leftarrow r - \tfrac{\epsilon_t}{2} L^T \nabla U(x).

From ``(x, r_0 = xi_t)`` the ``L`` steps give ``(y, r_L)``, and

.. math::

    \log a = U(x) + \tfrac12 |r_0|^2 - U(y) - \tfrac12 |r_L|^2, \qquad
    f_t(x) = y \text{ if } \log u_t < \log a \text{ else } x.

The gradient at the end of each leapfrog step is that of the next one's start,
so a transition from a state whose potential and gradient are carried costs
``L`` gradient evaluations. With ``L = 1`` the transition is MALA with step
size ``eps^2 / 2`` (the same proposal and the same ratio).

A proposal whose energy is not finite is rejected and flagged as
``diverging``. The accept gate and its derivative strategies
(:class:`~numpyro_deer.HardGate`, :class:`~numpyro_deer.SigmoidGate`) are
MALA's, shared through :func:`numpyro_deer._mala._gated_select`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ._mala import (
    Gate,
    HardGate,
    PotentialFn,
    StepInfo,
    _carry_at,
    _gated_select,
    _mul_sqrt,
)
from ._sweep import SequentialStep

HARD_GATE = HardGate()


class HMCTape(NamedTuple):
    """Pre-drawn randomness of ``T`` HMC transitions.

    Attributes:
        noise: the whitened momentum ``xi`` at the start of each transition,
            shape ``(T, D)``.
        log_u: log of the uniform accept variable, shape ``(T,)``.
        step_scale: the factor ``c_t`` of the step size, shape ``(T,)``; all
            ones without jitter.
    """

    noise: Array
    log_u: Array
    step_scale: Array


def make_tape(
    rng_key: Array, num_steps: int, dim: int, dtype=None, jitter: float = 0.0
) -> HMCTape:
    """Draw the tape of ``num_steps`` transitions: one key per transition.

    ``jitter = j`` draws each transition's step size factor uniformly from
    ``[1 - j, 1 + j]`` (Neal, 2011, section 5.4.2.2), which breaks the
    periodicity a fixed trajectory length has on some targets.
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter={jitter!r}: the step size jitter must be in [0, 1).")
    dtype = jnp.result_type(float) if dtype is None else dtype

    def one(key):
        k_noise, k_u, k_scale = jax.random.split(key, 3)
        noise = jax.random.normal(k_noise, (dim,), dtype)
        log_u = jnp.log(jax.random.uniform(k_u, (), dtype))
        scale = 1.0 + jitter * jax.random.uniform(k_scale, (), dtype, -1.0, 1.0)
        return noise, log_u, scale

    return HMCTape(*jax.vmap(one)(jax.random.split(rng_key, num_steps)))


def _mul_sqrt_t(mass_sqrt, v):
    """``L^T v``."""
    if mass_sqrt is None:
        return v
    return mass_sqrt * v if mass_sqrt.ndim == 1 else mass_sqrt.T @ v


def leapfrog(
    potential_fn: PotentialFn,
    x: Array,
    grad_x: Array,
    momentum: Array,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
) -> tuple[Array, Array, Array, Array]:
    """``num_steps`` leapfrog steps from ``(x, r)`` with ``grad U(x)`` known.

    Returns:
        ``(y, U(y), grad U(y), r_L)``; one gradient evaluation per step.
    """

    def body(_, carry):
        x, _, grad, r = carry
        r = r - 0.5 * step_size * _mul_sqrt_t(mass_sqrt, grad)
        x = x + step_size * _mul_sqrt(mass_sqrt, r)
        potential, grad = jax.value_and_grad(potential_fn)(x)
        r = r - 0.5 * step_size * _mul_sqrt_t(mass_sqrt, grad)
        return x, potential, grad, r

    potential0 = jnp.zeros((), x.dtype)
    return jax.lax.fori_loop(0, num_steps, body, (x, potential0, grad_x, momentum))


def hmc_proposal_step(
    potential_fn: PotentialFn,
    x: Array,
    potential_x: Array,
    grad_x: Array,
    tape_t: HMCTape,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
    gate: Gate = HARD_GATE,
) -> tuple[Array, Array, Array, StepInfo]:
    """One HMC transition from ``x`` whose potential and gradient are known.

    Returns:
        ``(x_new, potential_new, grad_new, info)``.
    """
    eps = step_size * tape_t.step_scale
    y, potential_y, grad_y, r_end = leapfrog(
        potential_fn, x, grad_x, tape_t.noise, eps, num_steps, mass_sqrt
    )
    log_ratio = (
        potential_x
        - potential_y
        + 0.5 * jnp.sum(tape_t.noise**2)
        - 0.5 * jnp.sum(r_end**2)
    )
    diverging = ~(jnp.isfinite(log_ratio) & jnp.isfinite(potential_y))
    log_ratio = jnp.where(diverging, -jnp.inf, log_ratio)
    margin = log_ratio - tape_t.log_u
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


def _carried_step(potential_fn, step_size, num_steps, mass_sqrt, gate=HARD_GATE):
    """One HMC transition on ``(x, U(x), grad U(x))``: ``L`` gradients."""

    def step(carry, tape_t):
        x, potential_x, grad_x, info = hmc_proposal_step(
            potential_fn, *carry, tape_t, step_size, num_steps, mass_sqrt, gate
        )
        return (x, potential_x, grad_x), info

    return step


def make_step_fn(
    potential_fn: PotentialFn,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
    gate: Gate = HARD_GATE,
) -> Callable[[Array, HMCTape], tuple[Array, StepInfo]]:
    """The taped transition ``f_t`` as a function ``(x, tape_t) -> (x_new, info)``.

    This is the map the Newton solver linearises; it recomputes ``U(x)`` and
    its gradient, so it costs ``L + 1`` gradients and is a pure function of
    ``x`` and the tape entry.
    """
    step = _carried_step(potential_fn, step_size, num_steps, mass_sqrt, gate)

    def step_fn(x: Array, tape_t: HMCTape) -> tuple[Array, StepInfo]:
        (x_new, _, _), info = step(_carry_at(potential_fn, x), tape_t)
        return x_new, info

    return step_fn


def make_sequential_step(
    potential_fn: PotentialFn,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
    gate: Gate = HARD_GATE,
) -> SequentialStep:
    """The step of :func:`make_step_fn` with ``(x, U(x), grad U(x))`` carried,
    for the sweep's sequential segments: ``L`` gradients per transition."""
    step = _carried_step(potential_fn, step_size, num_steps, mass_sqrt, gate)

    def advance(carry, tape_t):
        carry, _ = step(carry, tape_t)
        return carry, carry[0]

    return SequentialStep(lambda x: _carry_at(potential_fn, x), advance)


def sequential_chain(
    potential_fn: PotentialFn,
    x0: Array,
    tape: HMCTape,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
) -> tuple[Array, StepInfo]:
    """The reference: the same taped chain with :func:`jax.lax.scan`.

    Returns:
        ``(states, infos)`` with states ``s_1 .. s_T`` of shape ``(T, D)``.
    """
    step = _carried_step(potential_fn, step_size, num_steps, mass_sqrt)

    def body(carry, tape_t):
        carry, info = step(carry, tape_t)
        return carry, (carry[0], info)

    _, (states, infos) = jax.lax.scan(body, _carry_at(potential_fn, x0), tape)
    return states, infos


def finish_chain(
    potential_fn: PotentialFn,
    x0: Array,
    tape: HMCTape,
    step_size: Array,
    num_steps: int,
    states: Array,
    infos: StepInfo,
    start: Array,
    mass_sqrt: Array | None = None,
) -> tuple[Array, StepInfo]:
    """Complete a partly solved block sequentially from transition ``start``.

    ``states[:start]`` are kept and transitions ``start .. T-1`` are computed
    one after the other from ``states[start - 1]`` (``x0`` when ``start == 0``)
    with the same tape, as :func:`sequential_chain` does.
    """
    x_start = jnp.where(start > 0, states[jnp.maximum(start - 1, 0)], x0)
    step = _carried_step(potential_fn, step_size, num_steps, mass_sqrt)

    def body(t, carry):
        chain, states, infos = carry
        chain, info = step(chain, jax.tree.map(lambda a: a[t], tape))
        states = states.at[t].set(chain[0])
        infos = jax.tree.map(lambda a, v: a.at[t].set(v), infos, info)
        return chain, states, infos

    carry = (_carry_at(potential_fn, x_start), states, infos)
    _, states, infos = jax.lax.fori_loop(start, states.shape[0], body, carry)
    return states, infos
