"""Blocks of draws: buffered in the state, handed out one by one.

A *block* is ``B`` consecutive transitions (MALA, HMC, ...) after warmup, with
the step size and mass matrix fixed. It is computed at once by
:func:`~.refill.refill_block` (solved by DEER, or the sequential scan) and
kept in the kernel state as a :class:`BlockBuffer`; :func:`emit_draw` turns
buffer entry ``k`` into the kernel state after that draw.
``numpyro.infer.MCMC`` calls the kernel once per draw and so emits entries one
at a time; the block driver (:class:`numpyro_deer.MCMC`) emits a whole block
per loop iteration from the same buffer, so both hand out the same chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ..core.newton import DEERSolver, NewtonInfo, newton_pilot, no_solve_info


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
            spread over the later warmup, then over the previous block
            (without warmup draws, the initial point repeated: see
            :func:`pilot_points`).
        num_steps: gradients per transition of the sampling blocks: HMC's
            leapfrog steps (``DEERHMC(num_steps="auto")``: the count chosen at
            the end of warmup), 1 for MALA.
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
    num_steps: Array


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


PILOT_ITERATIONS = 4
"""Newton iterations in the whitened coordinates that a block whose curvature
points all coincide (no warmup draws) takes before its solve basis is formed
from its iterate (:func:`pilot_points`)."""


def pilot_points(
    potential_w: Callable[[Array], Array],
    points: Array,
    w0: Array,
    tape: Any,
    key: Array,
    step_w: Callable,
    solver: DEERSolver,
) -> tuple[Array, Array, Array, Array]:
    """``(points, iterate, use, iterations)``: a block's curvature points,
    from a pilot solve where they all coincide.

    Without warmup draws the ``K`` points are all the initial point, whose
    Hessian can turn the solve basis the wrong way where the chain starts far
    from the bulk (the curvature there is not the bulk's). Such a block first
    takes :data:`PILOT_ITERATIONS` Newton iterations in the whitened
    coordinates (:func:`~numpyro_deer.core.newton.newton_pilot`), whose
    iterate, a rough path of the block, is the solve's initial guess and gives
    ``K`` evenly spaced points (:func:`block_points`), each kept where its
    potential is at most the start's and replaced by the start elsewhere (an
    iterate far off the posterior, whose curvature would dominate the mean, is
    not trusted). ``use`` says whether the pilot's iterate is used (the
    points coincide and it is finite), ``iterations`` how many iterations were
    taken. Other blocks take none and keep ``points``.

    ``potential_w`` is the potential, and ``points``, ``w0`` (the block's
    start) and ``tape`` are, in the whitened coordinates; ``step_w`` is the
    step there.
    """
    coincide = jnp.all(points == points[0])
    num = jnp.where(coincide, PILOT_ITERATIONS, 0)
    carry = newton_pilot(step_w, w0, tape, key, solver, num)
    iterate = carry.states[1:]
    use = coincide & ~carry.nonfinite
    guess = block_points(iterate, points.shape[0])
    # beyond the front the iterate is a guess: a state less probable than the
    # start (off the posterior's ridge) is not trusted, the start taken instead
    likely = jax.vmap(potential_w)(guess) <= potential_w(w0)
    guess = jnp.where(likely[:, None], guess, w0)
    points = jnp.where(use, guess, points)
    return points, iterate, use, carry.iteration
