"""The DEER Newton solver against the sequential MALA chain.

Given the same tape, DEER and :func:`sequential_chain` compute the same chain
(DESIGN.md section 2). Every pair of target and Jacobian strategy is solved,
with each strategy and each target under both gates (``COMBOS``), once per
module (``solved`` fixture); each test reads the cached result, so each jitted
solve is compiled exactly once.

Solver tolerances: a step passes when ``|r_t| <= ATOL + RTOL |F_t|`` with
``r_t = s_t - F_t``; since ``|F_t| <= |s_t| + |r_t|``, every certified residual
obeys ``|r_t| <= (ATOL + RTOL max|s|) / (1 - RTOL)`` (``residual_bound``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from numpyro_deer.core import (
    MALA,
    RESULTS,
    AutoJacobian,
    DEERSolver,
    DiagonalJacobian,
    FullJacobian,
    HardGate,
    SigmoidGate,
    StochasticDiagonalJacobian,
    deer_solve,
    make_step_fn,
    make_tape,
    newton_iterates,
    scan_sequential,
    sequential_chain,
)
from numpyro_deer.core.newton import newton_pilot

B = 256
ATOL, RTOL = 1e-12, 1e-10
# The front advances by at least one step per iteration after the first, so
# B + 1 iterations always suffice; MAX_ITER leaves room above that.
MAX_ITER = 2 * B
MATCH = dict(rtol=0.0, atol=1e-8)  # DEER block vs sequential block

STRATEGIES = {
    "full": FullJacobian(clip=None),
    "diag": DiagonalJacobian(clip=None),
    "stoch2": StochasticDiagonalJacobian(num_probes=2),
}
GATES = {"hard": HardGate(), "sigmoid": SigmoidGate(1.0)}

# Most of this module's time is XLA compiling the solves on the CPU backend.
# The LLVM optimisation level changes how fast the compiled code runs, not what
# it computes, and these small problems run in milliseconds either way, so the
# module compiles at level 0 (about half the compile time).
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


# XLA's default CPU fusion emitters, where the test session turned them off
# (conftest, jaxlib 0.10; later jaxlibs know no such option)
_DEFAULT_EMITTERS = (
    {"xla_cpu_use_fusion_emitters": True}
    if "xla_cpu_use_fusion_emitters" in os.environ.get("XLA_FLAGS", "")
    else {}
)


def _jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=_COMPILER_OPTIONS, **kwargs)


# ----------------------------------------------------------------------- targets
def _standard_normal():
    def potential(x):
        return 0.5 * jnp.sum(x**2)

    return potential, None


def _correlated_gaussian():
    """D = 10, precision eigenvalues 1..100 (condition number 100), rotated."""
    rng = np.random.default_rng(101)
    Q, _ = np.linalg.qr(rng.standard_normal((10, 10)))
    precision = Q @ np.diag(np.logspace(0.0, 2.0, 10)) @ Q.T
    P = jnp.asarray(precision)

    def potential(x):
        return 0.5 * x @ P @ x

    return potential, precision


def _logistic_regression():
    """D = 6, N = 100 synthetic points, standard normal prior on the weights."""
    rng = np.random.default_rng(202)
    X = rng.standard_normal((100, 6))
    w_true = rng.standard_normal(6)
    y = (rng.uniform(size=100) < 1.0 / (1.0 + np.exp(-X @ w_true))).astype(float)
    X, y = jnp.asarray(X), jnp.asarray(y)

    def potential(w):
        logits = X @ w
        log_lik = jnp.sum(y * logits - jax.nn.softplus(logits))
        return -log_lik + 0.5 * jnp.sum(w**2)

    return potential, None


@dataclass(frozen=True)
class Target:
    name: str
    potential: object
    dim: int
    step_size: float
    x0: np.ndarray
    tape: object
    seq_states: np.ndarray
    seq_info: object
    extra: object = None

    @property
    def prev(self):
        """``s_0 .. s_{T-1}`` of the sequential chain."""
        return np.concatenate([self.x0[None], self.seq_states[:-1]])

    def step_fn(self, gate_name="hard"):
        return make_step_fn(
            MALA(), self.potential, self.step_size, gate=GATES[gate_name]
        )


# step sizes chosen for an acceptance rate of about 0.8 (asserted below)
_TARGET_SPECS = {
    "std_normal": (_standard_normal, 5, 0.5),
    "corr_gauss": (_correlated_gaussian, 10, 0.01),
    "logreg": (_logistic_regression, 6, 0.04),
}


def _build_target(name, seed):
    make, dim, step_size = _TARGET_SPECS[name]
    potential, extra = make()
    x0 = 0.5 * np.random.default_rng(seed).standard_normal(dim)
    tape = make_tape(jax.random.PRNGKey(seed), B, dim, jnp.float64)
    seq = _jit(functools.partial(sequential_chain, MALA()), static_argnums=0)
    states, info = seq(potential, jnp.asarray(x0), tape, step_size)
    return Target(
        name,
        potential,
        dim,
        step_size,
        x0,
        tape,
        np.asarray(states),
        jax.tree.map(np.asarray, info),
        extra,
    )


@pytest.fixture(scope="module")
def targets():
    return {
        name: _build_target(name, seed)
        for seed, name in enumerate(_TARGET_SPECS, start=10)
    }


def _jitted_solve(step_fn, solver):
    return _jit(lambda x0, tape, key: deer_solve(step_fn, x0, tape, key, solver))


def _run(fn, target, key=0):
    states, aux, info = fn(jnp.asarray(target.x0), target.tape, jax.random.PRNGKey(key))
    return np.asarray(states), jax.tree.map(np.asarray, aux), info


def _solver(strategy, **options):
    # no sweep unless a test asks for one (then from the first iteration): the
    # tests count plain Newton iterations
    defaults = {"max_iter": MAX_ITER, "sweep": 0, "sweep_after": 0}
    options = {"atol": ATOL, "rtol": RTOL, **defaults, **options}
    return DEERSolver(strategy, **options)


@pytest.fixture(scope="module")
def solved(targets):
    """``(target, strategy, gate) -> (states, aux, info)``, each solved once."""

    @functools.cache
    def get(target_name, strategy_name, gate_name):
        target = targets[target_name]
        step_fn = target.step_fn(gate_name)
        fn = _jitted_solve(step_fn, _solver(STRATEGIES[strategy_name], max_solves=1))
        return _run(fn, target)

    return get


@pytest.fixture(scope="module")
def logreg_solved(targets):
    """``solver -> (states, aux, info)``: the logistic regression target's
    block (hard gate), each solver's solve compiled and run once."""

    @functools.cache
    def get(solver):
        target = targets["logreg"]
        return _run(_jitted_solve(target.step_fn(), solver), target)

    return get


