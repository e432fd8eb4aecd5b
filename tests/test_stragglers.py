"""Chains solved side by side without waiting for the slowest (core.batched).

Each chain of :func:`batched_deer_solve` must be the sequential chain of its
own tape (float64, the conftest's), with the iterations, front, certificate
and result code that :func:`deer_solve` gives it alone; the batch's own counts
follow the rule of :mod:`numpyro_deer.core.batched`, which the tests replay
from the chains' iteration counts.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from numpyro_deer.core import (
    MALA,
    DEERSolver,
    deer_solve,
    make_sequential_step,
    make_step_fn,
    sequential_chain,
)
from numpyro_deer.core.batched import PATIENCE, batched_deer_solve

C, D, T = 8, 3, 48
EASY, HARD = 1.0, 0.2  # step sizes: small steps accept more and need more iterations
MATCH = dict(rtol=1e-8, atol=1e-12)


def _potential(x):
    return 0.25 * jnp.sum(x**4) + 0.5 * jnp.sum(x**2) + 0.5 * (x[0] * x[1]) ** 2


def _steps(step_size):
    return (
        make_step_fn(MALA(), _potential, step_size),
        make_sequential_step(MALA(), _potential, step_size),
    )


def _problem(hard):
    step_size = jnp.full((C,), EASY).at[jnp.asarray(hard)].set(HARD)
    x0 = jnp.asarray(np.random.default_rng(0).standard_normal((C, D)))
    keys = jax.random.split(jax.random.PRNGKey(1), C)
    tapes = jax.vmap(lambda k: MALA().make_tape(k, T, D, x0.dtype))(keys)
    probes = jax.random.split(jax.random.PRNGKey(2), C)
    return step_size, x0, tapes, probes


@functools.cache
def _alone_jitted(solver):
    """Each chain's own solve and its sequential chain."""

    def one(eps, x, tape, key):
        step_fn, sequential = _steps(eps)
        states, _, info = deer_solve(step_fn, x, tape, key, solver, None, sequential)
        expected, _ = sequential_chain(MALA(), _potential, x, tape, eps)
        return states, info, expected

    return jax.jit(jax.vmap(one))


def _alone(solver, *problem):
    return _alone_jitted(solver)(*problem)


def _replay(iterations, capacity, patience=PATIENCE):
    """The batch's counts by the module's rule, from the chains' iterations:
    the whole batch until at most ``capacity`` are left or ``patience`` times
    the iterations after which half had stopped; then groups of ``capacity``
    (in chain order), each running until its slowest stops."""
    count, half_at = 0, 0
    while np.sum(iterations > count) > capacity and (
        half_at == 0 or count < math.ceil(patience * half_at)
    ):
        count += 1
        if half_at == 0 and 2 * np.sum(iterations <= count) >= len(iterations):
            half_at = count
    left = np.flatnonzero(iterations > count)
    groups = [left[i : i + capacity] for i in range(0, len(left), capacity)]
    return count, sum(int(iterations[g].max()) - count for g in groups)


def _check_each_chain(states, info, alone):
    alone_states, alone_info, expected = alone
    for field in ("iterations", "solves", "result", "front"):
        assert_array_equal(getattr(info, field), getattr(alone_info, field), field)
    assert_allclose(info.residual, alone_info.residual, rtol=0, atol=1e-12)
    for c in range(C):
        front = int(info.front[c])
        assert_allclose(states[c, :front], expected[c, :front], **MATCH)
        assert_allclose(states[c], alone_states[c], **MATCH)


@functools.cache
def _jitted(solver, capacity):
    return jax.jit(
        lambda *a: batched_deer_solve(_steps, *a, solver=solver, capacity=capacity)
    )


def _solve(solver, capacity, problem):
    return _jitted(solver, capacity)(*problem)


# restarts (max_iter) and the sweep after 10 iterations; tight tolerances, so
# that certified states agree with the sequential chain to MATCH
SOLVER = DEERSolver(
    jacobian="diag",
    sweep=2,
    sweep_after=10,
    max_iter=12,
    max_solves=3,
    atol=1e-12,
    rtol=1e-10,
)


@pytest.fixture(scope="module")
def one_hard():
    problem = _problem([5])
    states, _, info = _solve(SOLVER, 1, problem)
    return states, info, _alone(SOLVER, *problem)


