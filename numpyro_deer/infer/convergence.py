"""How a block whose DEER solve did not converge is reported, in one place.

The kernel's ``on_failure`` decides what such a block becomes (see
:class:`~numpyro_deer.DEERMALA`); this module says so. The block driver counts
failed blocks in its loop and warns after the run; the kernel under stock
``numpyro.infer.MCMC`` reports from the compiled sampler through
:func:`jax.debug.callback`; ``on_failure="raise"`` raises
:class:`DEERConvergenceError` from the first failed block, in either driver.
Each message says why the solve stopped (:class:`~numpyro_deer.core.RESULTS`).

**How the error crosses the compiled program.** Under ``on_failure="raise"``
the kernel calls :func:`raise_unconverged` through :func:`jax.debug.callback`
with the block's result codes. It builds the :class:`DEERConvergenceError` of
the first failing code and raises it; JAX turns an exception raised on the
host into its own :class:`jax.errors.JaxRuntimeError`, which keeps only the
text (no ``__cause__``), so the callback also files the error object in a
small module-level registry, numbered in order. :func:`reraise_convergence_error`
(the driver's boundary) notes the registry's number when it is entered and,
when a ``JaxRuntimeError`` comes out, raises the first error filed since then:
the very object the callback built, with its :attr:`DEERConvergenceError.result`
code. No message text is read. A ``JaxRuntimeError`` with no error filed since
the boundary was entered is not ours and goes on unchanged. Under stock
``numpyro.infer.MCMC`` there is no such boundary and the ``JaxRuntimeError``
itself reaches the caller (its text names ``DEERConvergenceError`` and the
reason); the registry keeps only the last few errors.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import warnings

import jax
import numpy as np

from ..core.results import RESULTS

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
    """A block's DEER solve did not converge and ``on_failure="raise"``.

    Attributes:
        result: the :class:`~numpyro_deer.core.RESULTS` code of the solve;
            its ``message`` is in the error's text.
    """

    def __init__(self, result: int):
        self.result = RESULTS(int(result))
        super().__init__(
            f"DEER did not converge on a block ({self.result.message}) and "
            f"on_failure='raise'. {_ADVICE}"
        )

    def __reduce__(self):
        return type(self), (int(self.result),)


def _reasons(result_bits: int) -> str:
    codes = [c for c in RESULTS.failures() if result_bits >> c & 1]
    return "; ".join(c.message for c in codes) or "unknown"


def warn_unconverged(
    failed: int,
    blocks: int | None,
    on_failure: str = "sequential",
    result_bits: int = 0,
    stacklevel: int = 2,
    kernel: str = "the kernel",
) -> None:
    """Warn that ``failed`` blocks (of ``blocks``, if known; a block of each
    chain counts once) did not converge.

    ``result_bits`` has bit ``c`` set for every result code ``c`` seen;
    ``kernel`` is the kernel class's name, for the advice.
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
        f"{fate} {_ADVICE} To make this an error: {kernel}(on_failure='raise') "
        "or warnings.simplefilter('error', numpyro_deer.DEERConvergenceWarning).",
        DEERConvergenceWarning,
        stacklevel=stacklevel,
    )


# Errors raised by raise_unconverged inside compiled programs, numbered in
# order: (number, error). Bounded: errors no boundary claims (stock MCMC) fall
# off the end.
_RAISED: collections.deque[tuple[int, DEERConvergenceError]] = collections.deque(
    maxlen=64
)
_NUMBERS = itertools.count()
_LOCK = threading.Lock()


def raise_unconverged(result) -> None:
    """Raise :class:`DEERConvergenceError` for the first non-zero result code.

    Meant to run on the host through :func:`jax.debug.callback`: the error is
    filed for :func:`reraise_convergence_error` before it is raised.
    """
    codes = np.asarray(result).reshape(-1)
    error = DEERConvergenceError(codes[np.flatnonzero(codes)[0]])
    with _LOCK:
        _RAISED.append((next(_NUMBERS), error))
    raise error


@contextlib.contextmanager
def reraise_convergence_error():
    """Raise the :class:`DEERConvergenceError` that a callback raised inside
    the block, instead of the ``JaxRuntimeError`` JAX turned it into.

    The error is the object :func:`raise_unconverged` filed (see the module
    docstring); a runtime error with none filed since entry goes on unchanged.
    """
    with _LOCK:
        entered = next(_NUMBERS)
    try:
        yield
    except jax.errors.JaxRuntimeError:
        with _LOCK:
            ours = [error for number, error in _RAISED if number > entered]
            kept = [(n, e) for n, e in _RAISED if n < entered]
            _RAISED.clear()
            _RAISED.extend(kept)
        if not ours:
            raise
        raise ours[0] from None