def residual_bound(states):
    return (ATOL + RTOL * np.max(np.abs(states))) / (1.0 - RTOL)


@functools.cache
def _step_values_fn(potential, step_size):
    return _jit(jax.vmap(make_step_fn(MALA(), potential, step_size)))


def step_values(target, states):
    """``f_t(s_{t-1})`` for all ``t`` of a block ``states`` (from ``target.x0``)."""
    prev = np.concatenate([target.x0[None], states[:-1]])
    values, _ = _step_values_fn(target.potential, target.step_size)(
        jnp.asarray(prev), target.tape
    )
    return np.asarray(values)


# every target with every strategy, and every strategy and every target with
# both gates (the gates alternate along the table: 9 solves, not all 18)
COMBOS = [
    pytest.param(t, s, g, id=f"{t}-{s}-{g}")
    for i, t in enumerate(_TARGET_SPECS)
    for j, s in enumerate(STRATEGIES)
    for g in [list(GATES)[(i + j) % len(GATES)]]
]


# ------------------------------------------------------------- the three targets
@pytest.mark.parametrize("name", list(_TARGET_SPECS))
def test_target_chain_accepts_and_rejects(targets, name):
    info = targets[name].seq_info
    rate = info.accepted.mean()
    assert 0.5 <= rate <= 0.9, rate
    assert not np.any(info.diverging)
    assert np.all(np.isfinite(targets[name].seq_states))


def test_correlated_gaussian_has_condition_number_100(targets):
    precision = targets["corr_gauss"].extra
    assert_allclose(np.linalg.cond(precision), 100.0, rtol=1e-8)
    # the rotation is not trivial: the precision is far from diagonal
    off_diagonal = precision - np.diag(np.diag(precision))
    assert np.max(np.abs(off_diagonal)) > 5.0


