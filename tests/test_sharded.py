"""Tests of ``sharded_deer_solve``: one block's time axis over several devices.

``conftest.py`` exposes eight host CPU devices and enables float64. The sharded
solve must return the chain of the unsharded ``deer_solve`` and of the
sequential scan, for every Jacobian strategy on 8 devices, and on 4.

The solver runs with ``atol = rtol = 1e-12``: the certificate bounds each
step's residual, and residuals add up along the chain, so with ``rtol = 1e-10``
even the unsharded solve is only within about ``1e-10`` of the sequential chain
on this target. At ``1e-12`` the comparisons at ``1e-10`` have a wide margin.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from numpyro_deer.core import (
    HMC,
    MALA,
    DEERSolver,
    DiagonalJacobian,
    FullJacobian,
    StochasticDiagonalJacobian,
    deer_solve,
    make_step_fn,
    make_tape,
    sequential_chain,
    sharded_deer_solve,
    time_mesh,
)

DIM = 5
NUM_STEPS = 64
STEP_SIZE = 0.3
TOL = 1e-10
STRATEGIES = {
    "full": FullJacobian(clip=None),
    "diag": DiagonalJacobian(clip=None),
    "stochastic": StochasticDiagonalJacobian(clip=None),
}


def _solver(name: str, **options) -> DEERSolver:
    # no sweep: the sharded solver has none, and the counts are compared
    options = {"sweep": 0, **options}
    return DEERSolver(STRATEGIES[name], atol=1e-12, rtol=1e-12, **options)


@pytest.fixture(scope="module")
def problem():
    """A correlated Gaussian target, a tape, and the sequential chain."""
    rng = np.random.default_rng(0)
    root = rng.standard_normal((DIM, DIM))
    covariance = root @ root.T / DIM + 0.5 * np.eye(DIM)
    precision = jnp.asarray(np.linalg.inv(covariance))

    def potential(x):
        return 0.5 * x @ precision @ x

    tape = make_tape(jax.random.PRNGKey(1), NUM_STEPS, DIM)
    x0 = jnp.linspace(-1.5, 1.5, DIM)
    states, infos = jax.jit(partial(sequential_chain, MALA(), potential))(
        x0, tape, STEP_SIZE
    )
    return {
        "potential": potential,
        "step_fn": make_step_fn(MALA(), potential, STEP_SIZE),
        "tape": tape,
        "x0": x0,
        "states": states,
        "infos": infos,
    }


@pytest.fixture(scope="module")
def unsharded(problem):
    """``deer_solve`` of the problem for each strategy, computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            solve = jax.jit(
                partial(deer_solve, problem["step_fn"], solver=_solver(name))
            )
            cache[name] = solve(problem["x0"], problem["tape"], jax.random.PRNGKey(2))
        return cache[name]

    return get


def _sharded(problem, solver, num_devices, tape=None):
    mesh = time_mesh(jax.devices()[:num_devices])
    solve = jax.jit(
        partial(sharded_deer_solve, problem["step_fn"], solver=solver, mesh=mesh)
    )
    tape = problem["tape"] if tape is None else tape
    return solve(problem["x0"], tape, jax.random.PRNGKey(2)), mesh


def test_eight_host_devices_are_available():
    assert len(jax.devices()) >= 8


# every strategy on 8 devices, the default one on 4 too (the scan across the
# devices is the same code for any count): 4 sharded solves, not 6
@pytest.mark.parametrize(
    ("name", "num_devices"),
    [("diag", 8), ("full", 8), ("stochastic", 8), ("stochastic", 4)],
)
def test_sharded_equals_unsharded_and_sequential(problem, unsharded, name, num_devices):
    (states, aux, info), mesh = _sharded(problem, _solver(name), num_devices)
    ref_states, _, ref_info = unsharded(name)

    assert bool(info.converged) and int(info.result) == 0
    assert int(info.front) == NUM_STEPS
    assert 1 <= int(info.solves) and int(info.iterations) >= 1
    assert float(info.residual) <= 1e-12 + 1e-12 * float(jnp.max(jnp.abs(states)))
    np.testing.assert_allclose(states, ref_states, rtol=0, atol=TOL)
    np.testing.assert_allclose(states, problem["states"], rtol=0, atol=TOL)
    if name != "stochastic":  # other probes may take other iteration counts
        assert int(info.iterations) == int(ref_info.iterations)

    # The step infos of the certifying evaluation are those of the chain.
    np.testing.assert_array_equal(aux.accepted, problem["infos"].accepted)
    np.testing.assert_allclose(
        aux.accept_prob, problem["infos"].accept_prob, rtol=0, atol=TOL
    )
    np.testing.assert_allclose(
        aux.potential_energy, problem["infos"].potential_energy, rtol=0, atol=TOL
    )
    # The result stays distributed along the time axis.
    assert states.sharding.mesh.shape == mesh.shape
    assert states.sharding.spec == PartitionSpec("time")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_hmc_transition_is_the_chain(problem, name):
    """HMC's step (a leapfrog loop inside each step) solved over eight devices."""
    hmc, potential = HMC(num_steps=2), problem["potential"]
    tape = hmc.make_tape(jax.random.PRNGKey(3), NUM_STEPS, DIM)
    chain = partial(sequential_chain, hmc, potential)
    states, _ = jax.jit(chain)(problem["x0"], tape, STEP_SIZE)
    step_fn = make_step_fn(hmc, potential, STEP_SIZE)
    mesh = time_mesh(jax.devices()[:8])
    solve = partial(sharded_deer_solve, step_fn, solver=_solver(name), mesh=mesh)
    solved, _, info = jax.jit(solve)(problem["x0"], tape, jax.random.PRNGKey(2))
    assert bool(info.converged) and int(info.iterations) >= 1
    np.testing.assert_allclose(solved, states, rtol=0, atol=TOL)


