"""Parallel warmup (numpyro_deer.core.parallel_warmup): windows solved by DEER
for all chains at a fixed kernel, adapted from pooled statistics.

Float64 (the session's conftest). One potential function object and one
window length are shared by the tests, so the window program compiles once.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_deer.core import HMC, MALA, DEERSolver, sequential_chain
from numpyro_deer.core.metric import mass_matrix_sqrt, solve_sqrt, whiten
from numpyro_deer.core.parallel_warmup import (
    WarmupSchedule,
    WindowPlan,
    parallel_warmup,
    solve_window,
    warmup_window,
    window_solver,
    window_tapes,
)
from numpyro_deer.core.warmup_adapt import CURVE_TRANSITIONS as K
from numpyro_deer.core.warmup_adapt import chees_per_gradient
from numpyro_deer.core.warmup_window import stall_iterations

SCALES = jnp.geomspace(0.1, 10.0, 5)
NUM_CHAINS = 64
WINDOW = 16
# the sweep changes how fast a solve converges, never its result; without it
# the window program compiles in about half the time
SOLVER = DEERSolver(sweep=0)
SCHEDULE = WarmupSchedule(windows=(WINDOW,) * 8)


def gaussian_potential(x):
    """``N(0, diag(SCALES^2))``."""
    return 0.5 * jnp.sum((x / SCALES) ** 2)


@pytest.fixture(scope="module")
def warmed():
    x0 = jax.random.normal(jax.random.key(1), (NUM_CHAINS, SCALES.shape[0]))
    return parallel_warmup(
        MALA(),
        gaussian_potential,
        x0,
        jax.random.key(0),
        schedule=SCHEDULE,
        solver=SOLVER,
    )


@pytest.mark.parametrize("transition", [MALA(), HMC(num_steps=2)], ids=["mala", "hmc"])
@pytest.mark.parametrize("max_iter", [100, 2], ids=["converged", "fallback"])
def test_window_equals_sequential_scan(transition, max_iter):
    """Each window's DEER solve (and its sequential completion after an
    iteration cap) is the sequential scan of the same tapes at the same kernel."""
    num_chains, num_steps, dim = 4, 12, SCALES.shape[0]
    inverse_mass = SCALES**2 * jnp.array([1.3, 0.7, 1.0, 1.1, 0.9])
    mass_sqrt = mass_matrix_sqrt(inverse_mass)
    step_size = 0.3 if isinstance(transition, MALA) else 0.5
    x0 = 2.0 * SCALES * jax.random.normal(jax.random.key(3), (num_chains, dim))
    w0 = jax.vmap(lambda x: solve_sqrt(mass_sqrt, x))(x0)
    tapes = window_tapes(
        transition, jax.random.key(4), num_chains, num_steps, dim, x0.dtype
    )
    potential_w = whiten(gaussian_potential, mass_sqrt)
    solver = DEERSolver(sweep=0, max_iter=max_iter, max_solves=1)
    states, infos, iterations, fronts, _ = jax.jit(
        lambda w, t, k: solve_window(
            transition, potential_w, w, t, k, step_size, solver
        )
    )(w0, tapes, jax.random.key(5))
    expected, expected_infos = jax.vmap(
        lambda w, t: sequential_chain(transition, potential_w, w, t, step_size)
    )(w0, tapes)
    if max_iter == 100:
        assert np.all(fronts == num_steps)  # the solves themselves passed
    else:
        assert np.all(iterations == 2) and np.any(fronts < num_steps)
    # both kinds of step are in the chains: the comparison tests the gate
    assert 0 < np.mean(expected_infos.accepted) < 1
    np.testing.assert_allclose(states, expected, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(
        infos.accept_prob, expected_infos.accept_prob, rtol=1e-8, atol=1e-10
    )


@pytest.mark.parametrize("transition", [MALA(), HMC(num_steps=2)], ids=["mala", "hmc"])
def test_window_with_stall_stop_equals_sequential_scan(transition):
    """A quartic potential from 3 sd: the slowest front moves about a step per
    iteration, the stall stop ends the solve after its look-back of 2
    iterations (well before ``max_iter``), and the sequential completion from
    the fronts gives the sequential scan of the same tapes."""
    num_chains, num_steps, dim = 4, 24, SCALES.shape[0]

    def quartic(x):
        z = x / SCALES
        return 0.5 * jnp.sum(z**2) + 0.25 * jnp.sum(z**4)

    x0 = 3.0 * SCALES * jax.random.normal(jax.random.key(3), (num_chains, dim))
    tapes = window_tapes(
        transition, jax.random.key(4), num_chains, num_steps, dim, x0.dtype
    )
    potential_w = whiten(quartic, SCALES)
    solver = DEERSolver(sweep=0, max_iter=12, max_solves=1)
    states, infos, iterations, fronts, _ = jax.jit(
        lambda w, t, k: solve_window(
            transition, potential_w, w, t, k, 0.3, solver, stall=2
        )
    )(x0 / SCALES, tapes, jax.random.key(5))
    expected, expected_infos = jax.vmap(
        lambda w, t: sequential_chain(transition, potential_w, w, t, 0.3)
    )(x0 / SCALES, tapes)
    assert int(np.max(iterations)) == 2
    assert np.any(fronts < num_steps)
    assert 0 < np.mean(expected_infos.accepted) < 1
    np.testing.assert_allclose(states, expected, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(
        infos.accept_prob, expected_infos.accept_prob, rtol=1e-8, atol=1e-10
    )


def test_stall_look_back_is_a_fraction_of_the_cap():
    capped = window_solver(SOLVER, MALA(), 512, True)
    assert capped.max_iter == 128  # 512 g / (2 (g + 1)), g = 1
    assert stall_iterations(capped, 0.5) == 64
    assert stall_iterations(capped, 0.0) == 0
    assert stall_iterations(window_solver(SOLVER, MALA(), 4, True), 0.5) == 1


def test_adapted_metric_and_acceptance(warmed):
    """C=64 chains: the diagonal inverse mass within 20 % of the variances,
    and a further window at the adapted kernel accepts near the target 0.9."""
    np.testing.assert_allclose(warmed.inverse_mass_matrix, SCALES**2, rtol=0.2)
    np.testing.assert_allclose(
        warmed.mass_matrix_sqrt**2, warmed.inverse_mass_matrix, rtol=1e-12
    )
    windows = warmed.info.windows
    assert np.all(np.asarray(windows.metric_updated) == (np.arange(8) >= 1))
    capped = window_solver(SOLVER, MALA(), WINDOW, True)
    plan = WindowPlan(  # traced, as the warmup passes it: its own programs
        *(jnp.asarray(v, jnp.int32) for v in (WINDOW, 0, capped.max_iter, 2))
    )
    base = dataclasses.replace(SOLVER, max_iter=300, max_solves=1)
    *_, info = warmup_window(
        MALA(),
        gaussian_potential,
        base,
        WINDOW,
        True,
        "diag",
        0.9,
        256,
        256,  # the curve's rows: 256 of the 64 x 8 pooled draws
        0,
        warmed.positions,
        warmed.step_size,
        warmed.inverse_mass_matrix,
        jnp.asarray(False),
        jax.random.key(9),
        plan,
    )
    assert abs(float(info.mean_accept_prob) - 0.9) < 0.05
    # capped at 4 iterations: chains whose solve did not pass fell back
    assert (int(info.fallback_steps) > 0) == (int(info.num_converged) < NUM_CHAINS)
    assert int(info.newton_iterations) <= WINDOW // 4


def test_far_start_finite_and_reports_fallback():
    """From 10 N(0, I) times the scales: finite states and step size, and the
    report says which windows fell back to sequential steps."""
    x0 = 10.0 * SCALES * jax.random.normal(jax.random.key(7), (NUM_CHAINS, 5))
    result = parallel_warmup(
        MALA(),
        gaussian_potential,
        x0,
        jax.random.key(8),
        schedule=SCHEDULE,
        solver=SOLVER,
    )
    assert np.all(np.isfinite(result.positions))
    assert np.isfinite(result.step_size) and result.step_size > 0
    windows = result.info.windows
    fell_back = np.asarray(windows.fallback_steps) > 0
    all_passed = np.asarray(windows.num_converged) == NUM_CHAINS
    assert np.all(fell_back == ~all_passed)
    cap = WINDOW // 4  # break-even iterations of MALA
    assert np.all(np.asarray(windows.newton_iterations) <= cap)
    # every chain near the typical set at the end: |x| / scale below 5
    assert np.all(np.abs(result.positions / SCALES) < 5.0)


def test_critical_path_hand_count():
    """Two chains of one dimension, a sequential window of 4 then a DEER
    window of 4 capped at its break-even single iteration."""
    result = parallel_warmup(
        MALA(),
        lambda x: 0.5 * jnp.sum(x**2),
        jnp.array([[0.3], [-0.5]]),
        jax.random.key(0),
        schedule=WarmupSchedule(windows=(4, 4), num_sequential=1),
        solver=DEERSolver(sweep=0),
    )
    windows = result.info.windows
    np.testing.assert_array_equal(windows.newton_iterations, [0, 1])
    # one iteration tests the initial guess (nothing passes) and sets the
    # first step exactly: the front is 0, all 4 steps are finished sequentially
    np.testing.assert_array_equal(windows.fallback_steps, [4, 4])
    # MALA: g = 1 per sequential step, g_f = 2 per evaluated step; the
    # curves take K dependent steps from every point at every step size
    initial = K * 2  # from every chain
    sequential = 1 + 4 * 1 + K * 2  # start gradient, 4 steps, the curve after
    deer = 1 * (2 * 2) + (1 + 4 * 1) + K * 2  # iteration, fallback, the curve
    np.testing.assert_array_equal(
        windows.critical_path_gradients, [5 + 2 * K, 9 + 2 * K]
    )
    assert int(result.info.critical_path_gradients) == initial + sequential + deer
    # all gradients: 2 chains; the curve at 4 pooled draws x 25 step sizes
    # (41 at the start), one stochastic probe
    total_initial = 2 * 41 * K * 2
    total_sequential = 2 * (1 + 4) + 4 * 25 * K * 2
    total_deer = 2 * (1 * 4 * 2 * 2 + (1 + 4)) + 4 * 25 * K * 2
    assert float(result.info.total_gradients) == (
        total_initial + total_sequential + total_deer
    )


def test_critical_path_hand_count_with_stall_stop():
    """A DEER window of 16 (break-even cap 4 iterations) with a look-back of
    one iteration (``stall_fraction=0.25``): the first iteration certifies
    nothing (the front stays 0 < 16 / 4), so the solve stops there, not at
    the cap, and all 16 steps run sequentially."""
    result = parallel_warmup(
        MALA(),
        lambda x: 0.5 * jnp.sum(x**2),
        jnp.array([[0.3], [-0.5]]),
        jax.random.key(0),
        schedule=WarmupSchedule(windows=(4, 16), num_sequential=1),
        solver=DEERSolver(sweep=0),
        stall_fraction=0.25,
    )
    windows = result.info.windows
    np.testing.assert_array_equal(windows.newton_iterations, [0, 1])
    np.testing.assert_array_equal(windows.fallback_steps, [4, 16])
    initial = K * 2
    sequential = 1 + 4 * 1 + K * 2
    deer = 1 * (2 * 2) + (1 + 16 * 1) + K * 2  # one iteration, not the cap's 4
    np.testing.assert_array_equal(
        windows.critical_path_gradients, [5 + 2 * K, 21 + 2 * K]
    )
    assert int(result.info.critical_path_gradients) == initial + sequential + deer
    # all gradients: every chain's own iteration and fallback; the curve at
    # 2 x 8 pooled draws (the second half of the window) x 25 step sizes
    total_deer = 2 * (1 * 16 * 2 * 2 + (1 + 16)) + 16 * 25 * K * 2
    total_rest = 2 * 41 * K * 2 + 2 * (1 + 4) + 4 * 25 * K * 2
    assert float(result.info.total_gradients) == total_rest + total_deer


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"schedule": WarmupSchedule(windows=())},
            "WarmupSchedule\\(windows=\\(\\)\\)",
        ),
        (
            {"schedule": WarmupSchedule(windows=(8,), num_sequential=2)},
            "num_sequential=2",
        ),
        ({"metric": "full"}, "metric='full'"),
        ({"target_accept_prob": 1.5}, "target_accept_prob=1.5"),
        ({"stall_fraction": 2.0}, "stall_fraction=2.0"),
        ({"curve_transitions": 0}, "curve_transitions=0"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        parallel_warmup(
            MALA(), gaussian_potential, jnp.zeros((2, 5)), jax.random.key(0), **kwargs
        )


def test_flat_positions_required():
    with pytest.raises(ValueError, match="shape \\(num_chains, dim\\)"):
        parallel_warmup(MALA(), gaussian_potential, jnp.zeros(5), jax.random.key(0))


def test_chees_per_gradient_closed_form():
    """Exact draws of a Gaussian, whitened by its scales: ChEES of HMC with
    ``L`` steps of ``eps`` is ``D sin^2(L eps)`` for the exact flow; per
    gradient ``D sin^2(L eps) / L``, largest at ``L = 4`` for ``eps = 0.3``."""
    points = SCALES * jax.random.normal(jax.random.key(3), (4096, 5))
    lengths = (1, 2, 4, 8)
    scores = chees_per_gradient(
        gaussian_potential,
        tuple(HMC(num_steps=n) for n in lengths),
        points,
        0.3,
        SCALES,
        jax.random.key(4),
    )
    exact = 5 * np.sin(0.3 * np.array(lengths)) ** 2 / np.array(lengths)
    np.testing.assert_allclose(scores, exact, rtol=0.15)
    assert int(np.argmax(scores)) == 2


def test_trajectory_length_choice_is_reported_and_counted():
    result = parallel_warmup(
        HMC(num_steps=8),
        gaussian_potential,
        jax.random.normal(jax.random.key(1), (NUM_CHAINS, 5)),
        jax.random.key(0),
        schedule=WarmupSchedule(windows=(WINDOW,) * 3),
        solver=SOLVER,
        num_steps_choices=(1, 2, 8),
    )
    info = result.info
    # chosen after windows 1 (the first that estimates the metric), not the last
    assert int(info.num_steps[0]) == 8 and int(info.num_steps[1]) == 8
    assert int(info.num_steps[2]) == info.final_num_steps
    assert info.final_num_steps in (1, 2, 8)
    # the initial search (K transitions, g_f = 9) and one choice (max L + 1 =
    # 9) on top
    expected = int(np.sum(info.windows.critical_path_gradients)) + K * 9 + 9
    assert int(info.critical_path_gradients) == expected


def test_trajectory_length_choice_needs_leapfrog_steps():
    with pytest.raises(ValueError, match="num_steps_choices=\\(1, 2\\)"):
        parallel_warmup(
            MALA(),
            gaussian_potential,
            jnp.zeros((2, 5)),
            jax.random.key(0),
            num_steps_choices=(1, 2),
        )


def test_window_totals_of_many_chains_do_not_overflow():
    # 1,024 chains x 150 iterations x a window of 2,048 HMC transitions: about
    # 3e9 gradients, past int32
    from numpyro_deer.core.warmup_cost import tangent_directions, window_costs

    transition, solver = HMC(num_steps=4), DEERSolver(sweep=0)
    chains, k, window, dim = 1024, 150, 2048, 10
    with jax.enable_x64(False):  # float32 and int32, as on a GPU by default
        iterations = jnp.full((chains,), k, jnp.int32)
        critical, total, _ = window_costs(
            transition, solver, window, False, iterations,
            jnp.zeros((chains,), jnp.int32), chains, dim, 0, 0, False,
            adaptation=False,
        )  # fmt: skip
    per_iteration = window * 5 * (1 + tangent_directions(solver, dim))
    assert float(total) == pytest.approx(chains * k * per_iteration, rel=1e-6)
    assert float(total) > 2**31
    assert int(critical) == k * 2 * 5