# ------------------------------------------------------------ DEER == sequential
@pytest.mark.parametrize("target_name, strategy_name, gate_name", COMBOS)
def test_deer_block_equals_sequential(
    targets, solved, target_name, strategy_name, gate_name
):
    target = targets[target_name]
    states, aux, _ = solved(target_name, strategy_name, gate_name)
    seq = target.seq_info

    assert states.shape == (B, target.dim)
    assert_allclose(states, target.seq_states, **MATCH)
    assert_array_equal(aux.accepted, seq.accepted)
    assert 0 < aux.accepted.sum() < B  # at least one acceptance and rejection
    assert 0.5 <= aux.accepted.mean() <= 0.9
    assert not np.any(aux.diverging)
    assert_allclose(aux.potential_energy, seq.potential_energy, rtol=1e-8, atol=1e-8)
    assert_allclose(aux.accept_prob, seq.accept_prob, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("target_name, strategy_name, gate_name", COMBOS)
def test_deer_block_certificate(targets, solved, target_name, strategy_name, gate_name):
    target = targets[target_name]
    states, _, info = solved(target_name, strategy_name, gate_name)
    bound = residual_bound(states)

    assert bool(info.converged)
    assert int(info.front) == B
    assert int(info.result) != RESULTS.nonfinite
    assert int(info.solves) == 1
    assert 1 <= int(info.iterations) <= B + 1
    assert 0.0 <= float(info.residual) <= bound
    # the certificate holds for the returned block, recomputed independently
    true_residual = np.max(np.abs(states - step_values(target, states)))
    assert true_residual <= bound


# ------------------------------------------------------------------ exact prefix
PREFIX_K = 10


@pytest.mark.parametrize(
    "strategy_name, gate_name",
    [("full", "hard"), ("stoch2", "hard"), ("diag", "sigmoid")],
)
def test_first_k_states_exact_after_k_iterations(targets, strategy_name, gate_name):
    # Zero tolerances: a step only freezes when it is reproduced bit for bit,
    # so this is the exactness of Newton itself, not of the stopping rule.
    target = targets["logreg"]
    step_fn = target.step_fn(gate_name)
    solver = DEERSolver(STRATEGIES[strategy_name], atol=0.0, rtol=0.0, sweep=0)
    iterates = _jit(
        lambda x0, tape, key: newton_iterates(step_fn, x0, tape, key, PREFIX_K, solver)
    )(jnp.asarray(target.x0), target.tape, jax.random.PRNGKey(0))
    iterates = np.asarray(iterates)
    assert iterates.shape == (PREFIX_K, B, target.dim)

    for k in range(1, PREFIX_K + 1):
        assert_allclose(iterates[k - 1, :k], target.seq_states[:k], rtol=0, atol=1e-12)
    # not vacuous: after the first iteration the block is far from the chain
    assert np.max(np.abs(iterates[0] - target.seq_states)) > 1e-2


# -------------------------------------------------------------------- Hutchinson
def test_hutchinson_error_decreases_with_probes(targets):
    # The correlated Gaussian has a far-from-diagonal Jacobian; for a diagonal
    # one Hutchinson would be exact with any number of probes.
    target = targets["corr_gauss"]
    step_fn = target.step_fn()
    prev, tape = jnp.asarray(target.prev), target.tape
    key = jax.random.PRNGKey(42)

    strategies = {
        "exact": DiagonalJacobian(clip=None),
        "full": FullJacobian(clip=None),
        **{
            f"probes{p}": StochasticDiagonalJacobian(num_probes=p, clip=None)
            for p in (1, 8, 64)
        },
    }
    # one compiled program for all five linearisations, same states and key
    lins = _jit(
        lambda p, t, k: {
            name: s.linearize(step_fn, p, t, k) for name, s in strategies.items()
        }
    )(prev, tape, key)
    lins = jax.tree.map(np.asarray, lins)
    exact, full = lins["exact"], lins["full"]
    assert exact.jacobian.shape == (B, target.dim)
    assert full.jacobian.shape == (B, target.dim, target.dim)
    assert_allclose(
        exact.jacobian, np.diagonal(full.jacobian, axis1=1, axis2=2), atol=1e-14
    )
    # the step values are the chain itself (prev is the sequential chain)
    assert_allclose(exact.values, target.seq_states, rtol=0, atol=1e-12)
    assert_array_equal(exact.aux.accepted, target.seq_info.accepted)
    full_off_diagonal = full.jacobian - np.einsum(
        "ti,ij->tij", exact.jacobian, np.eye(target.dim)
    )
    assert np.max(np.abs(full_off_diagonal)) > 0.1

    errors = []
    for probes in (1, 8, 64):
        lin = lins[f"probes{probes}"]
        assert lin.jacobian.shape == (B, target.dim)
        assert_allclose(lin.values, exact.values, rtol=0, atol=1e-14)
        errors.append(np.mean(np.abs(lin.jacobian - exact.jacobian)))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] * 3.0 <= errors[0], errors


def test_linearizations_match_jacfwd(targets):
    # SigmoidGate adds the rank-one term (y - x) d(log a)^T, so the Jacobian is
    # not symmetric and a transposed or mis-ordered Jacobian would show.
    target = targets["logreg"]
    step_fn = target.step_fn("sigmoid")
    prev, tape = jnp.asarray(target.prev), target.tape
    key = jax.random.PRNGKey(0)

    def all_of_them(p, t, k):
        jac = jax.vmap(jax.jacfwd(lambda x, t_: step_fn(x, t_)[0]))(p, t)
        full = FullJacobian(clip=None).linearize(step_fn, p, t, k)
        diag = DiagonalJacobian(clip=None).linearize(step_fn, p, t, k)
        return jac, full, diag

    jac, full, diag = jax.tree.map(np.asarray, _jit(all_of_them)(prev, tape, key))
    assert np.max(np.abs(jac - np.swapaxes(jac, 1, 2))) > 1e-3
    assert_allclose(full.jacobian, jac, rtol=1e-12, atol=1e-14)
    assert_allclose(diag.jacobian, np.diagonal(jac, axis1=1, axis2=2), atol=1e-14)
    for lin in (full, diag):
        assert_allclose(lin.values, target.seq_states, rtol=0, atol=1e-12)
        assert_array_equal(lin.aux.accepted, target.seq_info.accepted)


def test_clipped_full_jacobian_is_bounded_and_still_exact(targets):
    # The correlated Gaussian's step Jacobians have spectral norm about 1
    # (identity on rejections, slow directions on acceptances): clip=0.5
    # rescales every one, clip=2 none. The clipped solve must still return the
    # sequential chain (the Jacobian changes the speed, never the answer).
    target = targets["corr_gauss"]
    step_fn = target.step_fn()
    prev, tape = jnp.asarray(target.prev), target.tape
    key = jax.random.PRNGKey(0)
    clipped = FullJacobian(clip=0.5)

    def three(p, t, k):
        return tuple(
            strategy.linearize(step_fn, p, t, k).jacobian
            for strategy in (FullJacobian(clip=None), clipped, FullJacobian(clip=2.0))
        )

    exact, scaled, loose = map(np.asarray, _jit(three)(prev, tape, key))
    norms = np.linalg.norm(exact, ord=2, axis=(1, 2))
    assert np.all((norms > 0.9) & (norms < 1.5))
    assert_allclose(loose, exact, rtol=1e-14)
    # power iteration: the norm to within 1 % (close singular values), so the
    # clipped norm is 0.5 to within 1 % and the scaling is per-matrix uniform
    clipped_norms = np.linalg.norm(scaled, ord=2, axis=(1, 2))
    assert_allclose(clipped_norms, 0.5, rtol=1e-2)
    ratio = np.sum(scaled * exact, axis=(1, 2)) / np.sum(exact**2, axis=(1, 2))
    assert_allclose(scaled, ratio[:, None, None] * exact, rtol=1e-12, atol=1e-14)

    solver = _solver(clipped)
    states, aux, info = _run(_jitted_solve(step_fn, solver), target)
    assert bool(info.converged)
    assert_allclose(states, target.seq_states, **MATCH)
    assert_array_equal(aux.accepted, target.seq_info.accepted)


