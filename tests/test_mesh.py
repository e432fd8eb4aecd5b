"""``DEERMALA(model, mesh=...)``: each block's solve split over eight host devices.

``conftest.py`` exposes eight CPU devices and enables float64. The sharded kernel
must give the draws of the unsharded one within ``1e-10``:

* through :class:`numpyro_deer.MCMC`, one chain and two sequential chains,
  against the unsharded kernel with ``method="sequential"`` (the chain itself:
  unsharded DEER gives it too, see ``test_kernel.py``);
* block by block for every Jacobian strategy: a block refilled by the sharded
  kernel from a post-warmup state against the same block refilled by the
  unsharded kernel with ``method="sequential"``;
* two vectorized chains over a ``2 x 4`` mesh (chains over its ``"chain"``
  axis, each chain's blocks over its ``"time"`` axis), default and full
  Jacobians, against the unsharded kernel's two sequential chains (its two
  vectorized chains are the same draws, to the last digit); slow: four
  chains on the two rows, and stock ``numpyro.infer.MCMC``, against the
  unsharded kernel's vectorized chains;
* block by block for :class:`~numpyro_deer.DEERHMC`, through stock
  ``numpyro.infer.MCMC``, and over two processes of four devices each
  (``jax.distributed`` with CPU collectives): slow, other compiled programs
  (the sharded HMC solve is also compared with its chain in
  ``test_sharded.py``).

The solvers run with ``atol = rtol = 1e-12`` (as in ``test_sharded.py``): the
sharded solve has no sequential sweep and another stochastic probe, so it
takes other iterations to the same chain, and at these tolerances both are
within ``1e-10`` of it. Each program is compiled once per module.
"""

import os
import pickle
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from numpyro.infer import MCMC as StockMCMC

from numpyro_deer import (
    DEERHMC,
    DEERMALA,
    MCMC,
    DEERSolver,
    DiagonalJacobian,
    FullJacobian,
    SlowDriverWarning,
    StochasticDiagonalJacobian,
)
from numpyro_deer.core import time_mesh
from numpyro_deer.infer.host_run import placed
from numpyro_deer.infer.memory import check_block_memory

ROOT = Path(__file__).resolve().parents[1]
COVARIANCE = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.4], [0.2, -0.4, 0.5]])
BLOCK = 32  # four steps per device on eight devices
RUN = {"num_warmup": 40, "num_samples": 64, "progress_bar": False}
TOL = 1e-10
STRATEGIES = {
    "full": FullJacobian(),
    "diag": DiagonalJacobian(),
    "stochastic": StochasticDiagonalJacobian(),
}


def correlated_gaussian():
    numpyro.sample(
        "x", dist.MultivariateNormal(jnp.zeros(3), covariance_matrix=COVARIANCE)
    )


def _kernel(name: str, mesh=None, basis="auto", **options) -> DEERMALA:
    solver = DEERSolver(STRATEGIES[name], atol=1e-12, rtol=1e-12, solve_basis=basis)
    options = {"block_size": BLOCK, "solver": solver, **options}
    if mesh is None:
        options.setdefault("method", "deer")
    return DEERMALA(correlated_gaussian, mesh=mesh, **options)


def _run(kernel, seed: int, num_chains: int = 1) -> MCMC:
    mcmc = MCMC(kernel, num_chains=num_chains, chain_method="sequential", **RUN)
    mcmc.run(jax.random.PRNGKey(seed), extra_fields=("newton_iterations",))
    return mcmc


@pytest.fixture(scope="module")
def mesh():
    return time_mesh(jax.devices()[:8])


@pytest.fixture(scope="module")
def runs(mesh):
    """Two sequential chains, unsharded sequential and sharded (diagonal)."""
    return {
        "plain": _run(_kernel("diag", method="sequential"), 0, num_chains=2),
        "sharded": _run(_kernel("diag", mesh), 0, num_chains=2),
    }


def test_eight_host_devices_are_available(mesh):
    assert mesh.size == 8


