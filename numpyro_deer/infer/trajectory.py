"""``DEERHMC(num_steps="auto")``: the leapfrog count chosen at the end of warmup.

Warmup takes HMC transitions of the kernel's initial count
(:data:`INITIAL_NUM_STEPS`). At its last step, with the step size and the
metric adapted, every chain's sampling transitions get
:func:`~numpyro_deer.core.hmc.num_steps_for` of the median adapted step size
over the chains the program runs (vectorized chains: all of them, so that
they share one count; one chain: its own), a trajectory of a quarter period
in the metric. The count lives in the state (``DEERState.num_steps``, an
extra field as NumPyro's ``HMCState.num_steps`` is), so ``numpyro.infer.MCMC``
and :class:`numpyro_deer.MCMC` give the same draws, and a run continued from
``post_warmup_state`` keeps it. The blocks' transition takes the count as a
traced value (:class:`~numpyro_deer.core.hmc.TracedHMC`): the block programs
compile while warmup runs, before the count is known.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..core.hmc import num_steps_for, split_leapfrog, with_leapfrog
from .block import DEERState

INITIAL_NUM_STEPS = 4
"""Leapfrog steps of warmup's transitions under ``num_steps="auto"``."""


def choose_num_steps(state: DEERState, num_warmup: int, batched: bool) -> DEERState:
    """``state`` with its ``num_steps`` chosen where it has just taken the
    last warmup step (iteration ``num_warmup``), unchanged otherwise."""
    i = jnp.reshape(state.i, (-1,))[0]
    chosen = num_steps_for(jnp.median(state.adapt_state.step_size))
    if batched:
        chosen = jnp.broadcast_to(chosen, state.num_steps.shape)
    return state._replace(num_steps=jnp.where(i == num_warmup, chosen, state.num_steps))


def block_transition(settings: Any, state: DEERState, batched: bool):
    """The transition of a block: the kernel's, or under ``num_steps="auto"``
    HMC with the state's count (vectorized chains share it; the largest is
    taken should they differ)."""
    if not settings.adapt_num_steps:
        return settings.transition
    count = jnp.max(state.num_steps) if batched else state.num_steps
    return with_leapfrog(split_leapfrog(settings.transition)[0], count)
