"""The block-kernel protocol: what a new transition needs, and nothing more.

A third transition, random-walk Metropolis, is written here with its kernel
(the transition and the adapter together in under 80 lines): it samples a
Gaussian through ``numpyro_deer.MCMC``, and DEER's blocks are its sequential
chain on the same tape in float64.
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from numpyro_deer import DEERMALA, MCMC, DEERSolver
from numpyro_deer.core import HardGate
from numpyro_deer.core.metric import mul_sqrt
from numpyro_deer.core.transition import flat_draw, metropolis_accept
from numpyro_deer.infer.kernel import DEERKernel
from numpyro_deer.infer.protocol import BlockKernel, RunProgram, is_block_kernel


# ----- the transition and its kernel: everything a new sampler writes -----
class RWMTape(NamedTuple):
    noise: jax.Array  # (T, D) standard normal
    log_u: jax.Array  # (T,) log uniform


@dataclasses.dataclass(frozen=True)
class RandomWalk:
    """Random-walk Metropolis: ``y = x + sqrt(eps) M^{1/2} xi``, accepted with
    probability ``min(1, exp(U(x) - U(y)))`` (Metropolis et al., 1953)."""

    def make_tape(self, key, num_steps, dim, dtype=None):
        dtype = jnp.result_type(float) if dtype is None else dtype
        k_noise, k_u = jax.random.split(key)
        noise = flat_draw(jax.random.normal, k_noise, (num_steps, dim), dtype)
        return RWMTape(noise, jnp.log(jax.random.uniform(k_u, (num_steps,), dtype)))

    def step(self, potential_fn, step_size, carry, tape_t, mass_sqrt=None, gate=None):
        x, potential_x, grad_x = carry
        y = x + jnp.sqrt(step_size) * mul_sqrt(mass_sqrt, tape_t.noise)
        potential_y, grad_y = jax.value_and_grad(potential_fn)(y)
        *new, info = metropolis_accept(
            gate or HardGate(),
            potential_x - potential_y,
            tape_t.log_u,
            (y, potential_y, grad_y),
            (x, potential_x, grad_x),
        )
        return tuple(new), info

    def rotate_tape(self, tape, basis):
        return tape._replace(noise=tape.noise @ basis)


class DEERRWM(DEERKernel):
    """Random-walk Metropolis, its blocks solved by DEER."""

    def __init__(self, model=None, potential_fn=None, **settings):
        settings.setdefault("target_accept_prob", 0.5)
        super().__init__(RandomWalk(), model, potential_fn, **settings)


# ------------------------------------------------------------------ tests
def gaussian(y=None):
    x = numpyro.sample("x", dist.Normal(jnp.arange(3.0), jnp.array([1.0, 2.0, 0.5])))
    numpyro.deterministic("x2", x**2)


@pytest.fixture(scope="module")
def runs():
    out = {}
    for method in ("deer", "sequential"):
        kernel = DEERRWM(
            gaussian, block_size=256, method=method, solver=DEERSolver(max_iter=300)
        )
        mcmc = MCMC(kernel, num_warmup=300, num_samples=1024, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(3))
        out[method] = mcmc
    return out


def test_a_new_transition_is_its_sequential_chain(runs):
    deer, sequential = runs["deer"], runs["sequential"]
    np.testing.assert_allclose(
        deer.get_samples()["x"], sequential.get_samples()["x"], rtol=1e-8, atol=1e-10
    )
    assert int(deer.last_state.newton_iterations) > 0  # DEER solved the blocks
    assert int(sequential.last_state.newton_iterations) == 0


def test_a_new_transition_samples_its_target(runs):
    x = np.asarray(runs["deer"].get_samples()["x"])
    # means 0, 1, 2 and sds 1, 2, 0.5; 1,024 correlated draws (ESS ~100+):
    # tolerances of about four Monte Carlo standard errors
    error = np.abs(x.mean(0) - [0.0, 1.0, 2.0])
    assert np.all(error < [0.45, 0.9, 0.25]), error
    np.testing.assert_allclose(x.std(0), [1.0, 2.0, 0.5], rtol=0.3)


def test_the_kernels_implement_the_protocol(runs):
    kernel = runs["deer"].sampler
    assert is_block_kernel(kernel) and isinstance(kernel, BlockKernel)
    assert isinstance(kernel.program, RunProgram)
    assert not is_block_kernel(numpyro.infer.NUTS(gaussian))


def test_settings_are_frozen_and_init_writes_only_the_run():
    kernel = DEERMALA(gaussian, block_size=64)
    before = dict(vars(kernel))
    with pytest.raises(dataclasses.FrozenInstanceError):
        kernel.settings.block_size = 8
    mcmc = MCMC(kernel, num_warmup=20, num_samples=100, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    changed = {k for k, v in vars(kernel).items() if before.get(k) is not v}
    assert changed == {"_sample_fn"}  # NumPyro's one attribute: the run
    assert kernel.block_size == 64 and kernel.program.block_size == 50


def test_mcmc_shows_numpyros_keyword_arguments():
    import inspect

    from numpyro.infer import MCMC as StockMCMC

    ours = inspect.signature(MCMC).parameters
    theirs = inspect.signature(StockMCMC).parameters
    assert list(ours) == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].kind == parameter.kind, name
        assert ours[name].default == parameter.default, name
