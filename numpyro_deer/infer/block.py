"""Blocks of draws: solved by DEER, buffered in the state, handed out one by one.

A *block* is ``B`` consecutive transitions (MALA, HMC, ...) after warmup, with
the step size and mass matrix fixed. It is computed at once by
:func:`refill_block` and kept in the kernel state as a :class:`BlockBuffer`;
:func:`emit_draw` turns buffer entry ``k`` into the kernel state after that
draw. ``numpyro.infer.MCMC`` calls the
kernel once per draw and so emits entries one at a time; the block driver
(:class:`numpyro_deer.MCMC`) emits a whole block per loop iteration from the same
buffer, so both hand out the same chain.

The block is solved in whitened coordinates ``w = L^{-1} x`` (``M = L L^T`` the
inverse mass matrix adapted in warmup), where a transition with
preconditioner ``M`` becomes the same transition with the identity (Roberts
and Stramer, 2002, for MALA). A block whose DEER
solve does not pass is finished sequentially: the states up to the solve's front
are kept (each certified against its predecessor) and the rest of the block is
computed one step after the other with the same tape, so its draws are the chain
either way, and ``deer_converged`` says which happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ..core.batched import batched_deer_solve
from ..core.hessian import curvature_basis
from ..core.metric import mass_matrix_sqrt, mul_sqrt, solve_sqrt, whiten
from ..core.newton import RESULTS, DEERSolver, NewtonInfo, deer_solve, no_solve_info
from ..core.transition import (
    Transition,
    finish_chain,
    make_sequential_step,
    make_step_fn,
    sequential_chain,
)
from .hessian_mass import MAX_HESSIAN_DIM
from .mesh import TimeMesh


class BlockBuffer(NamedTuple):
    """A solved block of draws, kept in the kernel state.

    Attributes:
        z: the draws, flat unconstrained coordinates, shape ``(B, D)``.
        potential_energy, accept_prob, diverging: per draw, shape ``(B,)``.
        accept_sum: running sum of ``accept_prob`` within the block.
        index: how many entries have been handed out.
        key_bits: raw bits of the state's key right after the refill; a state
            whose key differs (``MCMC.run`` replaced it) refills first.
        start_i, start_mean_accept_prob: the state's ``i`` and
            ``mean_accept_prob`` before the block.
        info: the DEER solve of the block.
    """

    z: Array
    potential_energy: Array
    accept_prob: Array
    diverging: Array
    accept_sum: Array
    index: Array
    key_bits: Array
    start_i: Array
    start_mean_accept_prob: Array
    info: NewtonInfo


class DEERState(NamedTuple):
    """State of a block kernel (:class:`~numpyro_deer.DEERMALA`,
    :class:`~numpyro_deer.DEERHMC`), one per draw.

    Attributes:
        i: iteration, counting warmup.
        z: latent values (unconstrained), a dict keyed by site name.
        potential_energy: potential energy at ``z``.
        accept_prob: acceptance probability of the step that produced ``z``.
        mean_accept_prob: running mean of ``accept_prob`` over the current
            phase (warmup or sampling).
        diverging: the step's proposal had a non-finite potential (rejected)
            or an energy error above 1000, as NumPyro flags divergences.
        newton_iterations: Newton iterations of the block the draw came from
            (0 in warmup).
        deer_converged: whether that block's DEER solve passed; ``False`` means
            the block was finished sequentially from the solve's front (draws
            still the chain) or, with ``on_failure="warn"``, kept as the
            solve left it. ``block.info.result`` says why it stopped.
        adapt_state: NumPyro's ``HMCAdaptState`` (step size, mass matrix).
        rng_key: random key.
        block: the buffer of the current block (internal).
        curvature_points: ``(K, D)`` flat draws where the mean Hessian of the
            next block's solve basis is taken (``solve_basis="hessian"``):
            spread over the later warmup, then over the previous block.
    """

    i: Array
    z: Any
    potential_energy: Array
    accept_prob: Array
    mean_accept_prob: Array
    diverging: Array
    newton_iterations: Array
    deer_converged: Array
    adapt_state: Any
    rng_key: Array
    block: BlockBuffer
    curvature_points: Array


NUM_CURVATURE_POINTS = 16
"""Draws the solve basis averages the Hessian over (``K``)."""


def record_warmup_draw(points: Array, i: Array, num_warmup: int, x: Array) -> Array:
    """Keep warmup draw ``i`` (1-based) if it is one of the curvature points.

    Every ``s``-th warmup draw, ``s = max(1, num_warmup // (2 K))``, counted
    back from the last, goes into a ring of ``K`` slots. During warmup the
    ring holds the ``K`` latest such draws (the Hessian mass matrix uses them
    at each window end); at its end, every ``s``-th of the last ``K s``
    draws: spread over the later half of warmup, the last draw included. With
    fewer than ``K`` warmup draws the remaining slots keep the initial point.
    """
    num_points = points.shape[0]
    stride = max(1, num_warmup // (2 * num_points))
    back = num_warmup - i  # 0 for the last warmup draw
    take = (back >= 0) & (back % stride == 0)
    slot = (back // stride) % num_points
    return jnp.where(take, points.at[slot].set(x), points)


def block_points(z: Array, num_points: int) -> Array:
    """``num_points`` draws of a block, evenly spaced and ending at its last."""
    block_size = z.shape[0]
    index = (jnp.arange(1, num_points + 1) * block_size) // num_points - 1
    return z[jnp.maximum(index, 0)]


def key_bits(rng_key: Array) -> Array:
    """Raw ``uint32`` bits of a raw or typed PRNG key."""
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng_key)
    return rng_key


def empty_block(block_size: int, z_flat: Array, rng_key: Array) -> BlockBuffer:
    """A buffer with nothing left to hand out (``index == B``)."""
    zeros = jnp.zeros((block_size,), z_flat.dtype)
    info = no_solve_info(z_flat.dtype)
    return BlockBuffer(
        z=jnp.zeros((block_size,) + z_flat.shape, z_flat.dtype),
        potential_energy=zeros,
        accept_prob=zeros,
        diverging=jnp.zeros((block_size,), bool),
        accept_sum=zeros,
        index=jnp.full((), block_size, jnp.int32),
        key_bits=jnp.zeros_like(key_bits(rng_key)),
        start_i=jnp.zeros((), jnp.int32),
        start_mean_accept_prob=zeros[0],
        info=info,
    )


def needs_refill(state: DEERState) -> Array:
    """The buffer is used up, or the state's key is not the one it was made with."""
    block = state.block
    exhausted = block.index >= block.z.shape[0]
    return exhausted | jnp.any(key_bits(state.rng_key) != block.key_bits)


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
    """

    rng_key: Array
    key_probe: Array
    u0: Array
    tape: Any
    params: tuple


def block_problem(
    state: DEERState,
    potential_flat: Callable[[Array], Array],
    ravel: Callable[[Any], Array],
    solver: DEERSolver,
    method: str,
    transition: Transition,
) -> BlockProblem:
    """The next block's keys, tape and coordinates, from ``state``.

    The block is solved in the whitened coordinates ``w = L^{-1} x``; DEER
    rotates them to the mean Hessian's eigenbasis when ``solver.solve_basis``
    says so (``method="sequential"`` never does: a rotation leaves the chain
    the same, up to rounding, and costs a Hessian per block).
    """
    block_size = state.block.z.shape[0]
    rng_key, key_tape, key_probe = jax.random.split(state.rng_key, 3)
    adapt = state.adapt_state
    mass_sqrt = mass_matrix_sqrt(adapt.inverse_mass_matrix)
    w0 = solve_sqrt(mass_sqrt, ravel(state.z))
    tape = transition.make_tape(key_tape, block_size, w0.shape[0], w0.dtype)

    solve_basis = solver.solve_basis
    if method == "sequential":
        solve_basis = "whitened"
    elif solve_basis == "auto":
        solve_basis = "hessian" if w0.shape[0] <= MAX_HESSIAN_DIM else "whitened"
    if solve_basis == "hessian":
        potential_w = whiten(potential_flat, mass_sqrt)
        points = jax.vmap(lambda x: solve_sqrt(mass_sqrt, x))(state.curvature_points)
        basis = curvature_basis(potential_w, points)
        tape, u0 = transition.rotate_tape(tape, basis), basis.T @ w0
    else:
        basis, u0 = None, w0
    return BlockProblem(
        rng_key, key_probe, u0, tape, (mass_sqrt, basis, adapt.step_size)
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
    (:mod:`~numpyro_deer.infer.mesh`).
    """
    problem = block_problem(state, potential_flat, ravel, solver, method, transition)
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
            step_fn, u0, tape_u, problem.key_probe, solver, None, sequential
        )
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
) -> DEERState:
    """:func:`refill_block` by DEER for every chain (leading axis), the chains'
    solves side by side (:func:`~numpyro_deer.core.batched.batched_deer_solve`):
    once most chains have converged, the rest go on in a batch of ``capacity``
    chains (default an eighth), so the batch does not wait for the slowest.
    Each chain's block is the one :func:`refill_block` gives it."""

    def problem(state):
        return block_problem(state, potential_flat, ravel, solver, "deer", transition)

    problems = jax.vmap(problem)(states)
    u, step_info, info = batched_deer_solve(
        block_steps(potential_flat, transition, solver.gate),
        problems.params,
        problems.u0,
        problems.tape,
        problems.key_probe,
        solver,
        capacity,
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


def emit_draw(
    state: DEERState,
    k: Array,
    unravel: Callable[[Array], Any],
    num_warmup: int,
) -> DEERState:
    """The state after handing out buffer entry ``k`` (``index = k + 1``)."""
    block = state.block
    i = block.start_i + k + 1
    # running mean over the sampling phase, as NumPyro's kernels keep it
    done_before = (block.start_i - num_warmup).astype(block.accept_sum.dtype)
    mean_accept_prob = (
        block.start_mean_accept_prob * done_before + block.accept_sum[k]
    ) / (done_before + k + 1)
    return state._replace(
        i=i,
        z=unravel(block.z[k]),
        potential_energy=block.potential_energy[k],
        accept_prob=block.accept_prob[k],
        mean_accept_prob=mean_accept_prob,
        diverging=block.diverging[k],
        newton_iterations=block.info.iterations,
        deer_converged=block.info.converged,
        block=block._replace(index=jnp.asarray(k + 1, jnp.int32)),
    )
