"""The parallel warmup's step size rule and its stuck chains
(numpyro_deer.core.warmup_adapt.choose_step_size, restart_stuck).

Float64 (the session's conftest).
"""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_deer.core import MALA, DEERSolver
from numpyro_deer.core.parallel_warmup import WarmupSchedule, parallel_warmup
from numpyro_deer.core.warmup_adapt import choose_step_size, restart_stuck

FACTORS = jnp.array([1.0, 2.0, 4.0, 8.0, 16.0])
# the acceptance curve of the points that move: 0.9 is crossed halfway
# (in log eps) between factors 2 and 4
MOVING = jnp.array([1.0, 0.95, 0.85, 0.5, 0.1])
CROSSING = 2.0**1.5


def test_crossing_of_a_curve_that_reaches_the_target():
    eps = choose_step_size(0.1, FACTORS, MOVING, 0.9)
    np.testing.assert_allclose(eps, 0.1 * CROSSING, rtol=1e-12)


def test_curve_plateauing_below_target_gives_the_moving_points_crossing():
    """40 % of the points accept nothing at any candidate: the mean curve is
    0.6 times the moving points' and never reaches 0.9 (the rule that aimed
    at 0.9 took the smallest factor, 0.1 here); aiming at 0.9 times its
    maximum gives the moving points' own crossing."""
    plateau = 0.6 * MOVING
    assert float(jnp.max(plateau)) < 0.9
    eps = choose_step_size(0.1, FACTORS, plateau, 0.9)
    np.testing.assert_allclose(eps, 0.1 * CROSSING, rtol=1e-12)


def test_acceptances_left_of_the_maximum_are_ignored():
    # rounding noise at the smallest candidates: the maximum is at factor 2,
    # level 0.9 * 0.98; the run from it ends at factor 4 (0.9), factor 8 fails
    accept = jnp.array([0.8, 0.98, 0.9, 0.3, 0.0])
    eps = choose_step_size(1.0, FACTORS, accept, 0.9)
    level = 0.9 * 0.98
    t = (0.9 - level) / (0.9 - 0.3)
    np.testing.assert_allclose(eps, 4.0 * 2.0**t, rtol=1e-12)


def test_ends_of_the_grid():
    # nothing accepted anywhere: the smallest factor; all at the level: the largest
    zeros = jnp.zeros(5)
    np.testing.assert_allclose(choose_step_size(0.1, FACTORS, zeros, 0.9), 0.1)
    ones = jnp.full(5, 0.95)
    np.testing.assert_allclose(choose_step_size(0.1, FACTORS, ones, 0.9), 1.6)


def test_restart_stuck_copies_moving_chains():
    draws = jnp.arange(4 * 3 * 2, dtype=jnp.float64).reshape(4, 3, 2)
    accepted = jnp.array([[1, 0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    new, restarted = restart_stuck(draws, accepted, jax.random.key(0))
    np.testing.assert_array_equal(restarted, [False, True, False, True])
    np.testing.assert_array_equal(new[0], draws[0])
    np.testing.assert_array_equal(new[2], draws[2])
    for chain in (1, 3):  # each a copy of chain 0 or chain 2
        assert any(np.array_equal(new[chain], draws[d]) for d in (0, 2))
    # no chain moved: nothing to copy from, nothing changes
    new, restarted = restart_stuck(draws, jnp.zeros((4, 3), bool), jax.random.key(0))
    np.testing.assert_array_equal(new, draws)
    assert not np.any(restarted)


SCALES = jnp.geomspace(0.1, 10.0, 5)


def quartic_potential(x):
    """Gaussian with scales ``SCALES`` plus a quartic term: far out, the
    curvature grows as ``x^2`` and the stable step size shrinks as ``1/x``."""
    z = x / SCALES
    return jnp.sum(0.5 * z**2 + 0.25 * z**4)


def test_far_out_chains_neither_collapse_the_step_size_nor_stay_stuck():
    """A quarter of 64 chains start at ``x = 1e5``, where MALA needs a step
    below 1e-7 (outside the initial grid, down to ``2^-16``): they accept
    nothing at any candidate, the mean acceptance plateaus at 0.75 and the
    rule that aimed at 0.9 took the smallest candidate. The initial search
    and the warmup's end must give the step sizes of the chains started in
    the bulk (within a factor 1.5), and every chain end in the bulk: the
    stuck chains restart from moving ones after the first window."""
    num_chains, dim = 64, SCALES.shape[0]
    bulk = SCALES * jax.random.normal(jax.random.key(1), (num_chains, dim))
    far = bulk.at[:16].set(1e5)
    schedule = WarmupSchedule(windows=(16,) * 4, num_sequential=4)

    def warm(x0):
        return parallel_warmup(
            MALA(),
            quartic_potential,
            x0,
            jax.random.key(0),
            schedule=schedule,
            solver=DEERSolver(sweep=0),
        )

    reference, result = warm(bulk), warm(far)
    restarted = np.asarray(result.info.windows.num_restarted)
    assert restarted[0] == 16 and np.all(restarted[1:] == 0)
    assert np.all(np.asarray(reference.info.windows.num_restarted) == 0)
    for got, expected in (
        (result.info.initial_step_size, reference.info.initial_step_size),
        (result.step_size, reference.step_size),
    ):
        assert 1 / 1.5 < float(got / expected) < 1.5, (got, expected)
    assert np.all(np.abs(result.positions / SCALES) < 5.0)
