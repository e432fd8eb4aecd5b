r"""One DEER Newton iteration, on a whole block or on one device's slice of it.

From the iterate ``S^(i)`` the iteration evaluates ``F_t = f_t(s_{t-1})`` and
a Jacobian approximation ``J_t`` (the strategy's ``linearize``), tests every
step (``|s_t - F_t| <= atol + rtol |F_t|``,
:func:`~numpyro_deer.core.certificate.step_passes`), moves the front to the
first failing step, freezes the newly passed steps (their residual is the
certificate, their step infos the block's) and takes the Newton step

.. math::

    s_t^{(i+1)} = J_t s_{t-1}^{(i+1)} + F_t - J_t s_{t-1}^{(i)}

with frozen steps mapped to themselves and the first unfrozen one set to
``F_t`` (the strategy's ``newton_step``; Lim et al., 2024; Zoltowski et al.,
2025). :func:`newton_iteration` is that step for both solvers; a
:class:`Layout` says where its rows sit:

- :func:`whole_block` (:func:`~numpyro_deer.core.deer_solve`): the iterate
  holds ``s_0 .. s_T``, the reductions over slices are the identity and the
  sweep (:mod:`numpyro_deer.core.sweep`) may run first;
- the sharded solver (:mod:`numpyro_deer.core.sharded`) builds a layout
  whose rows are one device's slice, whose predecessor of the first row comes
  from the previous device, whose front and certificate are reduced over the
  mesh axis, and whose linear step is a two-level scan.

Every step is evaluated in the same row of the batch in every iteration
(bitwise-stable values, whatever the device's reduction order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from .certificate import leading_passed, step_passes, where_rows
from .sweep import sweep_segments, sweep_starts
from .transition import SequentialStep, StepFn, plain_sequential_step

if TYPE_CHECKING:
    from .newton import DEERSolver


class IterationCarry(NamedTuple):
    """The state of a solve between iterations.

    Attributes:
        states: the iterate's rows (see :class:`Layout`).
        aux: per-step info of the certifying evaluation, leading axis the
            steps of the rows.
        front: the number of leading steps of the whole block that passed.
        iteration: iterations taken.
        residual: the certificate, the largest residual of the frozen steps.
        nonfinite: whether an iterate became non-finite.
        passed: the last test, by step (the sweep's local fronts).
    """

    states: Array
    aux: Any
    front: Array
    iteration: Array
    residual: Array
    nonfinite: Array
    passed: Array


def _identity(x: Array) -> Array:
    return x


class Layout(NamedTuple):
    """Where an iteration's rows sit in the block, and how slices combine.

    Attributes:
        rows: ``states -> (prev, cur)``: each step's predecessor and value.
        write: ``(states, new_cur) -> states``: the iterate with ``cur``
            replaced.
        probe_key: ``(key, iteration) -> key`` for the strategy's probes.
        offset: index in the block of the first row's step.
        num_steps: ``T``, the steps of the whole block.
        reduce_min, reduce_max: a minimum and a maximum over all slices of
            the block (the identity for one slice).
        scan: the linear step's affine scan (``None``: the strategy's own).
        sweep: whether ``solver.sweep`` applies (rows of the whole block).
    """

    rows: Callable[[Array], tuple[Array, Array]]
    write: Callable[[Array, Array], Array]
    probe_key: Callable[[Array, Array], Array]
    offset: Array | int
    num_steps: int
    reduce_min: Callable[[Array], Array] = _identity
    reduce_max: Callable[[Array], Array] = _identity
    scan: Callable[[Array, Array], Array] | None = None
    sweep: bool = False


def whole_block(num_steps: int) -> Layout:
    """The layout of :func:`~numpyro_deer.core.deer_solve`: the iterate holds
    ``states[0] = s_0`` and ``states[t] = s_t`` for the whole block."""
    return Layout(
        rows=lambda states: (states[:-1], states[1:]),
        write=lambda states, new_cur: states.at[1:].set(new_cur),
        probe_key=jax.random.fold_in,
        offset=0,
        num_steps=num_steps,
        sweep=True,
    )


def newton_iteration(
    step_fn: StepFn,
    solver: DEERSolver,
    tape: Any,
    key: Array,
    carry: IterationCarry,
    layout: Layout,
    sequential: SequentialStep | None = None,
) -> IterationCarry:
    """One Newton iteration on the rows that ``layout`` describes.

    ``tape`` is the rows' tape; ``sequential`` is the step of the sweep's
    sequential segments (default ``step_fn`` itself).
    """
    atol, rtol = solver.tolerances(carry.states.dtype)
    if solver.sweep and layout.sweep:
        carry = _swept(step_fn, solver, tape, carry, layout.num_steps, sequential)

    prev, cur = layout.rows(carry.states)
    local_steps = cur.shape[0]
    strategy = solver.jacobian_for(prev.shape[-1])
    lin = strategy.linearize(
        step_fn, prev, tape, layout.probe_key(key, carry.iteration)
    )
    index = layout.offset + jnp.arange(local_steps)  # step t - 1 of each row
    passed, error = step_passes(cur, lin.values, atol, rtol)
    passed = passed | (index < carry.front)
    num_passed = leading_passed(passed)
    # the front is in the first slice that does not pass entirely
    front = layout.reduce_min(
        jnp.where(
            num_passed < local_steps, layout.offset + num_passed, layout.num_steps
        )
    )
    frozen = (index >= carry.front) & (index < front)  # newly certified
    residual = jnp.maximum(
        carry.residual,
        layout.reduce_max(jnp.max(jnp.where(frozen, jnp.max(error, axis=-1), 0.0))),
    )
    aux = where_rows(frozen, lin.aux, carry.aux)
    new_cur = strategy.newton_step(
        lin, prev, cur, index < front, index <= front, layout.scan
    )
    bad = ~jnp.all(jnp.isfinite(new_cur))
    return IterationCarry(
        states=layout.write(carry.states, new_cur),
        aux=aux,
        front=front,
        iteration=carry.iteration + 1,
        residual=residual,
        nonfinite=carry.nonfinite | (layout.reduce_max(bad.astype(jnp.int32)) > 0),
        # the test by step, for the next sweep's local fronts
        passed=passed if solver.sweep and layout.sweep else carry.passed,
    )


def _swept(
    step_fn: StepFn,
    solver: DEERSolver,
    tape: Any,
    carry: IterationCarry,
    num_steps: int,
    sequential: SequentialStep | None,
) -> IterationCarry:
    """The iterate with the sweep's sequential segments written in."""
    sequential = plain_sequential_step(step_fn) if sequential is None else sequential
    segments = max(1, min(num_steps // solver.sweep, num_steps))
    starts = sweep_starts(carry.front, carry.iteration, carry.passed, segments)
    # held back by the step count, not a cond: one loop in the graph,
    # and under vmap no select that would run it for every chain
    passes = jnp.where(carry.iteration >= solver.sweep_after, solver.sweep, 0)
    states = sweep_segments(
        sequential, carry.states, tape, starts, num_steps, solver.sweep, passes
    )
    return carry._replace(states=states)
