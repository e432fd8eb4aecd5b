r"""The DEER Newton solver for a taped recursion ``s_t = f_t(s_{t-1})``.

Stack the trajectory ``S = (s_1, ..., s_T)`` of a block. Newton's method on the
residual ``s_t - f_t(s_{t-1})`` from an iterate ``S^(i)`` gives the linear
recursion (Lim et al., 2024; Zoltowski et al., 2025)

.. math::

    s_t^{(i+1)} = J_t s_{t-1}^{(i+1)} + f_t(s_{t-1}^{(i)}) - J_t s_{t-1}^{(i)},

with ``J_t`` a Jacobian approximation of ``f_t`` at ``s_{t-1}^{(i)}`` (see
:mod:`numpyro_deer.core.jacobian`), solved by an associative scan.

**Stopping, front and certificate.** Each iteration first evaluates
``F_t = f_t(s_{t-1})`` at the current iterate; the residual
``r_t = s_t - F_t`` is the Newton update of the first unconverged step and the
quantity the certificate bounds. Step ``t`` passes when
``|r_t| <= atol + rtol |F_t|`` elementwise. The *front* is the number of leading
steps that pass: those states are frozen (never changed again) and, because
each was checked against its frozen predecessor, the returned block is the
chain up to the reported residual. The first unfrozen step is then set to
``F_t`` exactly, so the front grows by at least one step per iteration and the
first ``k`` states are exact after ``k`` iterations, whatever ``J`` is.

**Sweep.** With ``sweep = k > 0`` an iteration (after the first
``sweep_after``) first runs ``k`` sequential steps from the front and from
every local front (:mod:`numpyro_deer.core.sweep`) and writes them into the
iterate, which the iteration then tests as usual.

**Why a solve stops.** :class:`NewtonInfo` carries a result code
(:class:`~numpyro_deer.core.results.RESULTS`): converged, the iteration
limit, no progress, or a non-finite value; ``RESULTS.message`` says what each
means.

There is one iteration body
(:func:`~numpyro_deer.core.iteration.newton_iteration`, shared with the
sharded solver); :func:`solve_loop` loops it under
:func:`jax.lax.while_loop` with no host synchronisation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from .certificate import tree_where
from .iteration import IterationCarry, newton_iteration, whole_block
from .results import RESULTS, NewtonInfo, no_solve_info
from .solver import MAX_TOLERANCE, DEERSolver
from .transition import SequentialStep, StepFn

__all__ = [
    "MAX_TOLERANCE",
    "RESULTS",
    "DEERSolver",
    "NewtonInfo",
    "deer_solve",
    "newton_iterates",
    "newton_pilot",
    "no_solve_info",
    "solve_loop",
]


def _initial_carry(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    init_states: Array | None,
    first_iteration: Array | int = 0,
) -> IterationCarry:
    num_steps = jax.tree.leaves(tape)[0].shape[0]
    if init_states is None:
        init_states = jnp.broadcast_to(x0, (num_steps,) + x0.shape)
    states = jnp.concatenate([x0[None], init_states])
    _, aux_shape = jax.eval_shape(step_fn, x0, jax.tree.map(lambda x: x[0], tape))
    aux = jax.tree.map(lambda s: jnp.zeros((num_steps,) + s.shape, s.dtype), aux_shape)
    zero = jnp.zeros((), jnp.int32)
    return IterationCarry(
        states,
        aux,
        zero,
        jnp.asarray(first_iteration, jnp.int32),
        jnp.zeros((), x0.dtype),
        jnp.zeros((), bool),
        jnp.zeros((num_steps,), bool),
    )


class SolveState(NamedTuple):
    """A block's solves between Newton iterations (:func:`solve_loop`).

    Attributes:
        carry: the Newton iterate and its front, certificate and counts.
        solves: solves started.
        start_front: the front when the current solve started.
        stop_at: the iteration count that ends the current solve.
        progressed: whether the last finished solve moved the front.
        active: whether another iteration follows.
    """

    carry: Any
    solves: Array
    start_front: Array
    stop_at: Array
    progressed: Array
    active: Array


def start_solves(carry: Any, num_steps: int, solver: DEERSolver) -> SolveState:
    """The first solve, started where the block is unfinished."""
    active = (carry.front < num_steps) & ~carry.nonfinite
    return SolveState(
        carry=carry,
        solves=active.astype(jnp.int32),
        start_front=carry.front,
        stop_at=carry.iteration + solver.max_iter,
        progressed=jnp.ones((), bool),
        active=active,
    )


def solve_trip(
    iteration: Callable[[Any], Any],
    num_steps: int,
    solver: DEERSolver,
    state: SolveState,
    keep_inactive: bool = False,
) -> SolveState:
    """One Newton iteration, then the solves' bookkeeping: a solve ends when
    the block passes, an iterate turns non-finite or it has run
    ``solver.max_iter`` iterations; the next starts at the front if the block
    is unfinished, the solve moved the front and solves are left.
    ``keep_inactive``: a state that is not active keeps its value (loops that
    run it anyway: chains in lockstep, devices in step)."""
    carry = iteration(state.carry)
    unfinished = (carry.front < num_steps) & ~carry.nonfinite
    ends = ~(unfinished & (carry.iteration < state.stop_at))
    progressed = jnp.where(ends, carry.front > state.start_front, state.progressed)
    starts = ends & unfinished & progressed & (state.solves < solver.max_solves)
    new = SolveState(
        carry=carry,
        solves=state.solves + starts,
        start_front=jnp.where(starts, carry.front, state.start_front),
        stop_at=jnp.where(starts, carry.iteration + solver.max_iter, state.stop_at),
        progressed=progressed,
        active=~ends | starts,
    )
    return tree_where(state.active, new, state) if keep_inactive else new


def solve_loop(
    iteration: Callable[[Any], Any],
    carry: Any,
    num_steps: int,
    solver: DEERSolver,
    sync: Callable[[Array], Array] | None = None,
) -> tuple[Any, NewtonInfo]:
    """Run ``iteration`` in solves of at most ``solver.max_iter`` iterations.

    Each solve restarts at the front with the current iterate. Stops when the
    block passes, a solve makes no progress, an iterate turns non-finite, or
    ``solver.max_solves`` solves are spent, and says which in the result code.
    Shared by every solver (unsharded, sharded and the batched one of
    :mod:`~numpyro_deer.core.batched`, one :func:`solve_trip` per Newton
    iteration); only the iteration differs. The carry needs ``front``,
    ``iteration``, ``residual`` and ``nonfinite``.

    ``sync`` (inside ``shard_map``) turns the loop condition into one shared
    by devices that solve other blocks, e.g. a ``pmax`` over a mesh axis of
    chains: the loops then take the same number of trips on every device (so
    their collectives meet), and a device whose own solves have stopped keeps
    its carry.
    """

    def trip(state, keep_inactive=sync is not None):
        return solve_trip(iteration, num_steps, solver, state, keep_inactive)

    def more(state):
        return state.active if sync is None else sync(state.active)

    state = jax.lax.while_loop(more, trip, start_solves(carry, num_steps, solver))
    return state.carry, solve_info(
        state.carry, state.solves, state.progressed, num_steps, solver
    )


def solve_info(
    carry: Any, solves: Array, progressed: Array, num_steps: int, solver: DEERSolver
) -> NewtonInfo:
    """The :class:`NewtonInfo` of a finished :func:`solve_loop`: its carry,
    the solves taken and whether the last one moved the front."""
    result = jnp.where(
        carry.front >= num_steps,
        RESULTS.successful,
        jnp.where(
            carry.nonfinite,
            RESULTS.nonfinite,
            # a solve without progress stops the loop before the last solve
            jnp.where(
                progressed | (solves >= solver.max_solves),
                RESULTS.max_iterations_reached,
                RESULTS.no_progress,
            ),
        ),
    ).astype(jnp.int32)
    return NewtonInfo(
        iterations=carry.iteration,
        solves=solves,
        result=result,
        front=carry.front,
        residual=carry.residual,
        batch_iterations=carry.iteration,
        straggler_iterations=jnp.zeros((), jnp.int32),
    )


def deer_solve(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    key: Array,
    solver: DEERSolver = DEERSolver(),
    init_states: Array | None = None,
    sequential: SequentialStep | None = None,
    first_iteration: Array | int = 0,
) -> tuple[Array, Any, NewtonInfo]:
    """Solve a block of ``T`` taped steps from ``x0`` in parallel.

    Runs solves of at most ``solver.max_iter`` iterations, each restarting at
    the front with the current iterate, until the block passes, a solve makes
    no progress, an iterate turns non-finite, or ``solver.max_solves`` solves
    are spent.

    Args:
        step_fn: ``(x, tape_t) -> (x_new, aux)``, the taped step.
        x0: the fixed state ``s_0``, shape ``(D,)``.
        tape: the tape, a pytree of arrays with leading axis ``T``.
        key: key for stochastic Jacobian strategies (kept apart from the tape).
        solver: the solver settings.
        init_states: initial guess ``(T, D)``; default ``x0`` repeated.
        sequential: a faster form of the step for ``solver.sweep``'s
            sequential segments (:class:`SequentialStep`); default
            ``step_fn`` itself.
        first_iteration: Newton iterations already taken on the block (by
            :func:`newton_pilot`, whose iterate is then ``init_states``): the
            count, the sweep's hold-back (``sweep_after``) and the probe keys
            go on from it, and ``info.iterations`` includes it.

    Returns:
        ``(states, aux, info)``: ``s_1..s_T``; the step infos of the
        certifying evaluation; a :class:`NewtonInfo`. Only ``states[:front]``
        is exact when ``info.converged`` is false.
    """
    num_steps = jax.tree.leaves(tape)[0].shape[0]
    carry = _initial_carry(step_fn, x0, tape, init_states, first_iteration)

    layout = whole_block(num_steps)

    def iteration(c):
        return newton_iteration(step_fn, solver, tape, key, c, layout, sequential)

    carry, info = solve_loop(iteration, carry, num_steps, solver)
    return carry.states[1:], carry.aux, info


def newton_iterates(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    key: Array,
    num_iterations: int,
    solver: DEERSolver = DEERSolver(),
) -> Array:
    """The first ``num_iterations`` Newton iterates, for diagnostics and figures.

    The same iteration body as :func:`deer_solve`, under a fixed-length
    :func:`jax.lax.scan` (no stopping).

    Returns:
        The iterates ``S^(1) .. S^(k)``, shape ``(num_iterations, T, D)``.
    """
    carry = _initial_carry(step_fn, x0, tape, None)
    layout = whole_block(carry.passed.shape[0])

    def body(c, _):
        c = newton_iteration(step_fn, solver, tape, key, c, layout)
        return c, c.states[1:]

    _, iterates = jax.lax.scan(body, carry, None, length=num_iterations)
    return iterates


def newton_pilot(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    key: Array,
    solver: DEERSolver,
    num_iterations: Array | int,
) -> IterationCarry:
    """At most ``num_iterations`` Newton iterations of a block from ``x0``
    repeated, fewer where the block passes or an iterate turns non-finite.

    ``num_iterations`` may be traced (0: none, at the cost of a test), so a
    vmapped batch runs as many iterations as its largest. The iterate
    ``carry.states[1:]`` is a rough path of the block, e.g. for a guess of its
    curvature before the solve; ``carry.iteration`` iterations were taken
    (pass both on to :func:`deer_solve`: ``init_states`` and
    ``first_iteration``). The pilot never sweeps (``solver.sweep`` is
    ignored): its iterations are meant to be fewer than ``sweep_after``, and
    without the sweep its loop is a smaller program to compile.
    """
    carry = _initial_carry(step_fn, x0, tape, None)
    num_steps = carry.passed.shape[0]
    layout = whole_block(num_steps)
    plain = dataclasses.replace(solver, sweep=0)

    def more(c):
        return (c.iteration < num_iterations) & (c.front < num_steps) & ~c.nonfinite

    def body(c):
        return newton_iteration(step_fn, plain, tape, key, c, layout)

    return jax.lax.while_loop(more, body, carry)
