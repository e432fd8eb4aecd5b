"""The warmup's step size search and NumPyro's adapter, on a standard normal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.hmc_util import warmup_adapter

from numpyro_deer.core import MALA, make_step_fn, make_tape
from numpyro_deer.infer.warmup import (
    MAX_STEP_SIZE_SEARCH,
    build_adapter,
    find_reasonable_step_size,
    restart_step_size,
)

D = 10
TARGET = 0.8


def _potential(x):
    return 0.5 * jnp.sum(x**2)


def _acceptance(eps, x, key):
    """One MALA step's acceptance probability on the tape the search draws."""
    tape = jax.tree.map(lambda v: v[0], make_tape(key, 1, D, x.dtype))
    return float(
        make_step_fn(MALA(), _potential, eps, jnp.ones(D))(x, tape)[1].accept_prob
    )


@pytest.mark.parametrize("start", [1e-4, 50.0], ids=["grows", "shrinks"])
def test_step_size_search_crosses_the_target(start):
    key_x, key = jax.random.split(jax.random.PRNGKey(3))
    x = jax.random.normal(key_x, (D,))
    eps = float(
        find_reasonable_step_size(
            _potential, TARGET, start, jnp.ones(D), (x,), key, MALA()
        )
    )
    # a real search: it moved in the right direction, within its bound
    assert (eps > start) if start < 1 else (eps < start)
    assert start * 2.0**-MAX_STEP_SIZE_SEARCH < eps < start * 2.0**MAX_STEP_SIZE_SEARCH
    # the returned step passes the target, twice it does not
    assert _acceptance(eps, x, key) >= TARGET
    assert _acceptance(2 * eps, x, key) <= TARGET
    # it is a power-of-two multiple of the start
    np.testing.assert_allclose(np.log2(eps / start), np.round(np.log2(eps / start)))


@pytest.mark.parametrize("mass", ["hessian", True])
def test_initial_state_then_search_is_numpyros_init(mass):
    # the kernel's initial state leaves NumPyro's step size search to a
    # program of its own (restart_step_size): together they give the adapt
    # state NumPyro's warmup_adapter init gives with the search inside
    key_x, key = jax.random.split(jax.random.PRNGKey(5))
    x = jax.random.normal(key_x, (D,))
    adapter = build_adapter(
        _potential,
        100,
        mass_adaptation=mass,
        dense_mass=False,
        adapt_step_size=True,
        target_accept_prob=TARGET,
        transition=MALA(),
    )
    ours = restart_step_size(adapter.init(x, key, 1.0), x, adapter.find_step_size)
    init, _ = warmup_adapter(
        100,
        find_reasonable_step_size=adapter.find_step_size,
        dense_mass=mass == "hessian",
        target_accept_prob=TARGET,
    )
    theirs = init((x,), key, jnp.asarray(1.0), mass_matrix_size=D)
    assert float(ours.step_size) != 1.0  # the search moved it
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_restart_is_skipped_where_not_used():
    x = jnp.zeros(D)
    adapter = build_adapter(
        _potential,
        100,
        mass_adaptation="hessian",
        dense_mass=False,
        adapt_step_size=True,
        target_accept_prob=TARGET,
        transition=MALA(),
    )
    state = adapter.init(x, jax.random.PRNGKey(0), 1e-3)
    kept = restart_step_size(state, x, adapter.find_step_size, jnp.asarray(False))
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_vectorized_warmup_searches_the_step_size_only_at_window_ends(monkeypatch):
    """NumPyro's adapter searches the step size (a ``while`` loop) at a
    window end under a ``cond``. Vectorized chains (``vmap``, as on an
    accelerator) pass their shared iteration count and window index
    unbatched, so the ``cond`` stays a ``cond``: a step runs no search
    outside it (from a batched predicate ``vmap`` would make it a ``select``
    computing the search at every step). The steps are the chains' own."""
    from benchmarks.models import gaussian_mean_model
    from numpyro_deer import DEERMALA, MCMC
    from numpyro_deer.infer import chains

    from .helpers import gaussian_data, primitive_names

    args, kwargs = gaussian_data(1.0)
    kernel = DEERMALA(gaussian_mean_model, block_size=8, adapt_mass_matrix=True)
    mcmc = MCMC(
        kernel, num_warmup=30, num_samples=8, num_chains=3,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
    state = mcmc.last_state._replace(i=jnp.full((3,), 12))  # inside warmup

    def warmup():  # a new function each time: JAX caches traces by function
        return lambda s: kernel.program.warmup(s, args, kwargs, batched=True)

    monkeypatch.setattr(chains, "on_cpu", lambda: False)  # vmap, as on a GPU
    jaxpr = jax.make_jaxpr(warmup())(state).jaxpr
    assert "cond" in primitive_names(jaxpr, into_conds=False)
    assert "while" not in primitive_names(jaxpr, into_conds=False)
    vmapped = jax.jit(warmup())(state)
    monkeypatch.undo()
    mapped = jax.jit(warmup())(state)  # lax.map over the chains (CPU)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), mapped, vmapped
    )