def _assert_same_chains(sharded: MCMC, plain: MCMC, num_chains: int) -> None:
    draws = sharded.get_samples(group_by_chain=True)["x"]
    reference = plain.get_samples(group_by_chain=True)["x"]
    assert draws.shape == reference.shape == (num_chains, RUN["num_samples"], 3)
    np.testing.assert_allclose(draws, reference, rtol=0, atol=TOL)
    # the draws move
    assert np.mean(np.any(np.diff(draws[0], axis=0) != 0, axis=-1)) > 0.3
    # every block was a DEER solve (method="auto" means "deer" with a mesh)
    iterations = sharded.get_extra_fields()["newton_iterations"]
    assert np.all(np.asarray(iterations) >= 1)
    assert sharded.sampler.method_chosen == "deer"


def test_two_sequential_chains_give_the_unsharded_draws(runs):
    _assert_same_chains(runs["sharded"], runs["plain"], 2)
    draws = runs["sharded"].get_samples(group_by_chain=True)["x"]
    assert np.max(np.abs(draws[0] - draws[1])) > 0.1  # two chains


def test_one_chain_gives_the_unsharded_draws(runs):
    # the compiled loops of the fixture's kernels serve these runs
    plain = _run(runs["plain"].sampler, 1)
    sharded = _run(runs["sharded"].sampler, 1)
    _assert_same_chains(sharded, plain, 1)


@pytest.fixture(scope="module")
def warm_state(runs):
    """A post-warmup state of chain 0, on the host, its block used up."""
    state = jax.tree.map(lambda x: x[0], runs["sharded"].last_state)
    state = state._replace(block=state.block._replace(index=jnp.int32(BLOCK)))
    return jax.device_get(state)


def _refill(kernel, state):
    if kernel.program is None:  # a new kernel: init sets the latent layout
        kernel.init(jax.random.PRNGKey(0), RUN["num_warmup"], None, (), {})
    refill = kernel.program.refill
    return jax.jit(lambda s: refill(s, (), {}, kernel.method_chosen))(state).block


@pytest.fixture(scope="module")
def reference_block(runs, warm_state):
    """The block the unsharded sequential kernel computes from ``warm_state``."""
    return _refill(runs["plain"].sampler, warm_state)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_jacobian_strategy_solves_the_same_block(
    reference_block, warm_state, mesh, name
):
    # the whitened basis (the block is the same chain in any basis) keeps the
    # compiled refill small
    block = _refill(_kernel(name, mesh, basis="whitened"), warm_state)
    assert bool(block.info.converged) and int(block.info.iterations) >= 1
    assert int(reference_block.info.iterations) == 0  # the sequential scan
    for field in ("z", "potential_energy", "accept_prob"):
        np.testing.assert_allclose(
            getattr(block, field), getattr(reference_block, field), rtol=0, atol=TOL
        )
    assert 0.3 < float(jnp.mean(block.accept_prob)) < 1.0


@pytest.mark.slow
def test_deerhmc_solves_the_same_block(warm_state, mesh):
    """HMC's transition (a leapfrog loop per step) solved over the mesh."""
    solver = DEERSolver(atol=1e-12, rtol=1e-12, solve_basis="whitened")
    options = {"num_steps": 2, "block_size": BLOCK, "solver": solver}
    hmc = DEERHMC(correlated_gaussian, mesh=mesh, **options)
    reference = DEERHMC(correlated_gaussian, method="sequential", **options)
    block = _refill(hmc, warm_state)
    assert bool(block.info.converged) and int(block.info.iterations) >= 1
    np.testing.assert_allclose(
        block.z, _refill(reference, warm_state).z, rtol=0, atol=TOL
    )


WORKER = """
import sys
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
import numpy as np
from numpyro_deer.core import time_mesh
from numpyro_deer.infer.memory import check_block_memory
from tests.test_mesh import _run, _kernel
mcmc = _run(_kernel("diag", time_mesh()), 0, num_chains=2)
np.save(sys.argv[3], np.asarray(mcmc.get_samples(group_by_chain=True)["x"]))
"""