def test_auto_default_at_two_dimensions_is_the_chain_by_the_full_jacobian():
    """The default strategy is resolved inside the sharded solve from the
    state's dimension: at D = 2 the dense Jacobian and its scan across the
    devices."""
    precision = jnp.array([[2.0, 0.9], [0.9, 1.0]])

    def potential(x):
        return 0.5 * x @ precision @ x

    tape = make_tape(jax.random.PRNGKey(4), NUM_STEPS, 2)
    x0 = jnp.array([1.5, -1.0])
    chain = jax.jit(partial(sequential_chain, MALA(), potential))
    sequential, infos = chain(x0, tape, STEP_SIZE)
    step_fn = make_step_fn(MALA(), potential, STEP_SIZE)
    mesh = time_mesh(jax.devices()[:8])

    def solve(solver):
        fn = partial(sharded_deer_solve, step_fn, solver=solver, mesh=mesh)
        return jax.jit(fn)(x0, tape, jax.random.PRNGKey(2))

    options = {"atol": 1e-12, "rtol": 1e-12, "sweep": 0}
    states, aux, info = solve(DEERSolver(**options))
    assert bool(info.converged) and int(info.front) == NUM_STEPS
    np.testing.assert_allclose(states, sequential, rtol=0, atol=TOL)
    np.testing.assert_array_equal(aux.accepted, infos.accepted)
    full_states, _, full_info = solve(DEERSolver(FullJacobian(), **options))
    np.testing.assert_array_equal(states, full_states)
    assert int(info.iterations) == int(full_info.iterations)


def test_one_device_mesh_is_the_chain(problem, unsharded):
    """A one-device mesh takes the path without the cross-device scan."""
    (states, _, info), _ = _sharded(problem, _solver("stochastic"), 1)
    assert bool(info.converged) and int(info.front) == NUM_STEPS
    np.testing.assert_allclose(states, unsharded("stochastic")[0], rtol=0, atol=TOL)
    np.testing.assert_allclose(states, problem["states"], rtol=0, atol=TOL)


@pytest.mark.parametrize("dense", [False, True])
def test_compose_all_is_the_ordered_product(dense):
    """The slice's transition ``A_L ... A_1``, odd lengths included."""
    shape = (7, 3, 3) if dense else (7, 3)
    A = jax.random.normal(jax.random.PRNGKey(0), shape)
    expected = A[0]
    for A_t in A[1:]:
        expected = A_t @ expected if dense else A_t * expected
    strategy = FullJacobian(clip=None) if dense else DiagonalJacobian(clip=None)
    np.testing.assert_allclose(strategy.compose(A), expected, rtol=1e-12)


def test_iteration_cap_keeps_an_exact_front(problem, unsharded):
    """Stopped early, the sharded solve reports the front of ``deer_solve``
    and the states before it are the chain's."""
    solver = _solver("diag", max_iter=3, max_solves=1)
    (states, _, info), _ = _sharded(problem, solver, 4)
    _, _, ref_info = jax.jit(partial(deer_solve, problem["step_fn"], solver=solver))(
        problem["x0"], problem["tape"], jax.random.PRNGKey(2)
    )
    assert not bool(info.converged)
    assert int(info.iterations) == 3 and int(info.solves) == 1
    front = int(info.front)
    assert front == int(ref_info.front) and 1 <= front < NUM_STEPS
    # after k iterations the first k states are exact, the first `front` certified
    np.testing.assert_allclose(states[:3], problem["states"][:3], rtol=0, atol=TOL)


@pytest.mark.parametrize("num_devices", [3, 4, 8])
def test_indivisible_block_raises(problem, num_devices):
    tape = jax.tree.map(lambda x: x[:62], problem["tape"])
    mesh = time_mesh(jax.devices()[:num_devices])
    with pytest.raises(ValueError, match="not divisible"):
        sharded_deer_solve(
            problem["step_fn"], problem["x0"], tape, jax.random.PRNGKey(0), mesh=mesh
        )


def test_unknown_axis_raises(problem):
    mesh = time_mesh(jax.devices()[:4], axis_name="t")
    with pytest.raises(ValueError, match="axis_name"):
        sharded_deer_solve(
            problem["step_fn"],
            problem["x0"],
            problem["tape"],
            jax.random.PRNGKey(0),
            mesh=mesh,
        )


def test_time_mesh_defaults_to_all_devices():
    mesh = time_mesh()
    assert mesh.axis_names == ("time",)
    assert mesh.shape["time"] == len(jax.devices())
    with pytest.raises(ValueError, match="at least one device"):
        time_mesh([])
