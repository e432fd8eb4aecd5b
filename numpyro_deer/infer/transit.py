"""The warmup check: was a chain still in transit when warmup ended?

:class:`numpyro_deer.MCMC` records every warmup step's potential energy and,
at the end of warmup, computes for each chain the split R-hat (Vehtari et al.,
2021) of the potential energy over the last half of warmup, split into its two
quarters. A chain that has reached the posterior gives about 1 there. A chain
still moving towards the posterior (its potential energy still falling, or
rising from a start at the mode) has a mean that differs between the quarters
by more than their spread, and gets a :class:`WarmupTransitWarning` that says
what was seen and suggests a longer ``num_warmup``. Such a chain's first draws
are not posterior draws yet, and DEER solves its blocks slowly.
"""

from __future__ import annotations

import math

import numpy as np
from numpyro.diagnostics import split_gelman_rubin


class WarmupTransitWarning(UserWarning):
    """A chain was still moving towards the posterior when warmup ended."""


TRANSIT_RHAT = 1.5
"""Split R-hat of the potential energy over the last half of warmup above
which a chain counts as in transit."""


MIN_STEPS = 100
"""Shortest warmup checked: its last half must hold 50 steps."""


def warmup_transit(potential_energy: np.ndarray, num_warmup: int) -> str | None:
    """A warning message if some chain was in transit at the end of warmup.

    ``potential_energy``: shape ``(chains, num_warmup)``, every warmup step.
    Checks the last half of warmup (warmups shorter than :data:`MIN_STEPS`
    are not checked): per chain, the split R-hat of the potential
    energy between its two quarters. ``None`` when no chain exceeds
    :data:`TRANSIT_RHAT`.
    """
    pe = np.asarray(potential_energy, dtype=np.float64)
    if pe.ndim == 1:
        pe = pe[None]
    steps = pe.shape[1]
    if steps < MIN_STEPS or not np.all(np.isfinite(pe)):
        return None
    half = pe[:, steps - steps // 2 :]
    rhat = np.array([float(split_gelman_rubin(chain[None])) for chain in half])
    bad = np.flatnonzero(~(rhat <= TRANSIT_RHAT))
    if bad.size == 0:
        return None
    worst = bad[np.argmax(rhat[bad])]
    quarter = half.shape[1] // 2
    before = half[worst, :quarter].mean()
    after = half[worst, quarter:].mean()
    suggest = 100 * math.ceil(4 * num_warmup / 100)
    chains = ", ".join(str(c) for c in bad)
    return (
        f"The potential energy was still drifting at the end of warmup "
        f"(chain{'s' if bad.size > 1 else ''} {chains} of {pe.shape[0]}): over "
        f"the last {half.shape[1]} warmup steps of chain {worst} its mean went "
        f"from {before:.6g} to {after:.6g} (split R-hat {rhat[worst]:.2f} "
        f"between the two halves; a stationary chain gives about 1). The chain "
        f"was probably still moving towards the posterior when sampling "
        f"started: its first draws are not yet posterior draws, and DEER "
        f"solves such blocks slowly. Try num_warmup={suggest} or more. To "
        "silence: warnings.simplefilter('ignore', "
        "numpyro_deer.WarmupTransitWarning)."
    )
