r"""HMC as a taped transition: ``L`` leapfrog steps and a Metropolis test.

The tape of ``T`` HMC transitions is a standard normal momentum ``xi_t``, a
uniform ``u_t`` and a step size factor ``c_t`` per transition (one key per
transition; ``c_t = 1`` without jitter). One transition with ``L`` leapfrog
steps (Duane et al., 1987; Neal, 2011, section 5.3.3) is then a deterministic
map ``s_t = f_t(s_{t-1})``, which the Newton solver linearises as it does a
MALA step (Zoltowski et al., 2025, section 3).

With the inverse mass matrix ``M = L L^T`` given through ``L`` (diagonal
``(D,)`` or dense upper-triangular ``(D, D)``) and the whitened momentum
``r = L^T p ~ N(0, I)``, the kinetic energy is ``|r|^2 / 2`` and one leapfrog
step of size ``eps_t = c_t eps`` is

.. math::

    r \leftarrow r - \tfrac{\epsilon_t}{2} L^T \nabla U(x), \qquad
    x \leftarrow x + \epsilon_t L r, \qquad
    r \leftarrow r - \tfrac{\epsilon_t}{2} L^T \nabla U(x).

From ``(x, r_0 = xi_t)`` the ``L`` steps give ``(y, r_L)``, and

.. math::

    \log a = U(x) + \tfrac12 |r_0|^2 - U(y) - \tfrac12 |r_L|^2, \qquad
    f_t(x) = y \text{ if } \log u_t < \log a \text{ else } x.

The gradient at the end of a leapfrog step is the next one's, so a transition
from a carried ``(x, U(x), grad U(x))`` costs ``L`` gradients. With ``L = 1``
the transition is MALA with step size ``eps^2 / 2``. A proposal whose energy
is not finite is rejected and flagged as ``diverging``, and so is one whose
energy error ``-log a`` exceeds
:data:`~numpyro_deer.core.transition.MAX_DELTA_ENERGY` (1000), as NumPyro's
HMC flags it (``max_delta_energy``); the selection goes through
:func:`~numpyro_deer.core.gates.gated_select`, as MALA's does.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from .gates import Gate, HardGate
from .metric import mul_sqrt, mul_sqrt_t
from .transition import Carry, PotentialFn, StepInfo, flat_draw, metropolis_accept


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


def make_hmc_tape(
    rng_key: Array, num_steps: int, dim: int, dtype=None, jitter: float = 0.0
) -> HMCTape:
    """Draw the tape of ``num_steps`` transitions, each part as one flat draw
    (:func:`~numpyro_deer.core.transition.flat_draw`).

    ``jitter = j`` draws each transition's step size factor uniformly from
    ``[1 - j, 1 + j]`` (Neal, 2011, section 5.4.2.2).
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    k_noise, k_u, k_scale = jax.random.split(rng_key, 3)
    noise = flat_draw(jax.random.normal, k_noise, (num_steps, dim), dtype)
    log_u = jnp.log(jax.random.uniform(k_u, (num_steps,), dtype))
    scale = 1.0 + jitter * jax.random.uniform(k_scale, (num_steps,), dtype, -1.0, 1.0)
    return HMCTape(noise, log_u, scale)