def test_initial_guess_changes_iterations_not_the_chain(targets):
    # the sequential chain itself is the best guess: one iteration certifies it
    target = targets["logreg"]
    solver = _solver(DiagonalJacobian(clip=None))
    step_fn = target.step_fn()

    @_jit
    def solve(x0, tape, key, guess):
        return deer_solve(step_fn, x0, tape, key, solver, guess)

    x0, key = jnp.asarray(target.x0), jax.random.PRNGKey(3)
    repeat = jnp.broadcast_to(x0, target.seq_states.shape)
    for guess, expected_iterations in ((target.seq_states, 1), (repeat, None)):
        states, _, info = solve(x0, target.tape, key, jnp.asarray(guess))
        assert bool(info.converged)
        assert_allclose(states, target.seq_states, **MATCH)
        if expected_iterations is not None:
            assert int(info.iterations) == expected_iterations
        else:
            assert int(info.iterations) > 1


def test_solve_from_a_pilot_goes_on_as_the_solve(targets):
    # a pilot's iterations, then deer_solve from its iterate and count, are
    # the plain solve's: the probe keys and the sweep's hold-back go on from
    # the count, so the iterates, the chain and the iteration count are the
    # same; a pilot of 0 iterations takes none
    target = targets["logreg"]
    solver = _solver(
        StochasticDiagonalJacobian(num_probes=2), sweep=SWEEP, sweep_after=4
    )
    step_fn = target.step_fn()

    @_jit
    def solves(x0, tape, key):
        plain = deer_solve(step_fn, x0, tape, key, solver)
        pilot = newton_pilot(step_fn, x0, tape, key, solver, jnp.asarray(3))
        go_on = deer_solve(
            step_fn, x0, tape, key, solver, pilot.states[1:], None, pilot.iteration
        )
        none = newton_pilot(step_fn, x0, tape, key, solver, jnp.asarray(0))
        return plain, go_on, pilot.iteration, none.iteration

    plain, go_on, pilot_its, none_its = solves(
        jnp.asarray(target.x0), target.tape, jax.random.PRNGKey(5)
    )
    assert (int(pilot_its), int(none_its)) == (3, 0)
    assert bool(go_on[2].converged)
    assert int(go_on[2].iterations) == int(plain[2].iterations) > 3
    assert_allclose(go_on[0], plain[0], rtol=0.0, atol=1e-14)
    assert_allclose(go_on[0], target.seq_states, **MATCH)


# ------------------------------------------------------------------ restarts
def test_restarts_with_small_max_iter_still_converge(targets):
    target = targets["logreg"]
    solver = _solver(DiagonalJacobian(clip=None), max_iter=3, max_solves=B)
    states, aux, info = _run(_jitted_solve(target.step_fn(), solver), target)

    assert bool(info.converged)
    assert int(info.solves) > 1
    assert int(info.iterations) <= 3 * int(info.solves)
    assert int(info.result) != RESULTS.nonfinite
    assert_allclose(states, target.seq_states, **MATCH)
    assert_array_equal(aux.accepted, target.seq_info.accepted)
    assert float(info.residual) <= residual_bound(states)


def test_unfinished_block_reports_its_exact_prefix(targets, logreg_solved):
    target = targets["logreg"]
    solver = _solver(DiagonalJacobian(clip=None), max_iter=3, max_solves=1)
    states, _, info = logreg_solved(solver)

    assert not bool(info.converged)
    assert int(info.result) == RESULTS.max_iterations_reached
    assert "iteration limit" in RESULTS.message(info.result)
    assert int(info.iterations) == 3
    assert int(info.solves) == 1
    front = int(info.front)
    assert 2 <= front < B
    assert_allclose(states[:front], target.seq_states[:front], **MATCH)
    # the rest of the block is not the chain yet (so `converged` is honest)
    assert np.max(np.abs(states[front:] - target.seq_states[front:])) > 1e-6


# ------------------------------------------------------------------------ sweeps
SWEEP = 8


