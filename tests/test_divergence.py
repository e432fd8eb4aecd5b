"""Divergences are flagged as NumPyro flags them.

A proposal is diverging when its potential or log ratio is not finite, or
when its energy error ``-log a`` exceeds ``MAX_DELTA_ENERGY`` (NumPyro's
``max_delta_energy``, 1000). The potential here is a wall of height ``h``
beyond ``x = 1`` with zero gradient, so a proposal from ``x = 0`` across it
has energy error exactly ``h`` for MALA (the proposal densities cancel) and
for HMC (the momentum is unchanged by the leapfrog steps).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_array_equal

from numpyro_deer.core import (
    HMC,
    MALA,
    MAX_DELTA_ENERGY,
    DEERSolver,
    carry_at,
    deer_solve,
    make_step_fn,
    sequential_chain,
)


def _wall(height):
    def potential(x):
        return height * jnp.sum((x > 1.0).astype(x.dtype))

    return potential


def _one_step(transition, potential):
    """A step from ``x = 0`` whose proposal lands at ``x > 1``: MALA's at
    ``sqrt(2 eps) xi = 2 sqrt(2)``, HMC's at ``L eps xi = 4`` (``xi = 2``)."""
    tape = transition.make_tape(jax.random.key(0), 1, 1)._replace(
        noise=jnp.full((1, 1), 2.0), log_u=jnp.full((1,), np.log(0.5))
    )
    tape_t = jax.tree.map(lambda a: a[0], tape)
    x0 = jnp.zeros((1,))
    (x, _, _), info = transition.step(potential, 1.0, carry_at(potential, x0), tape_t)
    assert float(x[0]) == 0.0  # rejected
    return info


TRANSITIONS = [MALA(), HMC(num_steps=2)]


def test_threshold_is_numpyros_default():
    assert MAX_DELTA_ENERGY == 1000.0


@pytest.mark.parametrize("transition", TRANSITIONS, ids=["mala", "hmc"])
@pytest.mark.parametrize(
    "height, diverging",
    [
        (0.999 * MAX_DELTA_ENERGY, False),
        (1.001 * MAX_DELTA_ENERGY, True),
        (50.0, False),
        (np.inf, True),  # non-finite potential
    ],
)
def test_energy_error_above_the_threshold_is_diverging(transition, height, diverging):
    info = _one_step(transition, _wall(height))
    assert bool(info.diverging) == diverging
    assert not bool(info.accepted)
    np.testing.assert_allclose(float(info.accept_prob), np.exp(-height), rtol=1e-9)


@pytest.mark.parametrize("transition", TRANSITIONS, ids=["mala", "hmc"])
def test_nan_potential_is_diverging(transition):
    def potential(x):
        return jnp.where(x[0] > 1.0, jnp.nan, 0.0)

    info = _one_step(transition, potential)
    assert bool(info.diverging) and not bool(info.accepted)


@pytest.mark.parametrize("transition", TRANSITIONS, ids=["mala", "hmc"])
def test_deer_block_flags_the_same_divergences_as_the_sequential_chain(transition):
    # a Gaussian behind a wall of 2000 at x = 1.5: large steps cross it often;
    # the flag is a step info, so DEER's chain and flags are the sequential ones
    def potential(x):
        return 0.5 * jnp.sum(x**2) + 2000.0 * jnp.sum((x > 1.5).astype(x.dtype))

    x0 = jnp.array([0.3, -0.2])
    tape = transition.make_tape(jax.random.key(3), 64, 2, jnp.float64)
    step_size = 0.8
    states, infos = sequential_chain(transition, potential, x0, tape, step_size)
    step_fn = make_step_fn(transition, potential, step_size)
    solver = DEERSolver(jacobian="diag")
    deer_states, deer_infos, info = deer_solve(
        step_fn, x0, tape, jax.random.key(4), solver
    )
    assert bool(info.converged)
    np.testing.assert_allclose(deer_states, states, atol=1e-8)
    diverging = np.asarray(infos.diverging)
    assert 0 < diverging.sum() < diverging.size
    assert_array_equal(np.asarray(deer_infos.diverging), diverging)
    # every diverging step stayed behind the wall
    assert np.all(np.asarray(states)[diverging] <= 1.5)