def leapfrog(
    potential_fn: PotentialFn,
    x: Array,
    grad_x: Array,
    momentum: Array,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
    unroll: bool = False,
) -> tuple[Array, Array, Array, Array]:
    """``num_steps`` leapfrog steps from ``(x, r)`` with ``grad U(x)`` known.

    With ``unroll`` and a Python ``int`` count the steps are written out, no
    loop: on a GPU every iteration of a loop launches its kernels and waits
    for the loop's condition on the host, and written-out steps of a cheap
    potential fuse into few kernels. The same arithmetic either way (the
    compiler may round it differently).

    Returns:
        ``(y, U(y), grad U(y), r_L)``; one gradient evaluation per step.
    """

    def body(_, carry):
        x, _, grad, r = carry
        r = r - 0.5 * step_size * mul_sqrt_t(mass_sqrt, grad)
        x = x + step_size * mul_sqrt(mass_sqrt, r)
        potential, grad = jax.value_and_grad(potential_fn)(x)
        r = r - 0.5 * step_size * mul_sqrt_t(mass_sqrt, grad)
        return x, potential, grad, r

    # like `x` (zeros_like, not zeros): inside shard_map the loop carry must
    # vary over the mesh axes as the state does
    potential0 = jnp.zeros_like(x[0])
    carry = (x, potential0, grad_x, momentum)
    if unroll and isinstance(num_steps, int):
        return jax.lax.fori_loop(0, num_steps, body, carry, unroll=True)
    return jax.lax.fori_loop(0, num_steps, body, carry)


def hmc_proposal_step(
    potential_fn: PotentialFn,
    x: Array,
    potential_x: Array,
    grad_x: Array,
    tape_t: HMCTape,
    step_size: Array,
    num_steps: int,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
    unroll: bool = False,
) -> tuple[Array, Array, Array, StepInfo]:
    """One HMC transition from ``x`` whose potential and gradient are known
    (``unroll``: :func:`leapfrog`'s).

    Returns:
        ``(x_new, potential_new, grad_new, info)``.
    """
    eps = step_size * tape_t.step_scale
    y, potential_y, grad_y, r_end = leapfrog(
        potential_fn, x, grad_x, tape_t.noise, eps, num_steps, mass_sqrt, unroll
    )
    log_ratio = (
        potential_x
        - potential_y
        + 0.5 * jnp.sum(tape_t.noise**2)
        - 0.5 * jnp.sum(r_end**2)
    )
    return metropolis_accept(
        gate,
        log_ratio,
        tape_t.log_u,
        (y, potential_y, grad_y),
        (x, potential_x, grad_x),
    )


@dataclass(frozen=True)
class HMC:
    """Hamiltonian Monte Carlo with ``num_steps`` leapfrog steps, a :class:`Transition`.

    Attributes:
        num_steps: leapfrog steps per transition (``L``): ``L`` gradients
            per transition in a sequential loop, ``L + 1`` in the step the
            Newton solver linearises.
        jitter: each transition's step size is ``eps`` times a factor drawn
            uniformly from ``[1 - jitter, 1 + jitter]`` (taped).
        unroll: the leapfrog steps written out rather than looped
            (:func:`leapfrog`), for accelerators: the same arithmetic.
    """

    num_steps: int = 4
    jitter: float = 0.0
    unroll: bool = False

    def __post_init__(self):
        num_steps, jitter = self.num_steps, self.jitter
        if not (
            isinstance(num_steps, numbers.Integral)
            and not isinstance(num_steps, bool)
            and num_steps >= 1
        ):
            raise ValueError(
                f"HMC(num_steps={num_steps!r}): use an integer >= 1 (leapfrog "
                "steps per transition)."
            )
        if not (
            isinstance(jitter, numbers.Real)
            and not isinstance(jitter, bool)
            and 0 <= jitter < 1
        ):
            raise ValueError(
                f"HMC(jitter={jitter!r}): the step size jitter must be a number "
                "in [0, 1) (0: no step size jitter; each transition's step size "
                "is eps times a factor drawn from [1 - jitter, 1 + jitter])."
            )
        # NumPy scalars as Python numbers: a hashable, comparable transition
        object.__setattr__(self, "num_steps", int(num_steps))
        object.__setattr__(self, "jitter", float(jitter))
        object.__setattr__(self, "unroll", bool(self.unroll))

    def make_tape(self, key: Array, num_steps: int, dim: int, dtype=None) -> HMCTape:
        return make_hmc_tape(key, num_steps, dim, dtype, self.jitter)

    def step(
        self,
        potential_fn: PotentialFn,
        step_size: Array,
        carry: Carry,
        tape_t: HMCTape,
        mass_sqrt: Array | None = None,
        gate: Gate = HardGate(),
    ) -> tuple[Carry, StepInfo]:
        x, potential_x, grad_x, info = hmc_proposal_step(
            potential_fn,
            *carry,
            tape_t,
            step_size,
            self.num_steps,
            mass_sqrt,
            gate,
            self.unroll,
        )
        return (x, potential_x, grad_x), info

    def rotate_tape(self, tape: HMCTape, basis: Array) -> HMCTape:
        return tape._replace(noise=tape.noise @ basis)


