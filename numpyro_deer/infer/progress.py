"""The progress bar of :class:`numpyro_deer.MCMC`.

``tqdm.auto``: a widget in notebooks, text elsewhere. The bar shows its stage:
*compiling* (no rate and no ETA: nothing has run yet), *warmup* (updated
about every :data:`UPDATE_SECONDS`: the warmup loop runs in chunks sized from
the measured rate), then *sample* (one update per block), with the step size,
the acceptance rate and, per block, the Newton iterations and draws per second.
The rate and ETA come from runs only: the time spent compiling is left out.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import tqdm.auto

UPDATE_SECONDS = 2.0
"""Target seconds between updates of the bar in warmup."""

# the draws per second of the last block are in the postfix; tqdm's own rate
# would average over the compiling too
_WITH_ETA = (
    "{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
    "[{elapsed}<{remaining}{postfix}]"
)
_WITHOUT_ETA = (
    "{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
)


class Progress:
    """A tqdm bar over warmup and sampling draws, with stages."""

    def __init__(self, total: int, enabled: bool, phase: str | None = None):
        self._phase = phase
        self._bar = tqdm.auto.tqdm(
            total=total,
            unit="draws",
            dynamic_ncols=True,
            disable=not enabled,
            bar_format=_WITHOUT_ETA,
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._bar.close()

    def compiling(self, what: str) -> None:
        """Show that ``what`` compiles; the rate and ETA are hidden."""
        self._bar.bar_format = _WITHOUT_ETA
        self._bar.set_description(f"compiling {what}", refresh=True)

    def running(self, stage: str) -> None:
        """A run starts: show the rate and ETA, measured from now on."""
        self._bar.bar_format = _WITH_ETA
        self._bar.set_description(self._phase or stage, refresh=False)
        # the time spent compiling is not part of the rate
        self._bar.last_print_t = time.time()

    @property
    def shows(self) -> bool:
        """Whether the bar shows (else its postfix need not be computed)."""
        return not self._bar.disable

    def postfix(self, text: str) -> None:
        self._bar.set_postfix_str(text, refresh=False)

    def advance(self, draws: int) -> None:
        self._bar.update(draws)


def next_chunk(done: int, remaining: int, seconds: float, last: int) -> int:
    """Warmup steps for the next chunk: about :data:`UPDATE_SECONDS` at the
    rate of the last chunk (``last`` steps in ``seconds``), growing at most
    fourfold per chunk; the first chunk (``done == 0``) is 10 steps."""
    if done == 0 or last == 0:
        return max(1, min(remaining, 10))
    rate = last / max(seconds, 1e-6)
    size = int(min(rate * UPDATE_SECONDS, 4 * last))
    return max(1, min(remaining, size))


def warmup_postfix(state) -> str:
    return _postfix(
        *jax.device_get((state.adapt_state.step_size, state.mean_accept_prob))
    )


def _postfix(step_size, accept) -> str:
    return f"step size {np.mean(step_size):.3g}, acc. {np.mean(accept):.2f}"


def block_postfix(state, method: str, draws: int, seconds: float) -> str:
    # one transfer from the device
    its = state.block.info.iterations if method == "deer" else None
    step_size, accept, its = jax.device_get(
        (state.adapt_state.step_size, state.mean_accept_prob, its)
    )
    parts = [method, _postfix(step_size, accept)]
    if its is not None:
        parts.append(f"{int(np.max(its))} Newton its")
    parts.append(f"{draws / max(seconds, 1e-9):,.0f} draws/s")
    return ", ".join(parts)
