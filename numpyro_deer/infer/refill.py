"""Refilling a chain's block: the DEER solve (or the sequential scan) of its
next ``B`` transitions, in the solve's coordinates.

The block is solved in whitened coordinates ``w = L^{-1} x`` (``M = L L^T`` the
inverse mass matrix adapted in warmup), where a transition with
preconditioner ``M`` becomes the same transition with the identity (Roberts
and Stramer, 2002, for MALA), optionally rotated to the eigenvectors of the
potential's mean Hessian (:func:`~numpyro_deer.core.hessian.curvature_basis`).
A block whose DEER solve does not pass is finished sequentially: the states up
to the solve's front are kept (each certified against its predecessor) and the
rest of the block is computed one step after the other with the same tape, so
its draws are the chain either way, and ``deer_converged`` says which happened.

:func:`refill_block` refills one chain; :func:`refill_blocks` refills a batch
of chains with their solves side by side and the unconverged chains set apart
(:func:`~numpyro_deer.core.batched.batched_deer_solve`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree

from ..core.batched import batched_deer_solve
from ..core.hessian import COLUMN_BATCH, curvature_basis
from ..core.metric import mul_sqrt, solve_sqrt, whiten
from ..core.newton import RESULTS, DEERSolver, NewtonInfo, deer_solve, no_solve_info
from ..core.transition import (
    Transition,
    finish_chain,
    make_sequential_step,
    make_step_fn,
    sequential_chain,
)
from .block import (
    BlockBuffer,
    DEERState,
    block_points,
    key_bits,
    needs_refill,
    pilot_points,
)
from .chains import map_groups
from .hessian_mass import adapt_mass_sqrt, auto_solve_basis
from .mesh import TimeMesh
from .trajectory import block_transition


def solve_potential(
    potential_flat: Callable[[Array], Array],
    mass_sqrt: Array,
    basis: Array | None,
) -> Callable[[Array], Array]:
    """The potential in the solve's coordinates ``u``: ``x = L w``, ``w = Q u``
    (``Q`` the solve basis; ``None``: ``w = u``)."""
    potential_w = whiten(potential_flat, mass_sqrt)
    if basis is None:
        return potential_w
    return lambda u: potential_w(basis @ u)


class BlockProblem(NamedTuple):
    """A chain's next block before its solve (:func:`block_problem`).

    Attributes:
        rng_key: the state's key after the refill.
        key_probe: the key of the solve's stochastic Jacobian.
        u0: the start ``s_0`` in the solve's coordinates ``u``.
        tape: the block's tape in those coordinates.
        params: ``(mass_sqrt, basis, step_size)``, what the step depends on
            (``basis`` ``None`` in the whitened coordinates).
        init: the solve's initial guess ``(B, D)`` in those coordinates
            (``None``: ``u0`` repeated).
        first_iteration: Newton iterations already taken (the pilot's).
    """

    rng_key: Array
    key_probe: Array
    u0: Array
    tape: Any
    params: tuple
    init: Array | None
    first_iteration: Array


def block_problem(
    state: DEERState,
    potential_flat: Callable[[Array], Array],
    ravel: Callable[[Any], Array],
    solver: DEERSolver,
    method: str,
    transition: Transition,
    pilot: bool = True,
    column_batch: int | None = None,
) -> BlockProblem:
    """The next block's keys, tape and coordinates, from ``state``.

    The block is solved in the whitened coordinates ``w = L^{-1} x``; DEER
    rotates them to the mean Hessian's eigenbasis when ``solver.solve_basis``
    says so (``method="sequential"`` never does: a rotation leaves the chain
    the same, up to rounding, and costs a Hessian per block). With ``pilot``
    a block whose curvature points coincide takes them from a pilot solve
    (:func:`pilot_points`). ``column_batch``: the Hessian's columns at a time
    (:func:`~numpyro_deer.core.hessian.mean_hessian`).
    """
    block_size = state.block.z.shape[0]
    rng_key, key_tape, key_probe = jax.random.split(state.rng_key, 3)
    adapt = state.adapt_state
    mass_sqrt = adapt_mass_sqrt(adapt)
    w0 = solve_sqrt(mass_sqrt, ravel(state.z))
    tape = transition.make_tape(key_tape, block_size, w0.shape[0], w0.dtype)

    solve_basis = solver.solve_basis
    if method == "sequential":
        solve_basis = "whitened"
    elif solve_basis == "auto":
        solve_basis = auto_solve_basis(solver, w0.shape[0])
    init, first_iteration = None, jnp.zeros((), jnp.int32)
    if solve_basis == "hessian":
        potential_w = whiten(potential_flat, mass_sqrt)
        points = jax.vmap(lambda x: solve_sqrt(mass_sqrt, x))(state.curvature_points)
        if pilot:
            step_w = make_step_fn(
                transition, potential_w, adapt.step_size, None, solver.gate
            )
            points, iterate, use, first_iteration = pilot_points(
                potential_w, points, w0, tape, key_probe, step_w, solver
            )
        basis = curvature_basis(potential_w, points, column_batch)
        tape, u0 = transition.rotate_tape(tape, basis), basis.T @ w0
        if pilot:
            init = jnp.where(use, iterate @ basis, u0)
    else:
        basis, u0 = None, w0
    return BlockProblem(
        rng_key,
        key_probe,
        u0,
        tape,
        (mass_sqrt, basis, adapt.step_size),
        init,
        first_iteration,
    )


def block_steps(
    potential_flat: Callable[[Array], Array], transition: Transition, gate: Any
) -> Callable[[tuple], tuple[Callable, Any]]:
    """``params -> (step_fn, sequential)``: a block's taped step in the solve's
    coordinates and the sweep's form of it, from :attr:`BlockProblem.params`."""

    def steps(params):
        mass_sqrt, basis, step_size = params
        potential = solve_potential(potential_flat, mass_sqrt, basis)
        return (
            make_step_fn(transition, potential, step_size, None, gate),
            make_sequential_step(transition, potential, step_size, None, gate),
        )

    return steps


def refill_block(
    state: DEERState,
    potential_flat: Callable[[Array], Array],
    ravel: Callable[[Any], Array],
    solver: DEERSolver,
    method: str,
    on_failure: str,
    transition: Transition,
    mesh: TimeMesh | None = None,
    pilot: bool = True,
) -> DEERState:
    """Solve the next block from ``state.z`` with a fresh tape; ``index = 0``.

    ``method="sequential"`` computes the block with the sequential scan of the
    same tape (the reference, and a user-selectable method). A DEER solve that
    does not converge is finished sequentially from its front (the states
    before it are certified, the rest recomputed with the same tape), except
    with ``on_failure="warn"``, which keeps the solve's last iterate unless it
    turned non-finite. The block is solved in the coordinates of
    :func:`block_problem`. MALA and HMC with an identity metric commute with a
    rotation (of the state, gradient and tape noise alike), so both methods
    compute the same chain, up to the rounding of the rotation. With a
    ``mesh`` the DEER solve is split over its devices
    (:mod:`~numpyro_deer.infer.mesh`). ``pilot``: whether the program
    includes the pilot of a block whose curvature points coincide
    (:func:`~.block.pilot_points`; never with a mesh).
    """
    problem = block_problem(
        state, potential_flat, ravel, solver, method, transition,
        pilot and mesh is None,
    )  # fmt: skip
    steps = block_steps(potential_flat, transition, solver.gate)
    u0, tape_u = problem.u0, problem.tape
    if method == "sequential":
        mass_sqrt, basis, step_size = problem.params
        potential_u = solve_potential(potential_flat, mass_sqrt, basis)
        u, step_info = sequential_chain(transition, potential_u, u0, tape_u, step_size)
        info = no_solve_info(u0.dtype)
    elif mesh is None:
        step_fn, sequential = steps(problem.params)
        u, step_info, info = deer_solve(
            step_fn, u0, tape_u, problem.key_probe, solver, problem.init,
            sequential, problem.first_iteration,
        )  # fmt: skip
    else:
        # the step is built from the chain's values inside the solve's
        # shard_map (see sharded_deer_solve's step_params)
        u, step_info, info = mesh.solve(
            lambda params: steps(params)[0],
            u0,
            tape_u,
            problem.key_probe,
            solver,
            problem.params,
        )
    return solved_block(
        state,
        problem,
        u,
        step_info,
        info,
        potential_flat,
        method,
        on_failure,
        transition,
    )


def refill_blocks(
    states: DEERState,
    potential_flat: Callable[[Array], Array],
    ravel: Callable[[Any], Array],
    solver: DEERSolver,
    on_failure: str,
    transition: Transition,
    capacity: int | None = None,
    pilot: bool = True,
) -> DEERState:
    """:func:`refill_block` by DEER for every chain (leading axis), the chains'
    solves side by side (:func:`~numpyro_deer.core.batched.batched_deer_solve`):
    once most chains have converged, the rest go on in a batch of ``capacity``
    chains (default an eighth), so the batch does not wait for the slowest.
    Each chain's block is the one :func:`refill_block` gives it."""

    def problem(state):  # under vmap: the Hessian's columns in batches
        return block_problem(
            state, potential_flat, ravel, solver, "deer", transition, pilot,
            COLUMN_BATCH,
        )  # fmt: skip

    problems = jax.vmap(problem)(states)
    u, step_info, info = batched_deer_solve(
        block_steps(potential_flat, transition, solver.gate),
        problems.params,
        problems.u0,
        problems.tape,
        problems.key_probe,
        solver,
        capacity,
        init_states=problems.init,
        first_iteration=problems.first_iteration,
    )
    # the pilots ran side by side, as many iterations as the longest
    info = info._replace(
        batch_iterations=info.batch_iterations + jnp.max(problems.first_iteration)
    )

    def solved(*args):
        return solved_block(*args[:5], potential_flat, "deer", on_failure, transition)

    return jax.vmap(solved)(states, problems, u, step_info, info)


def solved_block(
    state: DEERState,
    problem: BlockProblem,
    u: Array,
    step_info: Any,
    info: NewtonInfo,
    potential_flat: Callable[[Array], Array],
    method: str,
    on_failure: str,
    transition: Transition,
) -> DEERState:
    """The state holding the block ``u`` (solve coordinates) with ``index = 0``,
    a DEER block that did not converge first finished sequentially from its
    front (see :func:`refill_block`)."""
    mass_sqrt, basis, step_size = problem.params
    if method != "sequential":
        finish = ~info.converged
        if on_failure == "warn":
            finish = info.result == RESULTS.nonfinite
        potential_u = solve_potential(potential_flat, mass_sqrt, basis)
        u, step_info = jax.lax.cond(
            ~finish,
            lambda _: (u, step_info),
            lambda _: finish_chain(
                transition,
                potential_u,
                problem.u0,
                problem.tape,
                step_size,
                u,
                step_info,
                info.front,
            ),
            None,
        )
    w = u if basis is None else u @ basis.T
    accept_prob = step_info.accept_prob
    block = BlockBuffer(
        z=jax.vmap(lambda w: mul_sqrt(mass_sqrt, w))(w),
        potential_energy=step_info.potential_energy,
        accept_prob=accept_prob,
        diverging=step_info.diverging,
        accept_sum=jnp.cumsum(accept_prob),
        index=jnp.zeros((), jnp.int32),
        key_bits=key_bits(problem.rng_key),
        start_i=jnp.asarray(state.i, jnp.int32),
        start_mean_accept_prob=state.mean_accept_prob,
        info=info,
    )
    return state._replace(
        rng_key=problem.rng_key,
        block=block,
        curvature_points=block_points(block.z, state.curvature_points.shape[0]),
    )


def refill_chains(
    state: DEERState,
    potential_flat: Callable[[Array], Array],
    settings: Any,
    method: str,
    batched: bool,
    stragglers: bool,
    map_chains: Callable,
    pilot: bool = True,
) -> tuple[Array, DEERState]:
    """``(fresh, state)``: the chain's (or every chain's, ``batched``) next
    block by ``method`` where its buffer is used up or its key was replaced,
    and which chains were refilled.

    ``settings`` is the kernel's :class:`~.settings.KernelSettings`.
    Batched DEER blocks with ``stragglers`` (no mesh) are solved side by side
    by :func:`refill_blocks`, in groups of ``settings.chain_group`` chains if
    set; otherwise each chain by :func:`refill_block` through ``map_chains``.
    ``pilot``: whether the program includes the pilot of a block whose
    curvature points coincide (a run without warmup; see
    :func:`~.block.pilot_points`).
    """
    s = settings
    ravel = lambda z: ravel_pytree(z)[0]  # noqa: E731
    transition = block_transition(s, state, batched)

    def refill(one):
        return refill_block(
            one, potential_flat, ravel, s.solver, method, s.on_failure,
            transition, s.mesh, pilot,
        )  # fmt: skip

    if not batched:
        fresh = needs_refill(state)
        return fresh, jax.lax.cond(fresh, refill, lambda c: c, state)

    def refill_all(chains):
        if not (method == "deer" and s.mesh is None and stragglers):
            return map_chains(refill, chains)
        solve = partial(
            refill_blocks,
            potential_flat=potential_flat,
            ravel=ravel,
            solver=s.solver,
            on_failure=s.on_failure,
            transition=transition,
            pilot=pilot,
        )
        if s.chain_group is None:
            return solve(chains)
        return map_groups(solve, chains, s.chain_group)

    fresh = jax.vmap(needs_refill)(state)
    return fresh, jax.lax.cond(jnp.any(fresh), refill_all, lambda c: c, state)
