"""The taped HMC transition: its algebra, its chain, and DEER on it.

Independent checks: with one leapfrog step HMC is MALA with step size
``eps^2 / 2`` (the package's MALA is itself tested against a NumPy reference in
``test_mala.py``); the leapfrog map is reversible and its energy error is of
second order in the step size; the chain's moments on a Gaussian match the
closed form; the DEER solve of a block equals the sequential scan of the same
tape for every Jacobian strategy and both gates.
"""

import functools
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose

from numpyro_deer.core import (
    HMC,
    MALA,
    DEERSolver,
    DiagonalJacobian,
    FullJacobian,
    HardGate,
    SigmoidGate,
    StochasticDiagonalJacobian,
    deer_solve,
    finish_chain,
    leapfrog,
    make_hmc_tape,
    make_sequential_step,
    make_step_fn,
    num_steps_for,
    sequential_chain,
)

D = 3
STEP_SIZE = 0.9
NUM_LEAPFROG = 4
HMC_JITTERED = HMC(num_steps=NUM_LEAPFROG, jitter=0.1)

_rng = np.random.default_rng(11)
_G = _rng.standard_normal((D, D))
PRECISION = jnp.asarray(_G @ _G.T / D + 0.5 * np.eye(D))
MU = jnp.asarray([0.5, -0.3, 0.2])


def potential(x):
    """Correlated quadratic plus a quartic: the Jacobian depends on ``x``."""
    r = x - MU
    return 0.5 * r @ PRECISION @ r + 0.025 * jnp.sum(x**4)


MASSES = {
    "identity": None,
    "diagonal": jnp.asarray([0.6, 1.0, 1.3]),
    # upper-triangular, as the package's dense L (core.metric)
    "dense": jnp.asarray([[0.9, 0.0, 0.0], [0.3, 1.1, 0.0], [-0.2, 0.4, 0.7]]).T,
}


# ------------------------------------------------------------------ the algebra
@pytest.mark.parametrize("mass", sorted(MASSES))
def test_one_leapfrog_step_is_mala_with_half_the_squared_step(mass):
    tape = MALA().make_tape(jax.random.PRNGKey(0), 32, D, jnp.float64)
    hmc_tape = make_hmc_tape(jax.random.PRNGKey(0), 32, D, jnp.float64)._replace(
        noise=tape.noise, log_u=tape.log_u
    )
    xs = MU + jax.random.normal(jax.random.PRNGKey(1), (32, D), jnp.float64)
    m = MASSES[mass]
    eps = 1.2  # large, so that some proposals are rejected
    hmc = jax.vmap(make_step_fn(HMC(num_steps=1), potential, eps, m))(xs, hmc_tape)
    mala = jax.vmap(make_step_fn(MALA(), potential, eps**2 / 2, m))(xs, tape)
    assert_allclose(hmc[0], mala[0], rtol=0, atol=1e-12)
    assert_allclose(hmc[1].accept_prob, mala[1].accept_prob, rtol=1e-9, atol=1e-12)
    assert 0 < int(jnp.sum(hmc[1].accepted)) < 32  # both branches are exercised


def test_leapfrog_is_reversible_and_its_energy_error_is_second_order():
    x = MU + jnp.asarray([1.0, -0.5, 0.8])
    r = jnp.asarray([0.3, 1.2, -0.7])
    m = MASSES["dense"]

    def energy(x, r):
        return potential(x) + 0.5 * jnp.sum(r**2)

    def run(x, r, eps, n):
        return leapfrog(potential, x, jax.grad(potential)(x), r, eps, n, m)

    y, _, grad_y, r_end = run(x, r, 0.1, 10)
    back, _, _, r_back = leapfrog(potential, y, grad_y, -r_end, 0.1, 10, m)
    assert_allclose(back, x, atol=1e-12)
    assert_allclose(-r_back, r, atol=1e-12)
    # the same trajectory length with half the step: the error falls ~4x
    errors = [
        abs(energy(*run(x, r, eps, n)[::3]) - energy(x, r))
        for eps, n in ((0.1, 10), (0.05, 20))
    ]
    assert 3.0 < errors[0] / errors[1] < 5.0