def test_sweep_starts_are_past_the_front_then_local_fronts():
    from numpyro_deer.core.sweep import sweep_starts

    # steps 0-2 pass (front 3), 3-4 fail, 5-6 pass, 7 fails, 8 passes, 9 fails
    passed = jnp.array([1, 1, 1, 0, 0, 1, 1, 0, 1, 0], bool)
    front = jnp.asarray(3, jnp.int32)
    later = sweep_starts(front, jnp.asarray(5), passed, 4)
    first = sweep_starts(front, jnp.asarray(0), passed, 4)
    # one past the front (step 3 already holds its exact F_t), then steps 7, 9
    assert_array_equal(np.asarray(later), [4, 7, 9, 10])
    # in the first iteration nothing was evaluated yet: start at the front
    assert_array_equal(np.asarray(first), [3, 7, 9, 10])


@pytest.mark.parametrize("passes", [5, 3])
def test_sweep_segments_are_sequential_and_stop_at_the_next_start(passes):
    # a traced step count: all 5 steps, or 3
    from numpyro_deer.core import plain_sequential_step
    from numpyro_deer.core.sweep import sweep_segments

    def step_fn(x, tape_t):  # s_t = 2 s_{t-1} + c_t
        return 2.0 * x + tape_t, None

    num_steps = 12
    tape = jnp.arange(1.0, num_steps + 1.0)[:, None]
    states = jnp.full((num_steps + 1, 1), -1.0).at[0].set(0.0)
    starts = jnp.array([0, 3, 11, num_steps])
    sequential = plain_sequential_step(step_fn)
    traced = jnp.asarray(passes)
    out = sweep_segments(sequential, states, tape, starts, num_steps, 5, traced)
    out = np.asarray(out)[:, 0]

    # the segments run side by side, each from the iterate's state at its start
    steps = passes
    before = np.asarray(states)[:, 0]
    expected = before.copy()
    for begin, stop in ((0, 3), (3, 3 + steps), (11, 12)):  # next start, length, end
        x = before[begin]
        for t in range(begin, stop):
            x = 2.0 * x + float(tape[t, 0])
            expected[t + 1] = x
    assert_array_equal(out, expected)
    assert out[3 + steps + 1] == -1.0  # past the second segment's steps: untouched


# the three-iteration solves of the logistic regression (plain, and swept from
# iteration 0, 1 or 3) are compiled and run once for the tests below and
# test_unfinished_block_reports_its_exact_prefix (logreg_solved)
def test_sweep_keeps_the_chain_and_moves_the_front_by_sweep_plus_one(
    targets, logreg_solved
):
    target = targets["logreg"]
    plain = _solver(DiagonalJacobian(clip=None), max_iter=3, max_solves=1)
    swept = _solver(DiagonalJacobian(clip=None), max_iter=3, max_solves=1, sweep=SWEEP)
    _, _, info_plain = logreg_solved(plain)
    states, _, info = logreg_solved(swept)

    # each iteration certifies the SWEEP steps past the exact first unfrozen one
    front = int(info.front)
    assert front >= 3 * (SWEEP + 1) - 1
    assert front > int(info_plain.front)
    assert_allclose(states[:front], target.seq_states[:front], **MATCH)


def test_sweep_after_holds_the_sweep_back(targets, logreg_solved):
    # sweep_after=3 with 3 iterations: no sweep, the plain solve's front;
    # sweep_after=1: two swept iterations, each moving the front by SWEEP + 1
    target = targets["logreg"]
    fronts = {}
    for after in (0, 1, 3):
        solver = _solver(
            DiagonalJacobian(clip=None),
            max_iter=3,
            max_solves=1,
            sweep=SWEEP,
            sweep_after=after,
        )
        states, _, info = logreg_solved(solver)
        fronts[after] = int(info.front)
        assert_allclose(
            states[: fronts[after]], target.seq_states[: fronts[after]], **MATCH
        )
    plain = _solver(DiagonalJacobian(clip=None), max_iter=3, max_solves=1)
    assert fronts[3] == int(logreg_solved(plain)[2].front)
    assert fronts[1] >= 2 * (SWEEP + 1)
    assert fronts[0] > fronts[1] > fronts[3]


def test_vmapped_solves_with_a_held_back_sweep_are_each_chain(targets):
    # chains solved together: the sweep's step count is traced and differs
    # between the chains
    target = targets["corr_gauss"]
    solver = _solver(DiagonalJacobian(clip=None), sweep=SWEEP, sweep_after=2)
    step_fn = target.step_fn()
    x0s = jnp.stack([jnp.asarray(target.x0), -2.0 * jnp.asarray(target.x0)])
    solve = _jit(
        jax.vmap(
            lambda x0, key: deer_solve(step_fn, x0, target.tape, key, solver),
        )
    )
    states, _, info = solve(x0s, jax.random.split(jax.random.PRNGKey(4), 2))
    seq = _jit(
        jax.vmap(functools.partial(sequential_chain, MALA()), (None, 0, None, None)),
        static_argnums=0,
    )
    expected, _ = seq(target.potential, x0s, target.tape, target.step_size)

    assert np.all(np.asarray(info.converged))
    assert_allclose(np.asarray(states), np.asarray(expected), **MATCH)