@pytest.mark.slow
def test_two_processes_give_the_one_process_draws(runs, tmp_path):
    """Two CPU processes of four devices each (``jax.distributed``), one mesh."""
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        address = f"localhost:{sock.getsockname()[1]}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    outputs = [tmp_path / f"draws_{i}.npy" for i in range(2)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, address, str(i), str(outputs[i])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    for worker in workers:
        log, _ = worker.communicate(timeout=600)
        assert worker.returncode == 0, log[-3000:]
    reference = runs["plain"].get_samples(group_by_chain=True)["x"]
    for output in outputs:
        np.testing.assert_allclose(np.load(output), reference, rtol=0, atol=TOL)


@pytest.mark.slow
def test_stock_mcmc_gives_the_same_draws(runs, mesh):
    """One chain through ``numpyro.infer.MCMC``: the driver's unsharded chain."""
    reference = MCMC(runs["plain"].sampler, **RUN)
    reference.run(jax.random.PRNGKey(1))
    stock = StockMCMC(_kernel("diag", mesh), **RUN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SlowDriverWarning)
        stock.run(jax.random.PRNGKey(1))
    np.testing.assert_allclose(
        stock.get_samples()["x"], reference.get_samples()["x"], rtol=0, atol=TOL
    )


def test_block_size_not_a_multiple_of_the_mesh_is_refused(mesh):
    with pytest.raises(ValueError, match=r"block_size=36, mesh=.*multiple of 8"):
        DEERMALA(correlated_gaussian, block_size=36, mesh=mesh)
    with pytest.raises(ValueError, match=r"DEERHMC\(block_size=12, mesh="):
        DEERHMC(correlated_gaussian, block_size=12, mesh=mesh)


def test_mesh_argument_is_checked(mesh):
    with pytest.raises(ValueError, match=r"mesh=.*jax.sharding.Mesh"):
        DEERMALA(correlated_gaussian, mesh=jax.devices())
    with pytest.raises(ValueError, match=r"method='sequential', mesh=.*'deer'"):
        DEERMALA(correlated_gaussian, block_size=BLOCK, mesh=mesh, method="sequential")
    kernel = DEERMALA(correlated_gaussian, block_size=BLOCK, mesh=mesh)
    assert kernel.mesh == mesh
    assert kernel.method_chosen == "deer" and "mesh" in kernel.method_choice.reason


def test_memory_errors_suggest_multiples_of_the_mesh(mesh):
    kernel = DEERMALA(correlated_gaussian, block_size=64, mesh=mesh)
    assert kernel.block_multiple == 8
    with pytest.raises(ValueError, match=r"block_size=64\) needs .* block_size=16 "):
        check_block_memory(10 * 2**30, 4 * 2**30, 64, multiple=8)  # not 20
    with pytest.raises(ValueError, match=r"Set block_size=8 or smaller"):
        check_block_memory(100 * 2**30, 2**30, 64, multiple=8)  # not 0


@pytest.mark.parametrize("chain_method", ["vectorized", "parallel"])
def test_chains_side_by_side_are_refused(mesh, chain_method):
    mcmc = MCMC(_kernel("diag", mesh), num_chains=2, chain_method=chain_method, **RUN)
    with pytest.raises(ValueError, match=r"mesh=.*chain_method='sequential'"):
        mcmc.run(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def chain_mesh():
    """Two chains' rows of four devices: chains over "chain", blocks over "time"."""
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("chain", "time"))


def _run_vectorized(kernel, num_chains: int = 2, seed: int = 0) -> MCMC:
    mcmc = MCMC(kernel, num_chains=num_chains, chain_method="vectorized", **RUN)
    mcmc.run(jax.random.PRNGKey(seed), extra_fields=("newton_iterations",))
    return mcmc


@pytest.fixture(scope="module")
def vectorized_reference():
    """Two vectorized chains, unsharded (the sequential scan: the chain)."""
    return _run_vectorized(_kernel("diag", method="sequential"))


