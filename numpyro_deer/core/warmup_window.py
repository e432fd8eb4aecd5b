r"""One window of a parallel warmup: all chains' taped transitions at a fixed kernel.

:func:`solve_window` computes the window by DEER (:func:`deer_solve`
``vmap``-ped over the chains, a tape per chain from :func:`window_tapes`) and
finishes every chain whose solve did not pass sequentially from its front
(:func:`~numpyro_deer.core.transition.finish_chain`), or by the sequential
scan; either way the states are the taped chains of that kernel.
:func:`window_solver` caps a window's Newton iterations at the break-even
count (:func:`~numpyro_deer.core.warmup_cost.break_even_iterations`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array

from .newton import DEERSolver, deer_solve
from .transition import (
    PotentialFn,
    StepInfo,
    Transition,
    finish_chain,
    make_sequential_step,
    make_step_fn,
    sequential_chain,
)
from .warmup_cost import break_even_iterations


def window_tapes(
    transition: Transition, key: Array, num_chains: int, num_steps: int, dim: int, dtype
) -> object:
    """One tape of ``num_steps`` transitions per chain (leading axis ``C``)."""
    keys = jax.random.split(key, num_chains)
    return jax.vmap(lambda k: transition.make_tape(k, num_steps, dim, dtype))(keys)


def solve_window(
    transition: Transition,
    potential_fn: PotentialFn,
    w0: Array,
    tapes: object,
    key: Array,
    step_size: Array,
    solver: DEERSolver,
    sequential: bool = False,
) -> tuple[Array, StepInfo, Array, Array, Array]:
    """The chains of one window from ``w0`` (``(C, D)``), identity metric.

    DEER (``vmap`` of :func:`deer_solve` over the chains), and every chain
    whose solve did not pass finished sequentially from its front; or, with
    ``sequential``, the sequential scan. Either way the states are the taped
    chains of the same kernel.

    Returns:
        ``(states (C, W, D), step infos, iterations (C,), fronts (C,),
        residuals (C,))``; for the sequential scan iterations, fronts and
        residuals are 0.
    """
    num_chains = w0.shape[0]
    num_steps = jax.tree.leaves(tapes)[0].shape[1]
    if sequential:
        chain = partial(sequential_chain, transition, potential_fn)
        states, infos = jax.vmap(lambda x, t: chain(x, t, step_size))(w0, tapes)
        zero = jnp.zeros((num_chains,), jnp.int32)
        return states, infos, zero, zero, jnp.zeros((num_chains,), w0.dtype)
    gate = solver.gate
    step_fn = make_step_fn(transition, potential_fn, step_size, None, gate)
    fast = make_sequential_step(transition, potential_fn, step_size, None, gate)
    keys = jax.random.split(key, num_chains)
    states, infos, info = jax.vmap(
        lambda x, t, k: deer_solve(step_fn, x, t, k, solver, None, fast)
    )(w0, tapes, keys)

    def finish(args):
        states, infos = args
        return jax.vmap(
            lambda x, t, s, i, f: finish_chain(
                transition, potential_fn, x, t, step_size, s, i, f
            )
        )(w0, tapes, states, infos, info.front)

    # a cond outside vmap: the fallback runs only when some chain needs it
    states, infos = jax.lax.cond(
        jnp.all(info.front >= num_steps), lambda a: a, finish, (states, infos)
    )
    return states, infos, info.iterations, info.front, info.residual


def window_solver(
    solver: DEERSolver, transition: Transition, num_steps: int, cap: bool
) -> DEERSolver:
    """``solver`` for a window of ``num_steps``; with ``cap``, one solve of at
    most the break-even iterations (:func:`~.warmup_cost.break_even_iterations`)
    before the sequential fallback."""
    if not cap:
        return solver
    budget = min(
        solver.max_iter * solver.max_solves,
        break_even_iterations(transition, num_steps),
    )
    return DEERSolver(
        jacobian=solver.jacobian,
        gate=solver.gate,
        solve_basis=solver.solve_basis,
        atol=solver.atol,
        rtol=solver.rtol,
        max_iter=budget,
        max_solves=1,
        sweep=solver.sweep,
        sweep_after=solver.sweep_after,
    )