def test_carried_sequential_step_is_the_chain(targets):
    # make_sequential_step carries U(x) and its gradient: one gradient a step,
    # the same chain as the step function
    from numpyro_deer.core import make_sequential_step

    target = targets["logreg"]
    sequential = make_sequential_step(MALA(), target.potential, target.step_size)

    @_jit
    def run(x0, tape):
        def body(c, tape_t):
            return sequential.step(c, tape_t)

        return jax.lax.scan(body, sequential.init(x0), tape)[1]

    states = np.asarray(run(jnp.asarray(target.x0), target.tape))
    assert_allclose(states, target.seq_states, rtol=0, atol=1e-12)

    solver = _solver(DiagonalJacobian(clip=None), sweep=SWEEP)
    solve = _jit(
        lambda x0, tape, key: deer_solve(
            target.step_fn(), x0, tape, key, solver, sequential=sequential
        )
    )
    states, _, info = _run(solve, target)
    assert bool(info.converged)
    assert_allclose(states, target.seq_states, **MATCH)


def test_swept_solve_equals_sequential_even_at_zero_tolerance(targets):
    # zero tolerances: a step freezes only when reproduced bit for bit, so a
    # sweep that undid the exact F_t at the front would stall the solve
    target = targets["corr_gauss"]
    solver = DEERSolver(
        DiagonalJacobian(clip=None),
        atol=0.0,
        rtol=0.0,
        max_iter=2 * B,
        sweep=SWEEP,
        sweep_after=0,
    )
    # bit for bit: the sweep's sequential step and the batched step are
    # compiled apart, and reproduce each other's bits with XLA's default CPU
    # fusion emitters (the ones users run; conftest turns them off to compile
    # faster, and with the older emitters they differ in the last bit)
    step_fn = target.step_fn()
    solve = jax.jit(
        lambda x0, tape, key: deer_solve(step_fn, x0, tape, key, solver),
        compiler_options={**_COMPILER_OPTIONS, **_DEFAULT_EMITTERS},
    )
    states, aux, info = _run(solve, target)

    assert bool(info.converged)
    assert int(info.solves) == 1
    assert int(info.iterations) <= B // (SWEEP + 1) + 1
    assert_allclose(states, target.seq_states, **MATCH)
    assert_array_equal(aux.accepted, target.seq_info.accepted)


# ----------------------------------------------------------- the auto strategy
def test_auto_jacobian_resolves_by_dimension():
    solver = DEERSolver()
    assert solver.jacobian == AutoJacobian(max_full_dim=2)
    for dim in (1, 2):
        assert type(solver.jacobian_for(dim)) is FullJacobian
        assert solver.jacobian_for(dim) == FullJacobian(clip=1.0)
    for dim in (3, 8, 25, 1000):
        assert type(solver.jacobian_for(dim)) is StochasticDiagonalJacobian
        assert solver.jacobian_for(dim) == StochasticDiagonalJacobian(num_probes=1)
    assert DEERSolver(jacobian="auto").jacobian == AutoJacobian()
    never_full = DEERSolver(jacobian=AutoJacobian(max_full_dim=0))
    assert type(never_full.jacobian_for(1)) is StochasticDiagonalJacobian
    wider = DEERSolver(jacobian=AutoJacobian(max_full_dim=8))
    assert type(wider.jacobian_for(8)) is FullJacobian
    assert type(wider.jacobian_for(9)) is StochasticDiagonalJacobian
    # a named strategy or an object is used at every dimension as it is
    for name, cls in (
        ("full", FullJacobian),
        ("diag", DiagonalJacobian),
        ("stochastic", StochasticDiagonalJacobian),
    ):
        for dim in (2, 100):
            assert type(DEERSolver(jacobian=name).jacobian_for(dim)) is cls
    probes = StochasticDiagonalJacobian(num_probes=2)
    assert DEERSolver(jacobian=probes).jacobian_for(2) is probes


def _banana(x):
    """D = 2: the second coordinate's mean bends with the first, so a step's
    Jacobian is not diagonal in any fixed basis."""
    return 0.5 * (x[0] / 2.0) ** 2 + 0.5 * (x[1] - 0.3 * (x[0] ** 2 - 4.0)) ** 2


def test_auto_default_block_at_d2_is_the_chain_by_the_full_jacobian():
    step_size = 0.1
    x0 = jnp.array([1.5, -0.5])
    tape = make_tape(jax.random.PRNGKey(25), B, 2, jnp.float64)
    seq = _jit(functools.partial(sequential_chain, MALA()), static_argnums=0)
    seq_states, seq_info = seq(_banana, x0, tape, step_size)
    step_fn = make_step_fn(MALA(), _banana, step_size)
    options = {"atol": ATOL, "rtol": RTOL, "max_iter": MAX_ITER, "sweep": 0}
    default = DEERSolver(**options)  # the default strategy: auto
    key = jax.random.PRNGKey(3)
    states, aux, info = _jitted_solve(step_fn, default)(x0, tape, key)

    assert states.dtype == jnp.float64
    assert_allclose(states, seq_states, **MATCH)
    assert_array_equal(aux.accepted, seq_info.accepted)
    assert 0 < int(aux.accepted.sum()) < B
    assert int(info.result) == RESULTS.successful
    # at D = 2 the auto strategy is the full Jacobian: the same iterates
    full = DEERSolver(jacobian=FullJacobian(), **options)
    full_states, _, full_info = _jitted_solve(step_fn, full)(x0, tape, key)
    assert_array_equal(states, full_states)
    assert int(info.iterations) == int(full_info.iterations)
    stochastic = DEERSolver(jacobian="stochastic", **options)
    _, _, stochastic_info = _jitted_solve(step_fn, stochastic)(x0, tape, key)
    assert int(stochastic_info.iterations) != int(info.iterations)