class TracedHMC(NamedTuple):
    """:class:`HMC` with the leapfrog count ``num_steps`` an int32 array.

    Its static form, ``num_steps=None`` (:func:`split_leapfrog`), keys a
    compiled program that serves every leapfrog count; inside it
    :func:`with_leapfrog` puts the traced count in, and the leapfrog loop
    runs to it (a ``while`` loop, which forward-mode derivatives, the Newton
    solver's, go through as through a fixed one). Its draws are those of
    ``HMC(num_steps=n)`` for the value ``n`` it holds, bit for bit on the
    CPU, in the same time (16 chains of 1,024 transitions of eight schools,
    ``L = 4``: 4.6 ms either way).
    """

    num_steps: Array | None
    jitter: float
    unroll: bool = False  # a traced count is looped

    make_tape = HMC.make_tape
    step = HMC.step
    rotate_tape = HMC.rotate_tape


QUARTER_PERIOD = math.pi / 2
"""The trajectory :func:`num_steps_for` aims at: a quarter period of a
direction of unit curvature in the metric."""

MAX_NUM_STEPS = 32
"""The most leapfrog steps :func:`num_steps_for` gives (a floor on the step
size it pays for)."""


def num_steps_for(
    step_size: Array,
    trajectory: float = QUARTER_PERIOD,
    min_steps: int = 1,
    max_steps: int = MAX_NUM_STEPS,
) -> Array:
    r"""Leapfrog steps for a trajectory of length ``trajectory`` at ``step_size``:
    :math:`L = \lceil \tau / \epsilon \rceil`, clipped to ``[min_steps,
    max_steps]`` (an int32 array).

    In a metric that whitens the posterior (the inverse mean Hessian, or the
    draws' variances), a direction of unit curvature oscillates with period
    :math:`2\pi` under the leapfrog dynamics. A quarter period
    (:math:`\tau = \pi / 2`, the default) takes a draw to a nearly independent
    point in both its value and its square, where half a period would give
    antithetic values and an unchanged square (Neal, 2011, section 5.4.2.2).
    A fixed ``L`` misses it as the adapted step size shrinks with the
    dimension (about :math:`D^{-1/4}`).
    """
    steps = jnp.ceil(trajectory / jnp.asarray(step_size))
    steps = jnp.where(jnp.isfinite(steps), steps, max_steps)
    return jnp.clip(steps, min_steps, max_steps).astype(jnp.int32)


def split_leapfrog(transition) -> tuple[object, Array]:
    """``(static part, leapfrog count)`` of a transition: for :class:`HMC`,
    ``TracedHMC(None, jitter)`` (the same for every count, so a compiled
    program keyed on it serves them all) and the count as a NumPy int32;
    any other transition as it is, and 0."""
    if isinstance(transition, HMC):
        static = TracedHMC(None, transition.jitter)
        return static, np.int32(transition.num_steps)
    return transition, np.int32(0)


def with_leapfrog(transition, num_steps: Array):
    """Inside a compiled program: the static :class:`TracedHMC` of
    :func:`split_leapfrog` with the traced count ``num_steps``; any other
    transition (a fixed :class:`HMC` included) as it is."""
    if isinstance(transition, TracedHMC):
        return transition._replace(num_steps=num_steps)
    return transition
