r"""The DEER Newton solver for a taped recursion ``s_t = f_t(s_{t-1})``.

Stack the trajectory ``S = (s_1, ..., s_T)`` of a block. Newton's method on the
residual ``s_t - f_t(s_{t-1})`` from an iterate ``S^(i)`` gives the linear
recursion (Lim et al., 2024; Zoltowski et al., 2025)

.. math::

    s_t^{(i+1)} = J_t s_{t-1}^{(i+1)} + f_t(s_{t-1}^{(i)}) - J_t s_{t-1}^{(i)},

with ``J_t`` a Jacobian approximation of ``f_t`` at ``s_{t-1}^{(i)}`` (see
:mod:`numpyro_deer._jacobian`), solved by an associative scan.

**Stopping, front and certificate.** Each iteration first evaluates
``F_t = f_t(s_{t-1})`` at the current iterate; the residual
``r_t = s_t - F_t`` is the Newton update of the first unconverged step and the
quantity the certificate bounds. Step ``t`` passes when
``|r_t| <= atol + rtol |F_t|`` elementwise. The *front* is the number of leading
steps that pass: those states are frozen (never changed again) and, because
each was checked against its frozen predecessor, the returned block is a MALA
chain up to the reported residual. The first unfrozen step is then set to
``F_t`` exactly, so the front grows by at least one step per iteration and the
first ``k`` states are exact after ``k`` iterations, whatever ``J`` is.

**Windowing.** An iteration works on ``window`` steps starting at the front;
``window = T`` is plain DEER. A smaller window does less work per iteration and
advances with the front.

**Sweep.** With ``sweep = k > 0`` an iteration first runs ``k`` sequential
steps from the front and from every local front (:mod:`numpyro_deer._sweep`)
and writes them into the iterate, which the iteration then tests as usual.

There is one iteration body (:func:`_newton_iteration`); the solver loops it
under :func:`jax.lax.while_loop` with no host synchronisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ._certificate import leading_passed, step_passes
from ._jacobian import JacobianStrategy, StepFn, StochasticDiagonalJacobian
from ._sweep import (
    SequentialStep,
    coupled_segments,
    plain_sequential_step,
    sweep_segments,
    sweep_starts,
)

MAX_TOLERANCE = 1e-2
"""Largest ``atol`` or ``rtol`` a :class:`DEERSolver` accepts (whitened units)."""


@dataclass(frozen=True)
class DEERSolver:
    """Settings of the parallel Newton solve of one block.

    Attributes:
        jacobian: the Jacobian strategy object.
        atol, rtol: a step passes when ``|s_t - f_t(s_{t-1})| <= atol +
            rtol |f_t(s_{t-1})|`` in every coordinate. ``None`` picks a default
            from the dtype: ``(1e-5, 1e-4)`` in float32, ``(1e-10, 1e-8)`` in
            float64. Each must be in ``[0, MAX_TOLERANCE]`` (``1e-2``): the
            solve runs in whitened coordinates, where a posterior standard
            deviation is about 1 and a step moves about ``sqrt(2 eps)``, so a
            tolerance of that order (or an infinite one) would certify states
            that are not the MALA step (an accept decision could flip
            unnoticed); at ``1e-2`` the certified state is within a hundredth
            of a posterior standard deviation of the step.
        max_iter: Newton iterations per solve.
        max_solves: solves per block; each restarts from the front, keeping
            the iterate as the initial guess. A block still unfinished after
            ``max_iter * max_solves`` iterations reports ``converged=False``.
        damping: ``J_t`` is scaled by ``1 - damping`` (``0`` is plain Newton).
        window: steps per iteration; ``None`` uses the whole block.
        sweep: sequential steps computed at the start of each iteration from
            the front and from each local front (``0``: none); see the module
            docstring.
        segments: how many of those segments run side by side (the front's
            and the first local fronts); ``None`` takes ``T // sweep`` (the
            window's length with a window).
        sweep_after: iterations of a solve before the sweep starts (``0``:
            from the first); blocks that converge within them never pay for
            it.
        coupled_segments: before the first iteration, replace the initial
            guess by this many sequential segments run side by side and re-run
            from their predecessors' ends until they couple with the chain
            (:func:`~numpyro_deer._sweep.coupled_segments`; ``0``: none).
        coupled_passes: at most this many passes of those segments.
        vmapped: the solve runs under :func:`jax.vmap` (chains solved
            together). The sweep is then held back by a traced step count
            instead of a :func:`jax.lax.cond`, which ``vmap`` turns into a
            select that runs it in every iteration for every chain. Changes
            the cost, not the result.
    """

    jacobian: JacobianStrategy = field(default_factory=StochasticDiagonalJacobian)
    atol: float | None = None
    rtol: float | None = None
    max_iter: int = 100
    max_solves: int = 3
    damping: float = 0.0
    window: int | None = None
    sweep: int = 0
    segments: int | None = None
    sweep_after: int = 0
    coupled_segments: int = 0
    coupled_passes: int = 6
    vmapped: bool = False

    def __post_init__(self):
        # integer settings: (name, smallest value, whether None is allowed)
        for name, low, optional in (
            ("max_iter", 1, False),
            ("max_solves", 1, False),
            ("sweep", 0, False),
            ("sweep_after", 0, False),
            ("coupled_segments", 0, False),
            ("coupled_passes", 1, False),
            ("segments", 1, True),
            ("window", 1, True),
        ):
            value = getattr(self, name)
            if optional and value is None:
                continue
            if not (isinstance(value, int) and value >= low):
                allowed = f"an integer >= {low}"
                allowed = f"None or {allowed}" if optional else allowed
                raise ValueError(f"DEERSolver({name}={value!r}): use {allowed}.")
        if not 0.0 <= self.damping < 1.0:
            raise ValueError(
                f"DEERSolver(damping={self.damping!r}): damping must be in [0, 1)."
            )
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_TOLERANCE:
                raise ValueError(
                    f"DEERSolver({name}={value!r}): use a number in [0, "
                    f"{MAX_TOLERANCE}] (or None for the dtype's default). The "
                    "solve runs in whitened coordinates, where a posterior "
                    "standard deviation is about 1; a larger (or infinite) "
                    "tolerance passes steps that are not the MALA step, so the "
                    "block would not be the chain."
                )

    def num_segments(self, window: int) -> int:
        """Segments a sweep runs side by side on a window of ``window`` steps:
        ``segments``, or ``window // sweep`` (the sweep then evaluates about
        as many steps as the Newton iteration), at most ``window``."""
        segments = self.segments or window // max(self.sweep, 1)
        return max(1, min(segments, window))

    def tolerances(self, dtype) -> tuple[float, float]:
        """``(atol, rtol)`` for the given dtype."""
        wide = jnp.finfo(dtype).bits >= 64
        atol = (1e-10 if wide else 1e-5) if self.atol is None else self.atol
        rtol = (1e-8 if wide else 1e-4) if self.rtol is None else self.rtol
        return atol, rtol


class NewtonInfo(NamedTuple):
    """Outcome of a solve; failures are reported here, never hidden.

    Attributes:
        iterations: Newton iterations taken (all solves).
        solves: solves taken (restarts from the front plus one).
        converged: every step of the block passed.
        front: number of leading steps that passed (exact states).
        residual: ``max_t |s_t - f_t(s_{t-1})|`` over the passed steps: the
            certificate of the returned block.
        nonfinite: an iterate or step value became non-finite; the solve
            stopped there and the front marks what is still exact.
        segment_passes: passes of the coupled segments that made the initial
            guess (``DEERSolver.coupled_segments``; ``0`` without), each
            ``T / coupled_segments`` sequential steps.
    """

    iterations: Array
    solves: Array
    converged: Array
    front: Array
    residual: Array
    nonfinite: Array
    segment_passes: Array


class _Carry(NamedTuple):
    states: Array  # (T + W + 1, D): states[0] = s_0, states[t] = s_t, then padding
    aux: Any  # per-step info of the certifying evaluation, leading axis T + W
    front: Array
    iteration: Array
    residual: Array
    nonfinite: Array
    passed: Array  # (T + W,): the last test, by step (local fronts of the sweep)


def finite_or_fixed_point(new: Array, values: Array, cur: Array) -> Array:
    """Rows of the Newton update ``new`` that are not finite take ``F_t``.

    A Newton step can overflow beyond the front (a dense Jacobian with huge
    entries in a funnel, say). Such rows take the plain fixed-point update
    ``values = F_t`` instead (or keep ``cur`` if ``F_t`` is not finite either),
    so the solve goes on; the front logic is unaffected.
    """
    row_ok = jnp.all(jnp.isfinite(new), axis=-1, keepdims=True)
    values_ok = jnp.all(jnp.isfinite(values), axis=-1, keepdims=True)
    return jnp.where(row_ok, new, jnp.where(values_ok, values, cur))


def _newton_iteration(
    step_fn: StepFn,
    solver: DEERSolver,
    tape: Any,
    num_steps: int,
    window: int,
    key: Array,
    carry: _Carry,
    sequential: SequentialStep | None = None,
) -> _Carry:
    """One Newton iteration on the window.

    A window shorter than the block starts at the front and slides with it; a
    window of the whole block stays put, so every step is evaluated in the same
    row of the batch in every iteration (bitwise-stable values, whatever the
    device's reduction order).
    """
    front = carry.front
    dtype = carry.states.dtype
    atol, rtol = solver.tolerances(dtype)
    start = front if window < num_steps else jnp.zeros_like(front)
    if solver.sweep:
        sequential = (
            plain_sequential_step(step_fn) if sequential is None else sequential
        )
        segments = solver.num_segments(window)

        def sweep(states, passes=None):
            starts = sweep_starts(front, carry.iteration, carry.passed, segments)
            return sweep_segments(
                sequential, states, tape, starts, num_steps, solver.sweep, passes
            )

        late = carry.iteration >= solver.sweep_after  # counted per block
        if not solver.sweep_after:
            states = sweep(carry.states)
        elif solver.vmapped:
            # under vmap a cond is a select that runs the sweep in every
            # iteration; a traced step count runs none until a chain needs it
            states = sweep(carry.states, jnp.where(late, solver.sweep, 0))
        else:
            states = jax.lax.cond(late, sweep, lambda states: states, carry.states)
        carry = carry._replace(states=states)

    prev = jax.lax.dynamic_slice_in_dim(carry.states, start, window)
    cur = jax.lax.dynamic_slice_in_dim(carry.states, start + 1, window)
    tape_w = jax.tree.map(
        lambda x: jax.lax.dynamic_slice_in_dim(x, start, window), tape
    )
    lin = solver.jacobian.linearize(
        step_fn, prev, tape_w, jax.random.fold_in(key, carry.iteration)
    )
    values = lin.values

    index = jnp.arange(window)
    step = start + index  # 0-based step index of each row
    valid = step < num_steps
    certified = step < front
    passed, error = step_passes(cur, values, atol, rtol)
    passed = passed | ~valid | certified
    num_passed = leading_passed(passed)
    frozen = (index < num_passed) & valid & ~certified  # newly certified
    residual = jnp.maximum(
        carry.residual, jnp.max(jnp.where(frozen, jnp.max(error, axis=-1), 0.0))
    )
    aux_w = jax.tree.map(
        lambda x: jax.lax.dynamic_slice_in_dim(x, start, window), carry.aux
    )
    aux_w = jax.tree.map(
        lambda new, old: jnp.where(
            frozen.reshape((-1,) + (1,) * (new.ndim - 1)), new, old
        ),
        lin.aux,
        aux_w,
    )

    # Linear step. Frozen steps map to their own value (A = 0, b = s_t); the
    # first unfrozen step starts from a frozen predecessor, so it is F_t exactly.
    J = lin.jacobian * (1.0 - solver.damping)
    if solver.jacobian.structure == "dense":
        offset = values - jnp.einsum("tij,tj->ti", J, prev)
    else:
        offset = values - J * prev
    fixed = (index <= num_passed)[:, None]
    b = jnp.where(index[:, None] < num_passed, cur, jnp.where(fixed, values, offset))
    A = jnp.where(fixed[..., None] if J.ndim == 3 else fixed, 0.0, J)
    new_cur = solver.jacobian.scan(A, b)
    new_cur = finite_or_fixed_point(new_cur, values, cur)

    nonfinite = carry.nonfinite | ~jnp.all(jnp.isfinite(new_cur) | ~valid[:, None])
    states = jax.lax.dynamic_update_slice_in_dim(carry.states, new_cur, start + 1, 0)
    aux = jax.tree.map(
        lambda full, part: jax.lax.dynamic_update_slice_in_dim(full, part, start, 0),
        carry.aux,
        aux_w,
    )
    return _Carry(
        states=states,
        aux=aux,
        front=jnp.minimum(start + num_passed, num_steps),
        iteration=carry.iteration + 1,
        residual=residual,
        nonfinite=nonfinite,
        # the test by step, for the next sweep's local fronts (none without)
        passed=jax.lax.dynamic_update_slice_in_dim(
            carry.passed, passed & valid, start, 0
        )
        if solver.sweep
        else carry.passed,
    )


def _initial_carry(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    window: int,
    init_states: Array | None,
) -> tuple[_Carry, Any]:
    """The starting carry and the tape padded by one window of zeros."""
    num_steps = jax.tree.leaves(tape)[0].shape[0]
    if init_states is None:
        init_states = jnp.broadcast_to(x0, (num_steps,) + x0.shape)
    # a sliding window reads up to one window past the end: pad by a window
    pad = window if window < num_steps else 0
    states = jnp.concatenate(
        [x0[None], init_states, jnp.broadcast_to(x0, (pad,) + x0.shape)]
    )
    padded_tape = jax.tree.map(
        lambda x: jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)]),
        tape,
    )
    _, aux_shape = jax.eval_shape(step_fn, x0, jax.tree.map(lambda x: x[0], tape))
    aux = jax.tree.map(
        lambda s: jnp.zeros((num_steps + pad,) + s.shape, s.dtype), aux_shape
    )
    zero = jnp.zeros((), jnp.int32)
    carry = _Carry(
        states,
        aux,
        zero,
        zero,
        jnp.zeros((), x0.dtype),
        jnp.zeros((), bool),
        jnp.zeros((num_steps + pad,), bool),
    )
    return carry, padded_tape


def solve_loop(
    iteration: Callable[[_Carry], _Carry],
    carry: _Carry,
    num_steps: int,
    solver: DEERSolver,
) -> tuple[_Carry, NewtonInfo]:
    """Run ``iteration`` in solves of at most ``solver.max_iter`` iterations.

    Each solve restarts at the front with the current iterate. Stops when the
    block passes, a solve makes no progress, an iterate turns non-finite, or
    ``solver.max_solves`` solves are spent. Shared by every solver (unsharded
    and sharded); only the iteration differs.
    """

    def one_solve(outer):
        carry, solves, _ = outer
        start_front = carry.front
        stop_at = carry.iteration + solver.max_iter

        def go_on(c):
            return (c.front < num_steps) & (c.iteration < stop_at) & ~c.nonfinite

        carry = jax.lax.while_loop(go_on, iteration, carry)
        return carry, solves + 1, carry.front > start_front

    def more_solves(outer):
        carry, solves, progressed = outer
        return (
            (carry.front < num_steps)
            & (solves < solver.max_solves)
            & progressed
            & ~carry.nonfinite
        )

    zero = jnp.zeros((), jnp.int32)
    carry, solves, _ = jax.lax.while_loop(
        more_solves, one_solve, (carry, zero, jnp.ones((), bool))
    )
    info = NewtonInfo(
        iterations=carry.iteration,
        solves=solves,
        converged=carry.front >= num_steps,
        front=carry.front,
        residual=carry.residual,
        nonfinite=carry.nonfinite,
        segment_passes=zero,
    )
    return carry, info


def deer_solve(
    step_fn: StepFn,
    x0: Array,
    tape: Any,
    key: Array,
    solver: DEERSolver = DEERSolver(),
    init_states: Array | None = None,
    sequential: SequentialStep | None = None,
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

    Returns:
        ``(states, aux, info)``: ``s_1..s_T``; the step infos of the
        certifying evaluation; a :class:`NewtonInfo`. Only ``states[:front]``
        is exact when ``info.converged`` is false.
    """
    num_steps = jax.tree.leaves(tape)[0].shape[0]
    window = num_steps if solver.window is None else min(solver.window, num_steps)
    passes = jnp.zeros((), jnp.int32)
    if solver.coupled_segments:
        if init_states is None:
            init_states = jnp.broadcast_to(x0, (num_steps,) + x0.shape)
        init_states, passes = coupled_segments(
            step_fn,
            plain_sequential_step(step_fn) if sequential is None else sequential,
            x0,
            tape,
            init_states,
            solver.coupled_segments,
            solver.coupled_passes,
            *solver.tolerances(x0.dtype),
        )
    carry, padded_tape = _initial_carry(step_fn, x0, tape, window, init_states)

    def iteration(c):
        return _newton_iteration(
            step_fn, solver, padded_tape, num_steps, window, key, c, sequential
        )

    carry, info = solve_loop(iteration, carry, num_steps, solver)
    aux = jax.tree.map(lambda x: x[:num_steps], carry.aux)
    return carry.states[1 : num_steps + 1], aux, info._replace(segment_passes=passes)


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
    :func:`jax.lax.scan` over the whole block (no window, no stopping).

    Returns:
        The iterates ``S^(1) .. S^(k)``, shape ``(num_iterations, T, D)``.
    """
    num_steps = jax.tree.leaves(tape)[0].shape[0]
    carry, padded_tape = _initial_carry(step_fn, x0, tape, num_steps, None)

    def body(c, _):
        c = _newton_iteration(
            step_fn, solver, padded_tape, num_steps, num_steps, key, c
        )
        return c, c.states[1 : num_steps + 1]

    _, iterates = jax.lax.scan(body, carry, None, length=num_iterations)
    return iterates