# -------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: DEERSolver(max_iter=0), "max_iter"),
        (lambda: DEERSolver(max_solves=0), "max_solves"),
        (lambda: DEERSolver(sweep=-1), "sweep"),
        (lambda: DEERSolver(sweep=2.5), "sweep"),
        (lambda: DEERSolver(sweep=4, sweep_after=-1), "sweep_after"),
        (lambda: DEERSolver(atol=-1e-6), "atol"),
        (lambda: DEERSolver(rtol=-1e-6), "rtol"),
        (lambda: DEERSolver(solve_basis="eigen"), "solve_basis"),
        (lambda: DEERSolver(jacobian="dense"), "jacobian"),
        (lambda: DEERSolver(jacobian=None), "jacobian"),
        (lambda: DEERSolver(gate=5), "gate"),
        (lambda: StochasticDiagonalJacobian(clip=float("inf")), "clip"),
        (lambda: StochasticDiagonalJacobian(num_probes=0), "num_probes"),
        (lambda: StochasticDiagonalJacobian(clip=0.0), "clip"),
        (lambda: DiagonalJacobian(clip=-1.0), "clip"),
        (lambda: FullJacobian(clip=0.0), "clip"),
        (lambda: AutoJacobian(max_full_dim=-1), "max_full_dim"),
        (lambda: AutoJacobian(max_full_dim=2.5), "max_full_dim"),
    ],
)
def test_invalid_settings_raise_naming_the_argument(build, name):
    with pytest.raises(ValueError, match=name):
        build()


def test_full_jacobian_bad_precision_names_the_choices():
    with pytest.raises(ValueError, match="precision") as raised:
        FullJacobian(precision="bogus")
    assert "'highest'" in str(raised.value)


def test_full_jacobian_scan_with_precision_matches_sequential():
    # a contracting dense recursion: T = 33 steps, D = 4, spectral norms < 1
    rng = np.random.default_rng(33)
    A = rng.standard_normal((33, 4, 4))
    A *= 0.9 / np.linalg.norm(A, ord=2, axis=(1, 2))[:, None, None]
    b = rng.standard_normal((33, 4))
    strategy = FullJacobian(precision="default")
    got = np.asarray(_jit(strategy.scan)(A, b))
    assert got.dtype == np.float64
    assert_allclose(got, np.asarray(scan_sequential(A, b)), rtol=1e-10, atol=1e-10)


# -------------------------------------------------------------------- non-finite
NAN_X0 = np.array([0.3, -0.2, 0.1])


def _nan_everywhere_but_x0(x):
    """Standard normal at ``NAN_X0`` only; NaN at every other point."""
    at_x0 = jnp.all(x == jnp.asarray(NAN_X0))
    return jnp.where(at_x0, 0.5 * jnp.sum(x**2), jnp.nan)


def _nan_half_space(x):
    """Standard normal restricted to ``x_0 <= 0.5``; NaN beyond."""
    return jnp.where(x[0] > 0.5, jnp.nan, 0.5 * jnp.sum(x**2))


# name: (potential, x0, step size, number of steps, tape seed)
NAN_CASES = {
    "all_nan": (_nan_everywhere_but_x0, NAN_X0, 0.5, 64, 5),
    "nan_region": (_nan_half_space, np.array([-0.5, 0.2, 0.1]), 0.8, B, 6),
}


@pytest.fixture(scope="module")
def nan_chains():
    """``case -> (tape, sequential states, sequential info)``, built once."""
    out = {}
    for case, (potential, x0, step_size, num_steps, seed) in NAN_CASES.items():
        tape = make_tape(jax.random.PRNGKey(seed), num_steps, x0.shape[0], jnp.float64)
        seq = _jit(functools.partial(sequential_chain, MALA()), static_argnums=0)
        states, info = seq(potential, jnp.asarray(x0), tape, step_size)
        out[case] = (tape, np.asarray(states), jax.tree.map(np.asarray, info))
    return out


def _solve_nan_case(nan_chains, case, strategy_name, gate_name):
    potential, x0, step_size, _, _ = NAN_CASES[case]
    tape = nan_chains[case][0]
    step_fn = make_step_fn(MALA(), potential, step_size, gate=GATES[gate_name])
    fn = _jitted_solve(step_fn, _solver(STRATEGIES[strategy_name]))
    states, aux, info = fn(jnp.asarray(x0), tape, jax.random.PRNGKey(0))
    return np.asarray(states), jax.tree.map(np.asarray, aux), info


@pytest.mark.parametrize(
    "strategy_name, gate_name", [("full", "hard"), ("stoch2", "sigmoid")]
)
def test_all_proposals_nan_block_stays_at_x0(nan_chains, strategy_name, gate_name):
    _, seq_states, seq_info = nan_chains["all_nan"]
    num_steps = seq_states.shape[0]
    assert_array_equal(seq_states, np.broadcast_to(NAN_X0, (num_steps, 3)))
    assert np.all(seq_info.diverging)

    states, aux, info = _solve_nan_case(nan_chains, "all_nan", strategy_name, gate_name)
    assert_array_equal(states, seq_states)
    assert not np.any(aux.accepted)
    assert np.all(aux.diverging)
    assert_array_equal(aux.accept_prob, 0.0)
    assert_array_equal(aux.potential_energy, 0.5 * np.sum(NAN_X0**2))
    assert bool(info.converged)
    assert int(info.result) != RESULTS.nonfinite
    assert float(info.residual) == 0.0


