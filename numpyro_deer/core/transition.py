r"""The transition protocol: a taped Markov transition on flat arrays.

All randomness of a block of ``T`` steps is drawn first (the *tape*); one step
is then a deterministic map ``s_t = f_t(s_{t-1})`` of the state alone
(Zoltowski et al., 2025, section 3), which the Newton solver
(:mod:`numpyro_deer.core.newton`) solves for all ``t`` at once. A
:class:`Transition` says how to draw the tape and how to take one step; the
helpers below build on any transition what the solver and the kernels need:
the step as a function of ``x`` alone (:func:`make_step_fn`, what the solver
linearises), the same step carrying ``(x, U(x), grad U(x))`` so that a
sequential loop costs one gradient per step (:func:`make_sequential_step`),
the sequential reference chain (:func:`sequential_chain`) and the sequential
completion of a partly solved block (:func:`finish_chain`).

:class:`~numpyro_deer.core.mala.MALA` is the first transition. A transition
selects its next state through :func:`~numpyro_deer.core.gates.gated_select`,
so the derivative of the accept decision is a strategy shared by all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import Array

from .gates import Gate, HardGate, gated_select

MAX_DELTA_ENERGY = 1000.0
"""The energy error above which a proposal is flagged as diverging.

A proposal's energy error is ``-log a``, minus the log Metropolis ratio (for
HMC the change of the Hamiltonian ``U + |r|^2 / 2`` over the leapfrog steps).
NumPyro's HMC and NUTS flag a transition whose energy error exceeds their
``max_delta_energy``, 1000 by default, as Stan does; this is the same
threshold. Such a proposal is taken with probability below ``exp(-1000)``, so
the flag never changes the chain; it counts where the integrator broke down.
"""

PotentialFn = Callable[[Array], Array]
Tape = Any  # a pytree of arrays with leading axis T
Carry = tuple[Array, Array, Array]  # (x, U(x), grad U(x))


class StepInfo(NamedTuple):
    """What one step reports besides its new state.

    Attributes:
        potential_energy: ``U`` at the returned state.
        accept_prob: ``min(1, exp(log a))``; 0 for a non-finite proposal.
        accepted: whether the proposal was taken.
        diverging: whether the proposal diverged: its potential or ratio is
            not finite, or its energy error ``-log a`` exceeds
            :data:`MAX_DELTA_ENERGY` (NumPyro's and Stan's criterion).
    """

    potential_energy: Array
    accept_prob: Array
    accepted: Array
    diverging: Array


def flat_draw(sampler: Callable, key: Array, shape: tuple[int, ...], dtype) -> Array:
    """``sampler(key, shape, dtype)`` drawn flat and reshaped.

    With JAX's partitionable threefry (the default) a flat draw reshaped has
    the same values as a draw of ``shape``, and XLA compiles it several times
    faster on the CPU (measured: 0.24 s instead of 0.93 s for a ``(1024, 10)``
    normal draw; ``benchmarks/compile_profile.py``).
    """
    return sampler(key, (math.prod(shape),), dtype).reshape(shape)


StepFn = Callable[[Array, Any], tuple[Array, Any]]
"""``(x, tape_t) -> (x_new, aux)``: one taped step, what the solver linearises."""


class Transition(Protocol):
    """A taped Markov transition ``s_t = f_t(s_{t-1})`` on flat arrays ``(D,)``."""

    def make_tape(self, key: Array, num_steps: int, dim: int, dtype=None) -> Tape:
        """All randomness of ``num_steps`` steps, a pytree with leading axis ``T``."""
        ...

    def step(
        self,
        potential_fn: PotentialFn,
        step_size: Array,
        carry: Carry,
        tape_t: Tape,
        mass_sqrt: Array | None = None,
        gate: Gate = HardGate(),
    ) -> tuple[Carry, StepInfo]:
        """One step from ``carry = (x, U(x), grad U(x))`` with tape entry ``tape_t``.

        Must evaluate the gradient once (at the proposal) and select the next
        state with :func:`~numpyro_deer.core.gates.gated_select`.
        """
        ...

    def rotate_tape(self, tape: Tape, basis: Array) -> Tape:
        """The tape of the chain of ``u = Q^T x`` (``Q = basis`` orthogonal).

        With the identity mass matrix the transition commutes with a rotation
        once its Gaussian draws are rotated too, so the chain of ``u`` is
        ``Q^T`` times the chain of ``x``.
        """
        ...


class SequentialStep(NamedTuple):
    """A faster form of the same step for sequential loops.

    ``init(x) -> c`` and ``step(c, tape_t) -> (c, x_new)``, where the carry
    ``c`` may hold what the next step reuses (the potential and gradient at
    the current state, so a step costs one gradient evaluation instead of
    two). It must compute the same ``x_new`` as the step function up to
    rounding: where the solver uses it (the sweep) its values are only a
    guess, tested by the step function like every other step.
    """

    init: Callable[[Array], Any]
    step: Callable[[Any, Any], tuple[Any, Array]]


def carry_at(potential_fn: PotentialFn, x: Array) -> Carry:
    """``(x, U(x), grad U(x))``: what :meth:`Transition.step` carries."""
    return (x, *jax.value_and_grad(potential_fn)(x))


def make_step_fn(
    transition: Transition,
    potential_fn: PotentialFn,
    step_size: Array,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
) -> Callable[[Array, Tape], tuple[Array, StepInfo]]:
    """The taped transition ``f_t`` as a function ``(x, tape_t) -> (x_new, info)``.

    This is the map the Newton solver linearises; it recomputes ``U(x)`` and its
    gradient, so it is a pure function of ``x`` and the tape entry.
    """

    def step_fn(x: Array, tape_t: Tape) -> tuple[Array, StepInfo]:
        carry = carry_at(potential_fn, x)
        (x_new, _, _), info = transition.step(
            potential_fn, step_size, carry, tape_t, mass_sqrt, gate
        )
        return x_new, info

    return step_fn


def _carried_step(
    transition: Transition,
    potential_fn: PotentialFn,
    step_size: Array,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
) -> Callable[[Carry, Tape], tuple[Carry, tuple[Array, StepInfo]]]:
    """``(carry, tape_t) -> (carry, (x_new, info))``: one step with
    ``carry = (x, U(x), grad U(x))``, one gradient evaluation."""

    def step(carry, tape_t):
        carry, info = transition.step(
            potential_fn, step_size, carry, tape_t, mass_sqrt, gate
        )
        return carry, (carry[0], info)

    return step


def make_sequential_step(
    transition: Transition,
    potential_fn: PotentialFn,
    step_size: Array,
    mass_sqrt: Array | None = None,
    gate: Gate = HardGate(),
) -> SequentialStep:
    """The step of :func:`make_step_fn` with ``(x, U(x), grad U(x))`` carried.

    For the sweep's sequential segments (``DEERSolver(sweep=k)``): each step
    then costs one gradient evaluation instead of two.
    """
    step = _carried_step(transition, potential_fn, step_size, mass_sqrt, gate)

    def advance(carry, tape_t):
        carry, (x_new, _) = step(carry, tape_t)
        return carry, x_new

    return SequentialStep(partial(carry_at, potential_fn), advance)


def plain_sequential_step(step_fn: StepFn) -> SequentialStep:
    """The step function itself as a :class:`SequentialStep` (carry ``= x``)."""

    def step(x, tape_t):
        x_new, _ = step_fn(x, tape_t)
        return x_new, x_new

    return SequentialStep(lambda x: x, step)


def sequential_steps(
    step: Callable[[Any, Any], tuple[Any, Any]],
    carry: Any,
    tape: Tape,
    outputs: Any = None,
    start: Array | int = 0,
    stop: Array | int | None = None,
) -> tuple[Any, Any]:
    """Steps ``start .. stop - 1`` of a tape, one after the other.

    ``step(carry, tape[t]) -> (carry, y_t)`` and ``outputs[t] = y_t`` (a
    pytree of arrays with leading axis ``T``); rows outside
    ``[start, stop)`` keep their values. ``start`` and ``stop`` (default
    ``T``) may be traced. With ``outputs=None`` every step of the tape runs
    and the ``y_t`` are stacked (a :func:`jax.lax.scan`, which compiles
    faster than writing into given outputs). The one sequential loop over a
    tape: the reference chain, the completion of a partly solved block and
    the sweep's segments (:mod:`numpyro_deer.core.sweep`) all run it.

    Returns:
        ``(carry, outputs)`` after the last step.
    """
    if outputs is None:
        if not (isinstance(start, int) and start == 0 and stop is None):
            raise ValueError(
                "sequential_steps(outputs=None) runs the whole tape: pass "
                "outputs to run steps start .. stop - 1."
            )
        return jax.lax.scan(step, carry, tape)
    if stop is None:
        stop = jax.tree.leaves(tape)[0].shape[0]

    def body(t, state):
        carry, outputs = state
        carry, y = step(carry, jax.tree.map(lambda a: a[t], tape))
        return carry, jax.tree.map(lambda a, v: a.at[t].set(v), outputs, y)

    return jax.lax.fori_loop(start, stop, body, (carry, outputs))


def sequential_chain(
    transition: Transition,
    potential_fn: PotentialFn,
    x0: Array,
    tape: Tape,
    step_size: Array,
    mass_sqrt: Array | None = None,
) -> tuple[Array, StepInfo]:
    """The reference: the same taped chain, one step after the other.

    The gradient at the current state is carried, so each step costs one
    gradient evaluation. Given the same tape, this and the DEER solution are
    the same chain.

    Returns:
        ``(states, infos)`` with states ``s_1 .. s_T`` of shape ``(T, D)``.
    """
    step = _carried_step(transition, potential_fn, step_size, mass_sqrt)
    _, (states, infos) = sequential_steps(step, carry_at(potential_fn, x0), tape)
    return states, infos


def finish_chain(
    transition: Transition,
    potential_fn: PotentialFn,
    x0: Array,
    tape: Tape,
    step_size: Array,
    states: Array,
    infos: StepInfo,
    start: Array,
    mass_sqrt: Array | None = None,
    stop: Array | int | None = None,
) -> tuple[Array, StepInfo]:
    """Complete a partly solved block sequentially from step ``start``.

    ``states[:start]`` (with their ``infos``) are kept, and steps
    ``start .. T-1`` are computed one after the other from ``states[start - 1]``
    (``x0`` when ``start == 0``) with the same tape, as :func:`sequential_chain`
    does. Used when a DEER solve stops before the end of its block: only the
    steps past its front are recomputed, so a block's cost is never more than
    the solve's iterations plus ``T - front`` sequential steps.
    """
    x_start = jnp.where(start > 0, states[jnp.maximum(start - 1, 0)], x0)
    step = _carried_step(transition, potential_fn, step_size, mass_sqrt)
    carry = carry_at(potential_fn, x_start)
    _, (states, infos) = sequential_steps(
        step, carry, tape, (states, infos), start, stop
    )
    return states, infos


def metropolis_accept(
    gate: Gate,
    log_ratio: Array,
    log_u: Array,
    proposed: tuple[Array, Array, Array],
    current: tuple[Array, Array, Array],
) -> tuple[Array, Array, Array, StepInfo]:
    """The Metropolis decision on a proposal, shared by every transition.

    ``proposed`` and ``current`` are ``(x, U(x), grad U(x))``. The proposal is
    taken when ``log u < log a`` (Metropolis et al., 1953; Hastings, 1970),
    through ``gate`` (whose tangent the Newton solver uses). A proposal whose
    potential or log ratio is not finite is rejected and flagged as diverging;
    one whose energy error ``-log a`` exceeds :data:`MAX_DELTA_ENERGY` is
    flagged too, as NumPyro flags it (its accept decision is the usual one).
    The flag is a step info, not part of the state: the Newton solve never
    iterates on it.

    Returns:
        ``(x_new, U(x_new), grad U(x_new), info)``.
    """
    y, potential_y, grad_y = proposed
    x, potential_x, grad_x = current
    nonfinite = ~(jnp.isfinite(log_ratio) & jnp.isfinite(potential_y))
    log_ratio = jnp.where(nonfinite, -jnp.inf, log_ratio)
    diverging = nonfinite | (-log_ratio > MAX_DELTA_ENERGY)
    margin = log_ratio - log_u
    x_new = gated_select(gate, margin, y, x)
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
