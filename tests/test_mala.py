"""The taped MALA step against an independent NumPy implementation.

The reference below writes the MALA transition from its definition: the
proposal ``y = x - eps M grad U(x) + sqrt(2 eps) L xi`` (``M = L L^T``) and the
log acceptance ratio with both Gaussian proposal densities evaluated by
``scipy.stats.multivariate_normal`` (covariance ``2 eps M``), so it shares no
algebraic shortcut with the package (which uses ``log q(y | x) = -|xi|^2 / 2``).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy.stats import multivariate_normal

from numpyro_deer.core import (
    MALA,
    HardGate,
    MALATape,
    SigmoidGate,
    finish_chain,
    make_step_fn,
    make_tape,
    sequential_chain,
)

D = 4
N = 64  # steps checked per configuration
STEP_SIZE = 0.25
HARD = HardGate()

# A non-Gaussian target: correlated quadratic plus a quartic term, so the
# Hessian (and hence the Jacobian of the step) depends on x.
_rng = np.random.default_rng(20240601)
_G = _rng.standard_normal((D, D))
PRECISION = _G @ _G.T / D + 0.5 * np.eye(D)
MU = np.array([0.5, -0.3, 0.2, 0.1])
QUARTIC = 0.1


def potential_np(x):
    r = x - MU
    return 0.5 * r @ PRECISION @ r + 0.25 * QUARTIC * np.sum(x**4)


def grad_np(x):
    return PRECISION @ (x - MU) + QUARTIC * x**3


def hessian_np(x):
    return PRECISION + 3.0 * QUARTIC * np.diag(x**2)


def potential_jnp(x):
    r = x - jnp.asarray(MU)
    return 0.5 * r @ jnp.asarray(PRECISION) @ r + 0.25 * QUARTIC * jnp.sum(x**4)


MASSES = {
    "identity": None,
    "diagonal": np.array([0.5, 1.0, 1.5, 0.8]),
    # upper-triangular, as the package's dense L (core.metric)
    "dense": np.array(
        [
            [0.9, 0.0, 0.0, 0.0],
            [0.3, 1.1, 0.0, 0.0],
            [-0.2, 0.4, 0.7, 0.0],
            [0.1, -0.3, 0.2, 1.2],
        ]
    ).T,
}


def sqrt_matrix(mass_sqrt):
    if mass_sqrt is None:
        return np.eye(D)
    if mass_sqrt.ndim == 1:
        return np.diag(mass_sqrt)
    return mass_sqrt


def proposal_np(x, xi, eps, L):
    M = L @ L.T
    return x - eps * M @ grad_np(x) + np.sqrt(2 * eps) * L @ xi


def log_accept_ratio_np(x, xi, eps, L):
    M = L @ L.T
    cov = 2 * eps * M
    y = proposal_np(x, xi, eps, L)
    log_q_forward = multivariate_normal.logpdf(y, x - eps * M @ grad_np(x), cov)
    log_q_reverse = multivariate_normal.logpdf(x, y - eps * M @ grad_np(y), cov)
    return potential_np(x) - potential_np(y) + log_q_reverse - log_q_forward


def mala_step_np(x, xi, log_u, eps, L):
    """``(x_new, log_a, accepted, y)`` of one MALA step, from the definition."""
    y = proposal_np(x, xi, eps, L)
    log_a = log_accept_ratio_np(x, xi, eps, L)
    accepted = log_u < log_a
    return (y if accepted else x), log_a, accepted, y


@pytest.fixture(scope="module")
def batch():
    """``N`` start points and tape entries (independent steps, not a chain)."""
    rng = np.random.default_rng(7)
    xs = MU + rng.standard_normal((N, D))
    tape = _make_tape(jax.random.PRNGKey(3), N, D, jnp.float64)
    return xs, tape


@functools.cache
def _batched_step(mass, gate=HARD):
    """The jitted, vmapped step for a mass in ``MASSES`` (built once)."""
    m = None if MASSES[mass] is None else jnp.asarray(MASSES[mass])
    return jax.jit(jax.vmap(make_step_fn(MALA(), potential_jnp, STEP_SIZE, m, gate)))


_make_tape = jax.jit(make_tape, static_argnums=(1, 2, 3))


def _reference(xs, tape, mass_sqrt, eps=STEP_SIZE):
    L = sqrt_matrix(mass_sqrt)
    noise, log_u = np.asarray(tape.noise), np.asarray(tape.log_u)
    rows = [mala_step_np(xs[i], noise[i], log_u[i], eps, L) for i in range(len(xs))]
    x_new = np.stack([r[0] for r in rows])
    log_a = np.array([r[1] for r in rows])
    accepted = np.array([r[2] for r in rows])
    y = np.stack([r[3] for r in rows])
    return x_new, log_a, accepted, y


# ------------------------------------------------------------------------- tape
def test_make_tape_shapes_dtypes_and_determinism():
    tape = _make_tape(jax.random.PRNGKey(0), N, D, jnp.float64)
    assert isinstance(tape, MALATape)
    assert tape.noise.shape == (N, D) and tape.noise.dtype == jnp.float64
    assert tape.log_u.shape == (N,) and tape.log_u.dtype == jnp.float64
    assert np.all(np.asarray(tape.log_u) <= 0.0)
    again = _make_tape(jax.random.PRNGKey(0), N, D, jnp.float64)
    assert_array_equal(np.asarray(again.noise), np.asarray(tape.noise))
    assert_array_equal(np.asarray(again.log_u), np.asarray(tape.log_u))
    other = _make_tape(jax.random.PRNGKey(1), N, D, jnp.float64)
    assert not np.allclose(np.asarray(other.noise), np.asarray(tape.noise))
    # the entries are distinct per step (one key per step), not repeated
    assert len(np.unique(np.asarray(tape.log_u))) == N
    assert np.min(np.abs(np.diff(np.asarray(tape.noise), axis=0))) > 0


# --------------------------------------------------------------- step vs numpy
@pytest.mark.parametrize("mass", list(MASSES))
def test_step_matches_numpy_mala(batch, mass):
    xs, tape = batch
    mass_sqrt = MASSES[mass]
    x_new, info = _batched_step(mass)(jnp.asarray(xs), tape)
    ref_x, ref_log_a, ref_accepted, _ = _reference(xs, tape, mass_sqrt)

    # no decision within rounding of its threshold (else the test is fragile)
    assert np.min(np.abs(ref_log_a - np.asarray(tape.log_u))) > 1e-6
    # both branches of the step are exercised
    assert 0.2 * N < ref_accepted.sum() < 0.9 * N

    assert_array_equal(np.asarray(info.accepted), ref_accepted)
    assert_allclose(np.asarray(x_new), ref_x, rtol=1e-12, atol=1e-12)
    # rejected steps return the start point bit for bit
    assert_array_equal(np.asarray(x_new)[~ref_accepted], xs[~ref_accepted])
    assert_allclose(
        np.asarray(info.accept_prob),
        np.exp(np.minimum(ref_log_a, 0.0)),
        rtol=1e-9,
        atol=1e-12,
    )
    expected_energy = np.array([potential_np(x) for x in ref_x])
    assert_allclose(np.asarray(info.potential_energy), expected_energy, rtol=1e-12)
    assert not np.any(np.asarray(info.diverging))


@pytest.mark.parametrize("mass", ["identity", "dense"])
def test_sequential_chain_matches_numpy_chain(mass):
    mass_sqrt = MASSES[mass]
    T = 40
    tape = _make_tape(jax.random.PRNGKey(5), T, D, jnp.float64)
    x0 = np.array([1.0, -1.0, 0.5, 2.0])
    m = None if mass_sqrt is None else jnp.asarray(mass_sqrt)
    states, infos = sequential_chain(
        MALA(), potential_jnp, jnp.asarray(x0), tape, 0.25, m
    )
    assert states.shape == (T, D)
    assert infos.accepted.shape == (T,)

    L = sqrt_matrix(mass_sqrt)
    x = x0
    noise, log_u = np.asarray(tape.noise), np.asarray(tape.log_u)
    ref_states, ref_accepted = [], []
    for t in range(T):
        x, _, accepted, _ = mala_step_np(x, noise[t], log_u[t], 0.25, L)
        ref_states.append(x)
        ref_accepted.append(accepted)
    ref_accepted = np.array(ref_accepted)
    assert 0 < ref_accepted.sum() < T
    assert_array_equal(np.asarray(infos.accepted), ref_accepted)
    assert_allclose(np.asarray(states), np.stack(ref_states), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("start", [0, 1, 17, 39, 40])
def test_finish_chain_keeps_the_head_and_completes_the_chain(start):
    """Finishing from step ``start`` keeps ``states[:start]`` untouched and
    computes the rest as the sequential chain from ``states[start - 1]``."""
    T = 40
    tape = _make_tape(jax.random.PRNGKey(6), T, D, jnp.float64)
    x0 = jnp.asarray([1.0, -1.0, 0.5, 2.0])
    ref_states, ref_infos = sequential_chain(MALA(), potential_jnp, x0, tape, 0.25)
    # a head that is the chain, and a tail that is not (as after a partial solve)
    states = ref_states.at[start:].set(7.0)
    infos = jax.tree.map(
        lambda a: a.at[start:].set(jnp.zeros_like(a[start:])), ref_infos
    )
    done, done_infos = finish_chain(
        MALA(), potential_jnp, x0, tape, 0.25, states, infos, jnp.asarray(start)
    )
    assert_array_equal(np.asarray(done[:start]), np.asarray(ref_states[:start]))
    assert_allclose(np.asarray(done), np.asarray(ref_states), rtol=1e-12, atol=1e-12)
    assert_array_equal(np.asarray(done_infos.accepted), np.asarray(ref_infos.accepted))
    assert_allclose(
        np.asarray(done_infos.potential_energy),
        np.asarray(ref_infos.potential_energy),
        rtol=1e-12,
    )


# ------------------------------------------------------------------- divergence
def box_potential(fill):
    """Standard normal inside ``|x_i| < 1``, ``fill`` (inf or nan) outside."""

    def potential(x):
        inside = jnp.all(jnp.abs(x) < 1.0)
        return jnp.where(inside, 0.5 * jnp.sum(x**2), fill)

    return potential


@pytest.mark.parametrize("fill", [jnp.inf, jnp.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("gate", [HardGate(), SigmoidGate(0.5)], ids=["hard", "sig"])
def test_nonfinite_proposal_is_a_diverging_rejection(fill, gate):
    eps = 0.5
    rng = np.random.default_rng(1)
    xs = rng.uniform(-0.6, 0.6, (N, D))
    tape = _make_tape(jax.random.PRNGKey(8), N, D, jnp.float64)
    potential = box_potential(fill)
    step_fn = make_step_fn(MALA(), potential, eps, gate=gate)
    x_new, info = jax.jit(jax.vmap(step_fn))(jnp.asarray(xs), tape)
    x_new = np.asarray(x_new)
    diverging = np.asarray(info.diverging)

    # inside the box U = |x|^2 / 2, so the proposal is known in closed form
    ys = xs - eps * xs + np.sqrt(2 * eps) * np.asarray(tape.noise)
    outside = np.any(np.abs(ys) >= 1.0, axis=1)
    assert 5 <= outside.sum() <= N - 5  # both kinds of step occur
    assert_array_equal(diverging, outside)

    assert not np.any(np.asarray(info.accepted)[diverging])
    assert_array_equal(np.asarray(info.accept_prob)[diverging], 0.0)
    assert_array_equal(x_new[diverging], xs[diverging])
    assert_allclose(
        np.asarray(info.potential_energy)[diverging],
        0.5 * np.sum(xs[diverging] ** 2, axis=1),
        rtol=1e-14,
    )
    # the finite proposals are treated as ordinary MALA steps
    assert np.all(np.isfinite(np.asarray(info.accept_prob)))
    assert np.asarray(info.accepted)[~diverging].sum() > 0

    # the derivative of a diverging rejection is the identity and finite
    # (no 0 * inf or 0 * nan leaking from the proposal into the tangent)
    v = rng.standard_normal((N, D))

    def jvp_one(x, tape_t, d):
        return jax.jvp(lambda s: step_fn(s, tape_t), (x,), (d,))

    _, (tangent, _) = jax.jit(jax.vmap(jvp_one))(jnp.asarray(xs), tape, jnp.asarray(v))
    tangent = np.asarray(tangent)
    assert np.all(np.isfinite(tangent))
    assert_array_equal(tangent[diverging], v[diverging])


# ------------------------------------------------------------------------ gates
@pytest.mark.parametrize("temperature", [0.05, 1.0, 20.0])
def test_forward_value_does_not_depend_on_gate(batch, temperature):
    xs, tape = batch
    hard = _batched_step("dense", HardGate())(jnp.asarray(xs), tape)
    soft = _batched_step("dense", SigmoidGate(temperature))(jnp.asarray(xs), tape)
    for h, s in zip(jax.tree.leaves(hard), jax.tree.leaves(soft), strict=True):
        assert_array_equal(np.asarray(s), np.asarray(h))
    assert 0 < np.asarray(hard[1].accepted).sum() < N


@functools.cache
def _jvp_fn(mass, gate):
    """Jitted ``(xs, tape, v) -> (f(xs), J v)`` over a batch (built once)."""
    m = None if MASSES[mass] is None else jnp.asarray(MASSES[mass])
    step_fn = make_step_fn(MALA(), potential_jnp, STEP_SIZE, m, gate)

    def one(x, tape_t, d):
        (x_new, _), (dx_new, _) = jax.jvp(lambda s: step_fn(s, tape_t), (x,), (d,))
        return x_new, dx_new

    return jax.jit(jax.vmap(one))


def _jvp_batch(mass, gate, xs, tape, v):
    return _jvp_fn(mass, gate)(jnp.asarray(xs), tape, jnp.asarray(v))


def _central_difference(fn, x, v, h):
    return (fn(x + h * v) - fn(x - h * v)) / (2 * h)


@pytest.mark.parametrize("mass", ["identity", "dense"])
def test_hard_gate_jvp_is_proposal_or_identity(batch, mass):
    xs, tape = batch
    mass_sqrt = MASSES[mass]
    L = sqrt_matrix(mass_sqrt)
    M = L @ L.T
    v = np.random.default_rng(2).standard_normal((N, D))
    _, tangent = _jvp_batch(mass, HardGate(), xs, tape, v)
    tangent = np.asarray(tangent)
    _, log_a, accepted, _ = _reference(xs, tape, mass_sqrt)
    noise, log_u = np.asarray(tape.noise), np.asarray(tape.log_u)

    h = 1e-6
    checked = 0
    for i in range(N):
        # dy = (I - eps M H(x)) v, the derivative of the proposal
        dy = v[i] - STEP_SIZE * M @ hessian_np(xs[i]) @ v[i]
        expected = dy if accepted[i] else v[i]
        assert_allclose(tangent[i], expected, rtol=1e-10, atol=1e-12)
        if not accepted[i]:
            assert_array_equal(tangent[i], v[i])

        # finite differences of the whole step, away from the threshold
        if abs(log_a[i] - log_u[i]) < 1e-3:
            continue

        def step(x, i=i):
            return mala_step_np(x, noise[i], log_u[i], STEP_SIZE, L)[0]

        for sign in (1.0, -1.0):  # the decision is the same on both sides
            assert mala_step_np(
                xs[i] + sign * h * v[i], noise[i], log_u[i], STEP_SIZE, L
            )[2] == bool(accepted[i])
        fd = _central_difference(step, xs[i], v[i], h)
        assert_allclose(tangent[i], fd, rtol=1e-6, atol=1e-7)
        checked += 1
    assert checked >= N - 2
    # an accepted step's tangent is not the identity (the test discriminates)
    assert np.max(np.abs(tangent[accepted] - v[accepted])) > 1e-2
    assert 0 < accepted.sum() < N


def test_sigmoid_gate_jvp_is_straight_through(batch):
    xs, tape = batch
    mass_sqrt = MASSES["dense"]
    L = sqrt_matrix(mass_sqrt)
    M = L @ L.T
    temperature = 2.0
    v = np.random.default_rng(4).standard_normal((N, D))
    x_new, tangent = _jvp_batch("dense", SigmoidGate(temperature), xs, tape, v)
    _, hard_tangent = _jvp_batch("dense", HardGate(), xs, tape, v)
    ref_x, log_a, accepted, ys = _reference(xs, tape, mass_sqrt)
    noise, log_u = np.asarray(tape.noise), np.asarray(tape.log_u)
    assert_allclose(np.asarray(x_new), ref_x, rtol=1e-12, atol=1e-12)

    for i in range(N):
        s = 1.0 / (1.0 + np.exp(-(log_a[i] - log_u[i]) / temperature))
        d_log_a = _central_difference(
            lambda x, i=i: log_accept_ratio_np(x, noise[i], STEP_SIZE, L),
            xs[i],
            v[i],
            1e-6,
        )
        dy = v[i] - STEP_SIZE * M @ hessian_np(xs[i]) @ v[i]
        ds = s * (1 - s) / temperature * d_log_a
        expected = s * dy + (1 - s) * v[i] + (ys[i] - xs[i]) * ds
        assert_allclose(np.asarray(tangent)[i], expected, rtol=1e-6, atol=1e-7)
    # the sigmoid tangent is a different linearisation than the hard one
    assert np.max(np.abs(np.asarray(tangent) - np.asarray(hard_tangent))) > 1e-2


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_sigmoid_gate_rejects_nonpositive_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        SigmoidGate(temperature)


def test_sigmoid_gate_accepts_positive_temperature():
    assert SigmoidGate(1e-3).temperature == 1e-3
    assert SigmoidGate().temperature > 0
