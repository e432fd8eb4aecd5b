"""``DEERHMC(num_steps="auto")``: the leapfrog count chosen at the end of warmup.

Warmup takes HMC transitions of :data:`INITIAL_NUM_STEPS` leapfrog steps. At
its last step, with the step size and the metric adapted, every chain's
sampling transitions get :func:`~numpyro_deer.core.hmc.num_steps_for` of the
median adapted step size over the chains the program runs (vectorized
chains: all of them, so that they share one count; one chain: its own): a
trajectory of a quarter period in the metric, and never fewer steps than
warmup's. Measured (``benchmarks/trajectory_length.py``, 8 chains, smallest
ESS per 1,000 gradients of the values / of their squares): the Gym's item
response theory with the diagonal metric (D = 501, step size 0.2) 0.50 / 2.62
with 4 steps, 1.74 / 2.82 with the 8 chosen; a hierarchical logistic
regression (D = 91) 22 / 37 with 4, 27 / 53 with 5; eight schools, where the
quarter period would be 3 steps, 50 / 56 with 4 and 39 / 27 with 3 (hence
the floor). The count lives in the state (``DEERState.num_steps``, an
extra field as NumPyro's ``HMCState.num_steps`` is): it is chosen inside the
warmup step, the same under ``numpyro.infer.MCMC`` and
:class:`numpyro_deer.MCMC`, and a run continued from ``post_warmup_state``
keeps it. The blocks' transition takes the count as a
traced value (:class:`~numpyro_deer.core.hmc.TracedHMC`): the block programs
compile while warmup runs, before the count is known.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core.hmc import num_steps_for, split_leapfrog, with_leapfrog
from ..core.transition import Transition
from .block import DEERState
from .settings import KernelSettings

INITIAL_NUM_STEPS = 4
"""Leapfrog steps of warmup's transitions under ``num_steps="auto"``."""


def choose_num_steps(state: DEERState, num_warmup: int) -> DEERState:
    """``state`` (one chain's, or vectorized chains') with its ``num_steps``
    chosen where it has just taken the last warmup step (iteration
    ``num_warmup``, shared by vectorized chains), unchanged otherwise: the
    median over the chains is taken once, not at every warmup step."""

    def choose(s):
        eps = jnp.median(s.adapt_state.step_size)
        chosen = num_steps_for(eps, min_steps=INITIAL_NUM_STEPS)
        return s._replace(num_steps=jnp.broadcast_to(chosen, s.num_steps.shape))

    i = jnp.reshape(state.i, (-1,))[0]
    return jax.lax.cond(i == num_warmup, choose, lambda s: s, state)


def block_transition(
    settings: KernelSettings, state: DEERState, batched: bool
) -> Transition:
    """The transition of a block: the kernel's, or under ``num_steps="auto"``
    HMC with the state's count (vectorized chains share it; the largest is
    taken should they differ)."""
    if not settings.adapt_num_steps:
        return settings.transition
    count = jnp.max(state.num_steps) if batched else state.num_steps
    return with_leapfrog(split_leapfrog(settings.transition)[0], count)
