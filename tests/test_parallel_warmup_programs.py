"""One compiled program for every window of a parallel warmup
(numpyro_deer.core.warmup_window.padded_window_draws): the window's length,
HMC's leapfrog count, the iteration cap and the front-stall look-back are
traced, and a window shorter than the program's tapes freezes the steps past
it. Float64 (the session's conftest): the padded windows are compared with
the sequential scan of the same tapes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_deer.core import HMC, MALA, DEERSolver, sequential_chain
from numpyro_deer.core.hmc import split_leapfrog, with_leapfrog
from numpyro_deer.core.metric import whiten
from numpyro_deer.core.parallel_warmup import (
    WarmupSchedule,
    WindowPlan,
    parallel_warmup,
    solve_window,
    window_tapes,
)
from numpyro_deer.core.warmup_adapt import (
    pooled_inverse_mass,
    spread,
    window_points,
)

from .helpers import compile_log

SCALES = jnp.geomspace(0.1, 10.0, 5)
SOLVER = DEERSolver(sweep=0)
LOG = compile_log()


def gaussian_potential(x):
    """``N(0, diag(SCALES^2))``."""
    return 0.5 * jnp.sum((x / SCALES) ** 2)


def _window_programs(names) -> dict:
    return {n: c for n, c in names.items() if "window" in n}


def _plan(length, leapfrog, max_iter, stall):
    return WindowPlan(
        *(jnp.asarray(v, jnp.int32) for v in (length, leapfrog, max_iter, stall))
    )


@pytest.mark.parametrize(
    "transition, lockstep, max_iter",
    [
        (HMC(num_steps=3), True, 100),
        (HMC(num_steps=3), True, 2),
        (HMC(num_steps=3), False, 100),
        (HMC(num_steps=3), True, 0),
        (HMC(num_steps=3), False, 0),
        (MALA(), True, 100),
    ],
    ids=[
        "hmc-lockstep",
        "hmc-fallback",
        "hmc-deer",
        "hmc-sequential",
        "hmc-deer-sequential",
        "mala",
    ],
)
def test_padded_window_equals_sequential_scan(transition, lockstep, max_iter):
    """A window of 10 steps in tapes of 16 (6 frozen), the leapfrog count
    traced: its first 10 states are the sequential scan of the first 10 tape
    entries with ``HMC(num_steps=3)``, whether the solve passed, stopped at
    its cap and finished sequentially, or did not iterate (a sequential
    window); the frozen steps are not counted as the window's."""
    num_chains, padded, length, dim = 4, 16, 10, SCALES.shape[0]
    static, leapfrog = split_leapfrog(transition)
    assert static == split_leapfrog(HMC(num_steps=7))[0] or isinstance(static, MALA)
    step_size = 0.8 if isinstance(transition, MALA) else 1.2
    x0 = 2.0 * SCALES * jax.random.normal(jax.random.key(3), (num_chains, dim))
    tapes = window_tapes(
        transition, jax.random.key(4), num_chains, padded, dim, x0.dtype
    )
    mass_sqrt = SCALES * jnp.sqrt(jnp.array([1.3, 0.7, 1.0, 1.1, 0.9]))
    potential_w = whiten(gaussian_potential, mass_sqrt)
    w0 = x0 / mass_sqrt
    plan = _plan(length, leapfrog, max_iter, 0)  # no front-stall stop
    solver = DEERSolver(sweep=0, max_iter=100, max_solves=1)

    @jax.jit
    def solve(w, t, k, plan):
        # a traced look-back (0 here) is a lockstep solve, 0 a vmap of deer_solve
        plan = plan._replace(stall=plan.stall if lockstep else 0)
        traced = with_leapfrog(static, plan.leapfrog)
        return solve_window(traced, potential_w, w, t, k, step_size, solver, plan=plan)

    states, infos, iterations, fronts, _ = solve(w0, tapes, jax.random.key(5), plan)
    head = jax.tree.map(lambda a: a[:, :length], tapes)
    # the head of a longer tape is the tape of the window's length: a padded
    # window draws what an unpadded one draws
    unpadded = window_tapes(
        transition, jax.random.key(4), num_chains, length, dim, x0.dtype
    )
    jax.tree.map(np.testing.assert_array_equal, head, unpadded)
    expected, expected_infos = jax.vmap(
        lambda w, t: sequential_chain(transition, potential_w, w, t, step_size)
    )(w0, head)
    assert np.all(np.asarray(fronts) <= length)
    if max_iter == 100:
        assert np.all(fronts == length)  # the solves themselves passed
    elif max_iter == 2:
        assert np.all(iterations == 2) and np.any(fronts < length)
    else:
        assert np.all(iterations == 0) and np.all(fronts == 0)
    assert 0 < np.mean(expected_infos.accepted) < 1
    np.testing.assert_allclose(states[:, :length], expected, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(
        infos.accept_prob[:, :length],
        expected_infos.accept_prob,
        rtol=1e-8,
        atol=1e-10,
    )


def test_one_window_program_for_lengths_kinds_and_leapfrog_counts():
    """Windows of 8, 16 and 32 transitions (the first sequential) and HMC
    with a leapfrog count chosen between windows: the windows and the
    adaptation after each compile one program; a second warmup starting
    from another leapfrog count, choosing among other counts, compiles no
    window program (nor the report's)."""
    x0 = jax.random.normal(jax.random.key(1), (16, 5))
    schedule = WarmupSchedule(windows=(8, 16, 32))

    def warmup(transition, choices):
        before = LOG.names.copy()
        result = parallel_warmup(
            transition,
            gaussian_potential,
            x0,
            jax.random.key(0),
            schedule=schedule,
            solver=SOLVER,
            num_steps_choices=choices,
        )
        jax.block_until_ready(result)
        return result, _window_programs(LOG.names - before)

    first, compiled = warmup(HMC(num_steps=8), (1, 2, 8))
    assert compiled == {"jit(warmup_window)": 1}
    before = LOG.names.copy()
    second, _ = warmup(HMC(num_steps=2), (1, 4))
    # only what depends on the transition's own leapfrog count compiles again
    assert LOG.names - before == {
        "jit(initial_step_size)": 1,
        "jit(_choose_num_steps)": 1,
    }
    assert int(second.info.num_steps[0]) == 2
    assert second.info.final_num_steps in (1, 4)
    np.testing.assert_array_equal(first.info.windows.sequential, [True, False, False])
    # the sequential window: no iteration, all steps finished sequentially
    assert int(first.info.windows.newton_iterations[0]) == 0
    assert int(first.info.windows.fallback_steps[0]) == 8


@pytest.mark.parametrize("dense", [False, True], ids=["diag", "dense"])
def test_masked_pooled_metric_is_the_metric_of_the_window(dense):
    """The pooled (co)variance of the rows of weight 1 among padding rows
    that hold anything (here NaN and 1e30) is that of those rows alone."""
    rows = jax.random.normal(jax.random.key(0), (40, 3)) * jnp.array([1.0, 2, 3])
    padding = jnp.full((7, 3), jnp.nan).at[::2].set(1e30)
    draws = jnp.concatenate([rows[:25], padding, rows[25:]])
    weights = jnp.concatenate([jnp.ones(25), jnp.zeros(7), jnp.ones(15)])
    np.testing.assert_allclose(
        pooled_inverse_mass(draws, dense, weights),
        pooled_inverse_mass(rows, dense),
        rtol=1e-12,
    )


@pytest.mark.parametrize("length", [6, 9, 16])
def test_window_points_are_spread_of_the_second_half(length):
    """The curve's points of a window of ``length`` in padded draws are
    :func:`spread`'s of its pooled second half: evenly spaced where there are
    more than ``count``, all of them (then the rows past them invalid)
    where not."""
    draws = jax.random.normal(jax.random.key(1), (3, 16, 2))
    count, slots = 10, 24
    half = length // 2
    pooled = draws[:, half:length].reshape(-1, 2)
    points, valid = window_points(
        draws, jnp.int32(half), jnp.int32(length), count, slots
    )
    expected = spread(pooled, count)
    assert int(np.sum(valid)) == expected.shape[0]
    assert np.all(valid[: expected.shape[0]])
    np.testing.assert_array_equal(points[: expected.shape[0]], expected)


def test_hessian_metric_windows_share_one_program():
    """The Hessian metric at 16 pooled draws of each window (the first
    window's 16 x 4 pooled draws are more than 16): one program, and the
    inverse mean Hessian of the Gaussian, exact, after the second window."""
    x0 = jax.random.normal(jax.random.key(1), (16, 5))
    before = LOG.names.copy()
    result = parallel_warmup(
        MALA(),
        gaussian_potential,
        x0,
        jax.random.key(0),
        schedule=WarmupSchedule(windows=(8, 16)),
        solver=SOLVER,
        metric="hessian",
    )
    assert _window_programs(LOG.names - before) == {"jit(warmup_window)": 1}
    np.testing.assert_allclose(
        result.inverse_mass_matrix, jnp.diag(SCALES**2), rtol=1e-6, atol=1e-12
    )