def test_one_hard_chain_leaves_every_chain_its_sequential_chain(one_hard):
    states, info, alone = one_hard
    assert np.all(np.asarray(alone[1].converged))
    assert int(np.max(alone[1].solves)) > 1
    _check_each_chain(np.asarray(states), info, alone)


def test_batch_stops_before_the_hard_chain_which_the_stragglers_finish(one_hard):
    _, info, alone = one_hard
    iterations = np.asarray(alone[1].iterations)
    batch = int(info.batch_iterations[0])
    stragglers = int(info.straggler_iterations[0])
    assert np.all(np.asarray(info.batch_iterations) == batch)
    assert np.all(np.asarray(info.straggler_iterations) == stragglers)
    # the hard chain needs far more iterations than any other chain
    assert iterations[5] >= 1.5 * np.delete(iterations, 5).max()
    assert batch < iterations[5] and stragglers > 0
    assert batch + stragglers == iterations[5] == int(np.max(info.iterations))
    assert (batch, stragglers) == _replay(iterations, 1)


def test_more_stragglers_than_capacity_go_in_groups():
    # three hard chains, one straggler slot: a group for each chain left
    problem = _problem([1, 4, 6])
    states, _, info = _solve(SOLVER, 1, problem)
    alone = _alone(SOLVER, *problem)
    _check_each_chain(np.asarray(states), info, alone)
    iterations = np.asarray(alone[1].iterations)
    batch, stragglers = _replay(iterations, 1)
    assert np.sum(iterations > batch) > 1
    assert int(info.batch_iterations[0]) == batch
    assert int(info.straggler_iterations[0]) == stragglers


def test_capacity_out_of_range_names_the_argument():
    with pytest.raises(ValueError, match=r"batched_deer_solve\(capacity=9\).*\[1, 8\]"):
        _solve(SOLVER, 9, _problem([5]))


@pytest.mark.parametrize("basis", ["whitened", "hessian"])
def test_refill_blocks_gives_each_chain_its_refill_block(basis):
    # the kernel's vectorized refill through the batched solve (the path taken
    # where chains are vmapped): every chain's block, key and report are those
    # of its own refill_block. In the Hessian basis the initial states'
    # curvature points coincide, so each block starts with its pilot
    # iterations, which the batch takes side by side before its loop
    from jax.flatten_util import ravel_pytree

    from numpyro_deer.infer.block import PILOT_ITERATIONS
    from numpyro_deer.infer.initial import initial_state
    from numpyro_deer.infer.refill import refill_block, refill_blocks
    from numpyro_deer.infer.warmup import build_adapter

    solver = DEERSolver(jacobian="diag", sweep=0, solve_basis=basis)
    pilot = PILOT_ITERATIONS if basis == "hessian" else 0
    settings = dict(solver=solver, on_failure="warn", transition=MALA())

    def potential_flat(x):
        return _potential(x)

    def ravel(z):
        return ravel_pytree(z)[0]

    adapter = build_adapter(
        potential_flat,
        10,
        mass_adaptation=False,
        dense_mass=False,
        adapt_step_size=False,
        target_accept_prob=0.8,
        transition=MALA(),
    )
    step_size, x0, _, _ = _problem([2])

    def start(x, eps, key):
        state = initial_state({"x": x}, key, potential_flat, adapter.init, 1.0, T)
        return state._replace(adapt_state=state.adapt_state._replace(step_size=eps))

    states = jax.vmap(start)(x0, step_size, jax.random.split(jax.random.PRNGKey(3), C))
    batched = jax.jit(
        lambda s: refill_blocks(s, potential_flat, ravel, capacity=1, **settings)
    )(states)
    alone = jax.jit(
        jax.vmap(
            lambda s: refill_block(
                s, potential_flat, ravel, method="deer", mesh=None, **settings
            )
        )
    )(states)
    assert_allclose(batched.block.z, alone.block.z, **MATCH)
    assert_allclose(batched.block.accept_prob, alone.block.accept_prob, atol=1e-6)
    assert_array_equal(batched.rng_key, alone.rng_key)
    for field in ("iterations", "solves", "result", "front"):
        assert_array_equal(
            getattr(batched.block.info, field), getattr(alone.block.info, field)
        )
    iterations = np.asarray(alone.block.info.iterations)
    batch, stragglers = _replay(iterations - pilot, 1)
    assert (
        int(batched.block.info.batch_iterations[0]),
        int(batched.block.info.straggler_iterations[0]),
    ) == (pilot + batch, stragglers)
    assert int(batched.block.info.batch_iterations[0]) < iterations.max()
