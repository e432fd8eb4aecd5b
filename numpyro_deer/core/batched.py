r"""Many chains' blocks solved side by side, without waiting for the slowest.

Under :func:`jax.vmap`, the ``while_loop`` of :func:`~numpyro_deer.core.deer_solve`
runs until the last chain's solve has stopped: every chain pays the Newton
iterations of the hardest one. :func:`batched_deer_solve` solves ``C`` chains'
blocks (each its own step, tape and start) in two phases:

1. **The whole batch.** Every chain takes Newton iterations side by side; a
   chain whose solve has stopped keeps its carry. This phase ends once at most
   ``capacity`` chains are still solving, or once the phase has run
   ``patience`` times the iterations after which half of the chains had
   stopped (the iterations of a typical chain).
2. **The stragglers.** The chains still solving are gathered, ``capacity`` at
   a time, into a batch of that static size (``max(1, C // 8)`` by default),
   which goes on from their current iterates (the same tapes, probe keys and
   iteration counts) until each has stopped; their carries are then
   scattered back. With more stragglers than ``capacity``, groups follow one
   another.

The whole batch thus pays at most about ``patience`` times a typical chain's
iterations (the median chain's, which is about what one chain alone needs),
or the iterations by which all but ``capacity`` chains have stopped, if that
comes sooner; the hardest chains finish on a batch of ``capacity`` chains.
Why this rule: where many chains times a long block make an iteration
throughput-bound (a GPU full of work), an iteration of the small batch costs
about ``capacity / C`` of one over the whole batch, so a long tail of a few
chains costs little there, while waiting on the whole batch for it costs the
tail's length in full-batch iterations. The two conditions bound the latter
from both sides: a thin tail (few slow chains) ends the phase as soon as it
fits the small batch, a fat one (many slow chains) after ``patience`` times
the median.

**Exactness.** A chain's own iterations are those of its solve alone: each
chain takes :func:`~numpyro_deer.core.newton.solve_trip`, the trip of
:func:`~numpyro_deer.core.newton.solve_loop` (solves of at most ``max_iter``
iterations restarting at the front; stop on convergence, a solve without
progress, a non-finite iterate or ``max_solves`` solves), so its iterates,
front, certificate and result code are those of
:func:`~numpyro_deer.core.deer_solve` on its tape, in whichever phase it
finishes.

Costs: the gather and scatter of the stragglers' carries and tapes (a
``capacity / C`` share of the batch's) once per group, and a second loop in
the program; a batch whose chains all stop in the first phase pays neither
copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from .iteration import newton_iteration, whole_block
from .newton import (
    DEERSolver,
    SolveState,
    _initial_carry,
    solve_info,
    solve_trip,
    start_solves,
)
from .results import NewtonInfo
from .transition import SequentialStep, StepFn

PATIENCE = 1.5
"""The whole batch stops after this many times the iterations by which half
of the chains had stopped (if not sooner: at most ``capacity`` left)."""


def straggler_capacity(num_chains: int) -> int:
    """The default straggler batch: an eighth of the chains, at least one."""
    return max(1, num_chains // 8)


MakeSteps = Callable[[Any], tuple[StepFn, SequentialStep | None]]


def _trip(
    make_steps: MakeSteps,
    solver: DEERSolver,
    params: Any,
    tape: Any,
    key: Array,
    chain: SolveState,
) -> SolveState:
    """One Newton iteration of a chain and its solves' bookkeeping
    (:func:`~numpyro_deer.core.newton.solve_trip`); a chain that is not
    active keeps its state."""
    step_fn, sequential = make_steps(params)
    num_steps = chain.carry.passed.shape[0]
    layout = whole_block(num_steps)

    def iteration(carry):
        return newton_iteration(step_fn, solver, tape, key, carry, layout, sequential)

    return solve_trip(iteration, num_steps, solver, chain, keep_inactive=True)


def batched_deer_solve(
    make_steps: MakeSteps,
    params: Any,
    x0: Array,
    tape: Any,
    key: Array,
    solver: DEERSolver = DEERSolver(),
    capacity: int | None = None,
    patience: float = PATIENCE,
    init_states: Array | None = None,
    first_iteration: Array | None = None,
) -> tuple[Array, Any, NewtonInfo]:
    """:func:`~numpyro_deer.core.deer_solve` of ``C`` chains, stragglers apart.

    Args:
        make_steps: ``params -> (step_fn, sequential)``: one chain's taped
            step and the sweep's sequential form of it (``None``: the step
            itself), built from that chain's ``params``.
        params: the chains' step parameters, leading axis ``C``.
        x0: the chains' ``s_0``, shape ``(C, D)``.
        tape: the chains' tapes, leading axes ``(C, T)``.
        key: the chains' probe keys, shape ``(C,)`` (or ``(C, 2)`` raw).
        solver: the solver settings, shared by the chains.
        capacity: chains in the straggler batch; default ``max(1, C // 8)``.
        patience: see :data:`PATIENCE`.
        init_states, first_iteration: the chains' initial guesses
            ``(C, T, D)`` and iterations already taken ``(C,)``, as
            :func:`~numpyro_deer.core.deer_solve` takes them; default ``x0``
            repeated and 0.

    Returns:
        ``(states, aux, info)`` as :func:`~numpyro_deer.core.deer_solve`
        returns them, with a leading chain axis. Every chain's
        ``info.batch_iterations`` and ``info.straggler_iterations`` are the
        iterations of the whole batch and of the straggler batches (all
        groups).
    """
    num_chains = x0.shape[0]
    if capacity is None:
        capacity = straggler_capacity(num_chains)
    if not 1 <= capacity <= num_chains:
        raise ValueError(
            f"batched_deer_solve(capacity={capacity!r}): use an integer in "
            f"[1, {num_chains}] (the number of chains)."
        )

    if first_iteration is None:
        first_iteration = jnp.zeros((num_chains,), jnp.int32)

    def start(p, x, t, init, first):
        carry = _initial_carry(make_steps(p)[0], x, t, init, first)
        return start_solves(carry, num_steps, solver)

    def trips(p, t, k, c):
        return jax.vmap(lambda *a: _trip(make_steps, solver, *a))(p, t, k, c)

    num_steps = jax.tree.leaves(tape)[0].shape[1]
    chains = jax.vmap(start)(params, x0, tape, init_states, first_iteration)
    zero = jnp.zeros((), jnp.int32)

    # phase 1: the whole batch, until few are left or `patience` times the
    # iterations after which half of the chains had stopped (`half_at`)
    def batch_goes_on(phase):
        chains, count, half_at = phase
        left = jnp.sum(chains.active, dtype=jnp.int32)
        patient = (half_at == 0) | (count < jnp.ceil(patience * half_at))
        return (left > capacity) & patient

    def batch_trip(phase):
        chains, count, half_at = phase
        chains = trips(params, tape, key, chains)
        stopped = num_chains - jnp.sum(chains.active, dtype=jnp.int32)
        half = (half_at == 0) & (2 * stopped >= num_chains)
        half_at = jnp.where(half, count + 1, half_at)
        return chains, count + 1, half_at

    chains, batch_count, _ = jax.lax.while_loop(
        batch_goes_on, batch_trip, (chains, zero, zero)
    )

    # phase 2: groups of at most `capacity` stragglers, gathered and scattered
    def group(outer):
        chains, count = outer
        index = jnp.nonzero(chains.active, size=capacity, fill_value=num_chains)[0]
        take = jnp.minimum(index, num_chains - 1)  # unused slots: inactive copies

        def gather(tree):
            return jax.tree.map(lambda a: a[take], tree)

        group = gather(chains)
        group = group._replace(active=group.active & (index < num_chains))
        group_params, group_tape, group_key = gather((params, tape, key))
        group, group_count = jax.lax.while_loop(
            lambda g: jnp.any(g[0].active),
            lambda g: (trips(group_params, group_tape, group_key, g[0]), g[1] + 1),
            (group, zero),
        )
        chains = jax.tree.map(
            lambda a, b: a.at[index].set(b, mode="drop"), chains, group
        )
        return chains, count + group_count

    chains, straggler_count = jax.lax.while_loop(
        lambda outer: jnp.any(outer[0].active), group, (chains, zero)
    )

    carry = chains.carry
    info = jax.vmap(lambda c, s, p: solve_info(c, s, p, num_steps, solver))(
        carry, chains.solves, chains.progressed
    )
    info = info._replace(
        batch_iterations=jnp.full((num_chains,), batch_count),
        straggler_iterations=jnp.full((num_chains,), straggler_count),
    )
    return carry.states[:, 1:], carry.aux, info