def _loops(fun, *args) -> int:
    """``while`` loops in the lowered program of ``fun``."""
    return jax.jit(fun).lower(*args).as_text().count("stablehlo.while")


def test_unrolled_leapfrog_is_the_loop_written_out():
    """``unroll=True`` writes a fixed count's steps out (no loop left in the
    program) and computes the same trajectory; a traced count stays a loop."""
    x = MU + jnp.asarray([1.0, -0.5, 0.8])
    r = jnp.asarray([0.3, 1.2, -0.7])
    m = MASSES["dense"]

    def run(n, unroll):
        return lambda x, r: leapfrog(
            potential, x, jax.grad(potential)(x), r, 0.1, n, m, unroll
        )

    looped, unrolled = run(7, False), run(7, True)
    assert _loops(looped, x, r) == 1
    assert _loops(unrolled, x, r) == 0
    for a, b in zip(jax.jit(looped)(x, r), jax.jit(unrolled)(x, r), strict=True):
        assert_allclose(b, a, rtol=1e-13, atol=1e-13)
    assert _loops(lambda x, r, n: run(n, True)(x, r), x, r, 7) == 1


def test_tape_jitter_range_and_error():
    tape = HMC(jitter=0.2).make_tape(jax.random.PRNGKey(0), 500, D, jnp.float64)
    assert tape.noise.shape == (500, D) and tape.log_u.shape == (500,)
    assert 0.8 <= float(tape.step_scale.min()) < 0.82
    assert 1.18 < float(tape.step_scale.max()) <= 1.2
    plain = HMC().make_tape(jax.random.PRNGKey(0), 5, D, jnp.float64)
    assert np.all(np.asarray(plain.step_scale) == 1.0)
    with pytest.raises(ValueError, match=r"HMC\(jitter=1\.0\): the step size jitter"):
        HMC(jitter=1.0)
    with pytest.raises(ValueError, match=r"HMC\(num_steps=0\): use an integer"):
        HMC(num_steps=0)


@pytest.mark.parametrize("gate", [HardGate(), SigmoidGate()])
def test_nonfinite_trajectory_is_a_diverging_rejection(gate):
    def cliff(x):  # NaN beyond x[0] = 2: every trajectory that gets there fails
        return jnp.where(x[0] < 2.0, potential(x), jnp.nan)

    x = jnp.asarray([1.9, 0.0, 0.0])
    tape = make_hmc_tape(jax.random.PRNGKey(0), 1, D, jnp.float64)
    tape_t = jax.tree.map(lambda a: a[0], tape)._replace(
        noise=jnp.asarray([5.0, 0.0, 0.0]), log_u=jnp.asarray(-50.0)
    )
    step = make_step_fn(HMC(NUM_LEAPFROG), cliff, STEP_SIZE, None, gate)
    (x_new, info), (dx, _) = jax.jvp(lambda s: step(s, tape_t), (x,), (jnp.ones(D),))
    assert bool(info.diverging) and not bool(info.accepted)
    assert float(info.accept_prob) == 0.0
    assert_allclose(x_new, x)
    assert_allclose(dx, jnp.ones(D))  # the tangent of staying put


# --------------------------------------------------------------------- chains
@functools.cache
def _chain_setup(num_steps=64):
    x0 = jnp.asarray([1.5, -1.0, 0.5])
    tape = HMC_JITTERED.make_tape(jax.random.PRNGKey(5), num_steps, D, jnp.float64)
    states, infos = jax.jit(
        lambda x0, tape: sequential_chain(
            HMC_JITTERED, potential, x0, tape, STEP_SIZE, MASSES["diagonal"]
        )
    )(x0, tape)
    return x0, tape, states, infos


def test_reference_chain_accepts_and_rejects():
    _, _, _, infos = _chain_setup()
    accepted = int(jnp.sum(infos.accepted))
    assert 20 < accepted < 60


STRATEGIES = {
    "full": FullJacobian(),
    "diag": DiagonalJacobian(),
    "stochastic": StochasticDiagonalJacobian(),
}
GATES = {"hard": HardGate(), "sigmoid": SigmoidGate()}


