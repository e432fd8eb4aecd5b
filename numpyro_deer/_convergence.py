"""The warning for blocks whose DEER solve did not converge, in one place.

Both the block driver (which counts failed blocks in its loop) and the kernel
under stock ``numpyro.infer.MCMC`` (which reports from the compiled sampler
through :func:`jax.debug.callback`) raise it with the same advice.
"""

from __future__ import annotations

import warnings


class DEERConvergenceWarning(UserWarning):
    """Some blocks' DEER solve did not pass and were computed sequentially."""


def warn_unconverged(failed: int, blocks: int | None, stacklevel: int = 2) -> None:
    """Warn that ``failed`` blocks (of ``blocks``, if known) did not converge."""
    of = "" if blocks is None else f" of {blocks}"
    warnings.warn(
        f"DEER did not converge on {failed}{of} blocks; those blocks were "
        "finished one step after the other from the solve's front with the same "
        "tape, so the draws are the chain, but slower. Try a longer "
        "num_warmup (a chain still drifting towards the posterior when "
        "sampling starts is slow to solve), a smaller block_size, a "
        "longer sweep (sweep=16), jacobian='full' (small models), a larger "
        "max_iter, or "
        "method='sequential' for this model (docs: choosing options, "
        "limitations). To make this an error: warnings.simplefilter("
        "'error', numpyro_deer.DEERConvergenceWarning).",
        DEERConvergenceWarning,
        stacklevel=stacklevel,
    )
