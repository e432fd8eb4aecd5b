"""How a block whose DEER solve did not converge is reported, in one place.

The kernel's ``on_failure`` decides what such a block becomes (see
:class:`~numpyro_deer.DEERMALA`); this module says so. The block driver counts
failed blocks in its loop and warns after the run; the kernel under stock
``numpyro.infer.MCMC`` reports from the compiled sampler through
:func:`jax.debug.callback`; ``on_failure="raise"`` raises
:class:`DEERConvergenceError` from the first failed block, in either driver.
Each message says why the solve stopped (:class:`~numpyro_deer.core.RESULTS`).
"""

from __future__ import annotations

import contextlib
import warnings

import jax
import numpy as np

from ..core.newton import RESULTS

ON_FAILURE = ("sequential", "warn", "raise")

_ADVICE = (
    "Try a longer num_warmup (a chain still drifting towards the posterior "
    "when sampling starts is slow to solve), a smaller block_size, "
    "DEERSolver(sweep=16), DEERSolver(jacobian='full') (small models), a "
    "larger DEERSolver(max_iter=...), or method='sequential' for this model "
    "(docs: choosing options, limitations)."
)


class DEERConvergenceWarning(UserWarning):
    """Some blocks' DEER solve did not converge (see ``on_failure``)."""


class DEERConvergenceError(RuntimeError):
    """A block's DEER solve did not converge and ``on_failure="raise"``."""


def _reasons(result_bits: int) -> str:
    codes = [c for c in range(1, 4) if result_bits >> c & 1]
    return "; ".join(RESULTS.message(c) for c in codes) or "unknown"


def warn_unconverged(
    failed: int,
    blocks: int | None,
    on_failure: str = "sequential",
    result_bits: int = 0,
    stacklevel: int = 2,
) -> None:
    """Warn that ``failed`` blocks (of ``blocks``, if known) did not converge.

    ``result_bits`` has bit ``c`` set for every result code ``c`` seen.
    """
    of = "" if blocks is None else f" of {blocks}"
    if on_failure == "warn":
        fate = (
            "on_failure='warn' kept each solve's last iterate, so the draws past "
            "a solve's front are NOT the chain (blocks that turned non-finite "
            "were finished sequentially)."
        )
    else:
        fate = (
            "those blocks were finished one step after the other from the "
            "solve's front with the same tape, so the draws are the chain, but "
            "slower."
        )
    warnings.warn(
        f"DEER did not converge on {failed}{of} blocks ({_reasons(result_bits)}); "
        f"{fate} {_ADVICE} To make this an error: DEERMALA(on_failure='raise') "
        "or warnings.simplefilter('error', numpyro_deer.DEERConvergenceWarning).",
        DEERConvergenceWarning,
        stacklevel=stacklevel,
    )


def raise_unconverged(result) -> None:
    """Raise :class:`DEERConvergenceError` for the first non-zero result code."""
    codes = np.asarray(result).reshape(-1)
    code = int(codes[np.flatnonzero(codes)[0]])
    raise DEERConvergenceError(
        f"DEER did not converge on a block ({RESULTS.message(code)}) and "
        f"on_failure='raise'. {_ADVICE}"
    )


@contextlib.contextmanager
def reraise_convergence_error():
    """Turn the runtime error of a raising callback back into
    :class:`DEERConvergenceError` (JAX wraps exceptions raised on the host)."""
    try:
        yield
    except jax.errors.JaxRuntimeError as err:
        text = str(err)
        marker = "DEERConvergenceError: "
        if marker not in text:
            raise
        message = text.split(marker, 1)[1].strip().splitlines()[0]
        raise DEERConvergenceError(message) from None