# "stochastic" is DEERSolver's default Jacobian; the reference is the module's
# two sequential chains of the unsharded kernel (the draws of its two
# vectorized chains: their programs are not compiled again here)
@pytest.mark.parametrize("name", ["stochastic", "full"])
def test_vectorized_chains_over_a_chain_axis_give_the_unsharded_draws(
    runs, chain_mesh, name
):
    sharded = _run_vectorized(_kernel(name, chain_mesh, basis="whitened"))
    _assert_same_chains(sharded, runs["plain"], 2)
    draws = sharded.get_samples(group_by_chain=True)["x"]
    assert np.max(np.abs(draws[0] - draws[1])) > 0.1  # two chains
    # each chain's state on its own row of the mesh
    sharding = sharded.last_state.z["x"].sharding
    assert sharding.mesh == chain_mesh and sharding.spec == P("chain")


@pytest.mark.slow
def test_a_multiple_of_the_chain_axis_gives_the_unsharded_draws(chain_mesh):
    """Four chains on the two rows, two on each."""
    reference = _run_vectorized(_kernel("diag", method="sequential"), num_chains=4)
    sharded = _run_vectorized(
        _kernel("diag", chain_mesh, basis="whitened"), num_chains=4
    )
    _assert_same_chains(sharded, reference, 4)


@pytest.mark.slow
def test_stock_mcmc_runs_chains_over_the_chain_axis(vectorized_reference, chain_mesh):
    stock = StockMCMC(
        _kernel("diag", chain_mesh), num_chains=2, chain_method="vectorized", **RUN
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SlowDriverWarning)
        stock.run(jax.random.PRNGKey(0))
    np.testing.assert_allclose(
        stock.get_samples(group_by_chain=True)["x"],
        vectorized_reference.get_samples(group_by_chain=True)["x"],
        rtol=0,
        atol=TOL,
    )


def test_a_chain_axis_that_does_not_divide_num_chains_is_refused(chain_mesh):
    mcmc = MCMC(
        _kernel("diag", chain_mesh), num_chains=3, chain_method="vectorized", **RUN
    )
    with pytest.raises(
        ValueError,
        match=r"DEERMALA\(mesh=\.\.\.\) with MCMC\(num_chains=3, chain_method="
        r"'vectorized'\): .* 2 devices of the mesh's chain axis 'chain', so "
        r"num_chains must be a multiple of 2",
    ):
        mcmc.run(jax.random.PRNGKey(0))


def test_chains_need_a_two_axis_mesh_and_no_pmap(chain_mesh):
    mcmc = MCMC(
        _kernel("diag", chain_mesh), num_chains=2, chain_method="parallel", **RUN
    )
    with pytest.raises(
        ValueError,
        match=r"mesh=.*'parallel'.*chain_method='vectorized'\) with a mesh of two",
    ):
        mcmc.run(jax.random.PRNGKey(0))
    three = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("a", "b", "time"))
    mcmc = MCMC(_kernel("diag", three), num_chains=2, chain_method="vectorized", **RUN)
    with pytest.raises(ValueError, match=r"axes \('a', 'b', 'time'\).* two axes"):
        mcmc.run(jax.random.PRNGKey(0))


def test_fitted_blocks_compile_key_and_pickle_keep_the_mesh(runs, mesh):
    sharded = runs["sharded"].sampler
    other = _kernel("diag", time_mesh(jax.devices()[:4]))  # only the mesh differs
    other.init(jax.random.PRNGKey(0), RUN["num_warmup"], None, (), {})
    assert other.program.block_size == sharded.program.block_size == BLOCK
    assert other.compile_key() != sharded.compile_key()
    # four blocks of 25 without a mesh; multiples of the four devices with it
    key = jax.random.PRNGKey(0)
    other.init_program(key, RUN["num_warmup"], None, (), {}, num_samples=100)
    assert other.program.block_size == 28 and other.block_size == BLOCK
    copy = pickle.loads(pickle.dumps(sharded))
    assert copy.mesh == mesh and copy.compile_key() is None


def test_placed_moves_arguments_and_leaves_unused_ones():
    # the host run's placement of a program's arguments over a mesh (the
    # multi-process case, a replicated counter taken on one device, is the
    # slow two-process test above)
    x = jnp.arange(3.0)
    assert placed(x, None) is x
    device = jax.devices()[-1]
    moved = placed(x, jax.sharding.SingleDeviceSharding(device))
    assert moved.devices() == {device}
    np.testing.assert_array_equal(moved, x)