# every strategy once and both gates (the gate makes the step function, the
# strategy linearises whatever step function it is given): 3 solves, not 6
@pytest.mark.parametrize(
    ("strategy_name", "gate_name"),
    [("diag", "hard"), ("full", "sigmoid"), ("stochastic", "hard")],
)
def test_deer_block_equals_sequential(strategy_name, gate_name):
    x0, tape, states, infos = _chain_setup()
    m = MASSES["diagonal"]
    gate = GATES[gate_name]
    # with the full Jacobian the leapfrog steps are written out, in the solve
    # and in its sequential reference alike (the same tape, the same step)
    hmc = replace(HMC_JITTERED, unroll=strategy_name == "full")
    step_fn = make_step_fn(hmc, potential, STEP_SIZE, m, gate)
    sequential = make_sequential_step(hmc, potential, STEP_SIZE, m, gate)
    # tolerances well below the 1e-8 the test asserts
    solver = DEERSolver(
        STRATEGIES[strategy_name], atol=1e-11, rtol=1e-10, max_iter=64, sweep=4
    )
    got, got_infos, info = jax.jit(
        lambda x0, tape, key: deer_solve(
            step_fn, x0, tape, key, solver, None, sequential
        )
    )(x0, tape, jax.random.PRNGKey(9))
    assert bool(info.converged), info
    assert int(info.iterations) < 64
    assert_allclose(got, states, rtol=0, atol=1e-8)
    assert_allclose(got_infos.accept_prob, infos.accept_prob, atol=1e-8)
    assert np.array_equal(np.asarray(got_infos.accepted), np.asarray(infos.accepted))


@pytest.mark.parametrize("start", [0, 17, 64])
def test_finish_chain_keeps_the_head_and_completes_the_chain(start):
    x0, tape, states, infos = _chain_setup()
    garbage = jnp.full_like(states, 7.0)
    head = jnp.where(jnp.arange(64)[:, None] < start, states, garbage)
    got, got_infos = finish_chain(
        HMC_JITTERED,
        potential,
        x0,
        tape,
        STEP_SIZE,
        head,
        infos,
        start,
        MASSES["diagonal"],
    )
    assert_allclose(got, states, atol=1e-12)
    assert_allclose(got_infos.potential_energy, infos.potential_energy, atol=1e-12)


def test_stationary_moments_of_a_correlated_gaussian():
    """Mean and covariance of 20,000 transitions against the closed form.

    Target N(mu, Sigma) with correlation 0.9 and scales (1, 2); L = 5 steps of
    0.3 with jitter 0.2. The tolerances are about 5 Monte Carlo standard
    errors of this run length (the chain's autocorrelation is small).
    """
    mu = jnp.asarray([1.0, -2.0])
    cov = jnp.asarray([[1.0, 1.8], [1.8, 4.0]])
    prec = jnp.linalg.inv(cov)

    def gauss(x):
        return 0.5 * (x - mu) @ prec @ (x - mu)

    hmc = HMC(num_steps=5, jitter=0.2)
    tape = hmc.make_tape(jax.random.PRNGKey(42), 20_000, 2, jnp.float64)
    states, infos = jax.jit(lambda tape: sequential_chain(hmc, gauss, mu, tape, 0.3))(
        tape
    )
    states = np.asarray(states)
    assert 0.6 < float(jnp.mean(infos.accept_prob)) < 1.0
    assert_allclose(states.mean(0), mu, atol=0.1)
    assert_allclose(np.cov(states.T), cov, atol=0.25, rtol=0.05)


def test_num_steps_for_a_quarter_period():
    eps = jnp.asarray([0.5, 0.3, 0.1, 10.0, 1e-4, jnp.nan, jnp.inf])
    steps = np.asarray(num_steps_for(eps))
    np.testing.assert_array_equal(steps, [4, 6, 16, 1, 32, 32, 1])
    assert steps.dtype == np.int32
    assert int(num_steps_for(0.3, trajectory=3.0, max_steps=8)) == 8
    assert int(num_steps_for(0.5, min_steps=5)) == 5