@pytest.mark.parametrize(
    "strategy_name, gate_name", [("diag", "sigmoid"), ("stoch2", "hard")]
)
def test_nan_region_block_equals_sequential(nan_chains, strategy_name, gate_name):
    # Some proposals (and possibly some Newton iterates) land in the NaN
    # region; the rejections must not poison the linearisation.
    _, seq_states, seq_info = nan_chains["nan_region"]
    assert 10 <= seq_info.diverging.sum() <= B // 2
    assert seq_info.accepted.sum() >= B // 4

    states, aux, info = _solve_nan_case(
        nan_chains, "nan_region", strategy_name, gate_name
    )
    assert bool(info.converged)
    assert int(info.result) != RESULTS.nonfinite
    assert_allclose(states, seq_states, **MATCH)
    assert_array_equal(aux.accepted, seq_info.accepted)
    assert_array_equal(aux.diverging, seq_info.diverging)
    assert_array_equal(aux.accept_prob[seq_info.diverging], 0.0)


# ------------------------------------------------------------------- tracing
def test_jit_traces_once_for_two_tapes_of_the_same_shape():
    traces = []

    def potential(x):
        traces.append(1)  # runs only while JAX traces the function
        return 0.5 * jnp.sum(x**2)

    dim, num_steps, step_size = 5, 64, 0.5
    fn = _jitted_solve(
        make_step_fn(MALA(), potential, step_size), _solver(DiagonalJacobian(clip=None))
    )
    x0 = jnp.full((dim,), 0.3)
    tape_a = make_tape(jax.random.PRNGKey(1), num_steps, dim, jnp.float64)
    tape_b = make_tape(jax.random.PRNGKey(2), num_steps, dim, jnp.float64)

    states_a, _, info_a = fn(x0, tape_a, jax.random.PRNGKey(0))
    after_first = len(traces)
    assert after_first > 0
    states_b, _, info_b = fn(x0, tape_b, jax.random.PRNGKey(0))
    states_c, _, _ = fn(-x0, tape_a, jax.random.PRNGKey(1))
    assert len(traces) == after_first  # no retrace for new values

    assert bool(info_a.converged) and bool(info_b.converged)
    assert np.max(np.abs(np.asarray(states_a) - np.asarray(states_b))) > 0.1
    # the second call really used the second tape
    seq = _jit(functools.partial(sequential_chain, MALA()), static_argnums=0)
    seq_b, _ = seq(potential, x0, tape_b, step_size)
    assert_allclose(np.asarray(states_b), np.asarray(seq_b), **MATCH)
    seq_c, _ = seq(potential, -x0, tape_a, step_size)
    assert_allclose(np.asarray(states_c), np.asarray(seq_c), **MATCH)


def test_nonfinite_newton_rows_take_the_fixed_point_update():
    """Rows of an overflowing Newton update fall back to ``F_t``, or keep the
    current state where ``F_t`` is not finite either; finite rows are kept."""
    from numpyro_deer.core.certificate import finite_or_fixed_point

    new = jnp.array([[1.0, 2.0], [jnp.inf, 0.0], [jnp.nan, 1.0], [3.0, 4.0]])
    values = jnp.array([[9.0, 9.0], [5.0, 6.0], [jnp.nan, 0.0], [9.0, 9.0]])
    cur = jnp.array([[0.0, 0.0], [0.0, 0.0], [7.0, 8.0], [0.0, 0.0]])
    out = finite_or_fixed_point(new, values, cur)
    np.testing.assert_array_equal(
        np.asarray(out), [[1.0, 2.0], [5.0, 6.0], [7.0, 8.0], [3.0, 4.0]]
    )


# ------------------------------------------------------------------ result codes
class _FakeCarry(NamedTuple):
    front: jax.Array
    iteration: jax.Array
    residual: jax.Array
    nonfinite: jax.Array


@pytest.mark.parametrize(
    "advance, nonfinite_at, expected",
    [
        (1, None, RESULTS.successful),
        (0, None, RESULTS.no_progress),
        (1, 2, RESULTS.nonfinite),
    ],
)
def test_solve_loop_says_why_it_stopped(advance, nonfinite_at, expected):
    # a stand-in iteration: the front moves by `advance` per iteration, and
    # the iterate turns non-finite at iteration `nonfinite_at`
    from numpyro_deer.core.newton import solve_loop

    def iteration(c):
        bad = c.nonfinite | (
            nonfinite_at is not None and c.iteration + 1 == nonfinite_at
        )
        return c._replace(
            front=c.front + advance, iteration=c.iteration + 1, nonfinite=bad
        )

    zero = jnp.zeros((), jnp.int32)
    carry = _FakeCarry(zero, zero, jnp.zeros(()), jnp.zeros((), bool))
    _, info = solve_loop(iteration, carry, 10, DEERSolver(max_iter=4, max_solves=3))
    assert int(info.result) == expected
    assert bool(info.converged) == (expected == RESULTS.successful)
    assert RESULTS.message(info.result).split(":")[0] in {
        "converged",
        "no progress",
        "non-finite",
    }
