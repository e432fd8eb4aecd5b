"""The parallel warmup's step size rule, its acceptance curve and its stuck
chains (numpyro_deer.core.warmup_adapt.choose_step_size, acceptance_curve,
restart_stuck).

Float64 (the session's conftest).
"""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_deer.core import MALA, DEERSolver, sequential_chain
from numpyro_deer.core.metric import mass_matrix_sqrt, solve_sqrt, whiten
from numpyro_deer.core.parallel_warmup import WarmupSchedule, parallel_warmup
from numpyro_deer.core.warmup_adapt import (
    acceptance_curve,
    choose_step_size,
    initial_step_size,
    restart_stuck,
)

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


def test_acceptance_curve_is_the_mean_along_consecutive_transitions():
    """``num_transitions=3``: each factor's value is the mean acceptance of
    the sequential chains of 3 steps from the points (whitened by the metric)
    on the tape's entries ``j * K + k`` of point ``k``, over the valid
    points."""
    num_points, n, dim = 6, 3, SCALES.shape[0]
    points = 3.0 * SCALES * jax.random.normal(jax.random.key(4), (num_points, dim))
    valid = jnp.arange(num_points) < 5
    mass_sqrt = mass_matrix_sqrt(SCALES**2 * 1.5)
    factors = jnp.array([0.25, 1.0, 4.0])
    key = jax.random.key(5)
    got = acceptance_curve(
        MALA(), quartic_potential, points, 0.3, mass_sqrt, factors, key, valid, n
    )
    tape = MALA().make_tape(key, num_points * n, dim, points.dtype)
    potential_w = whiten(quartic_potential, mass_sqrt)
    for value, factor in zip(got, factors, strict=True):
        expected = []
        for k in range(5):
            tape_k = jax.tree.map(lambda a, k=k: a[k::num_points], tape)
            w = solve_sqrt(mass_sqrt, points[k])
            _, infos = sequential_chain(MALA(), potential_w, w, tape_k, 0.3 * factor)
            expected.append(jnp.mean(infos.accept_prob))
        np.testing.assert_allclose(value, np.mean(expected), rtol=1e-12)
    # one transition: the first step's acceptance only, another curve
    one = acceptance_curve(
        MALA(), quartic_potential, points, 0.3, mass_sqrt, factors, key, valid, 1
    )
    assert not np.allclose(one, got)


def test_curve_along_transitions_follows_chains_off_the_typical_set():
    """Logistic regression (D = 20, N = 1,000) from NumPyro's initialisation
    (uniform in [-2, 2]): one transition from each initial position mostly
    moves far downhill and is accepted, so its curve picks a step size at
    which the chains then reject nearly every proposal (the second half of a
    window of 32 accepts under 5 %); the mean over 4 transitions sees those
    rejections and picks a step size at which they keep moving (over 10 %)."""
    num_obs, dim = 1000, 20
    k_x, k_beta, k_y, k_0 = jax.random.split(jax.random.key(0), 4)
    features = jax.random.normal(k_x, (num_obs, dim))
    beta = 0.5 * jax.random.normal(k_beta, (dim,))
    labels = jax.random.bernoulli(k_y, jax.nn.sigmoid(features @ beta))

    def potential(x):
        logits = features @ x
        return jnp.sum(jax.nn.softplus(logits) - labels * logits) + 0.5 * x @ x

    x0 = jax.random.uniform(k_0, (64, dim), minval=-2.0, maxval=2.0)
    tape = MALA().make_tape(jax.random.key(3), 32, dim, x0.dtype)
    accepted = {}
    for n in (1, 4):
        eps = initial_step_size(
            MALA(), potential, x0, jnp.asarray(1.0), 0.9, jax.random.key(2), n
        )
        _, infos = jax.vmap(
            lambda x, eps=eps: sequential_chain(MALA(), potential, x, tape, eps)
        )(x0)
        accepted[n] = float(jnp.mean(infos.accept_prob[:, 16:]))
    assert accepted[1] < 0.05 and accepted[4] > 0.1, accepted
