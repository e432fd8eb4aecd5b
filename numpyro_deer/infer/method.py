"""How a run computes its blocks: the method, the block size, the driver.

``method="auto"`` (the default of :class:`~numpyro_deer.DEERMALA`) is decided
once per kernel, by :class:`numpyro_deer.MCMC` during the first run that can
measure both methods:

* on a CPU, the sequential scan. A CPU has few cores to spread a block's
  ``B`` evaluations over, and DEER was slower than the sequential chain on
  every benchmark model measured on a CPU (``benchmarks/method_auto.py``);
* on an accelerator, the faster of the two *measured*: both programs compile
  in the background while warmup runs; the first block after warmup is
  computed sequentially, the first block after the DEER program is compiled
  with DEER (blocks in between sequentially), each timed on its own, and the
  rest of the run uses the faster. Every block is a block of the chain (the
  two methods compute the same chain from the same tape), so the measurement
  costs only the compiling of the method not chosen, and a run never waits
  for DEER's compile, which is the longer: a run that ends first keeps the
  sequential scan as a provisional choice (``MethodChoice.final`` false)
  with that scan's time per block, and the first block of a later run
  (blocks of the same size) after DEER is compiled is computed with DEER and
  completes the measurement. So a run of a single block (a loop of runs
  resuming from ``post_warmup_state``) never waits for DEER's compile
  either.

Where nothing can be measured (stock ``numpyro.infer.MCMC``, chains inside
``pmap``), ``"auto"`` is the device's rule: sequential on a CPU, DEER
elsewhere. The choice is
:attr:`~numpyro_deer.DEERMALA.method_chosen`, with its reason and timings in
:attr:`~numpyro_deer.DEERMALA.method_choice`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class SlowDriverWarning(UserWarning):
    """``DEERMALA`` runs inside stock ``numpyro.infer.MCMC`` (one draw per loop)."""


SLOW_DRIVER_MESSAGE = (
    "{name} runs inside numpyro.infer.MCMC, which calls the kernel once per "
    "draw: correct (the same draws as numpyro_deer.MCMC for the same key), but "
    "the per-draw loop costs more than a whole sequential step on a GPU. "
    "numpyro_deer.MCMC takes the same arguments and advances one block per "
    "loop iteration: `from numpyro_deer import MCMC`. To silence this: "
    "warnings.simplefilter('ignore', numpyro_deer.SlowDriverWarning)."
)


class MethodChoice(NamedTuple):
    """What ``method="auto"`` chose, and why.

    Attributes:
        method: ``"deer"`` or ``"sequential"``.
        reason: one line, e.g. ``"measured: deer 0.012 s, sequential 0.210 s
            per block of 4096"`` or ``"CPU: the sequential scan"``.
        seconds: seconds per block of each method measured (empty if none).
        final: false for a provisional choice: the run ended before the
            DEER program was compiled, so only the sequential scan was
            measured; a later run measures DEER.
        block_size: the block size ``seconds`` were measured at (``None``
            if nothing was measured). A later run of blocks of this size
            keeps the sequential scan's time and measures only DEER.
    """

    method: str
    reason: str
    seconds: dict
    final: bool = True
    block_size: int | None = None


class MethodMemory:
    """What ``method="auto"`` chose for one kernel (``choice``, ``None``
    before a run chose): the one thing a kernel keeps from a run for the
    next, written by :class:`numpyro_deer.MCMC` through the kernel's
    ``remember_method``."""

    def __init__(self, choice: MethodChoice | None = None):
        self.choice = choice


def device_method() -> str:
    """The method for a device without a measurement: sequential on a CPU."""
    return "sequential" if jax.default_backend() == "cpu" else "deer"


def device_choice() -> MethodChoice:
    """The choice without a measurement, with its reason."""
    backend = jax.default_backend()
    if backend == "cpu":
        return MethodChoice(
            "sequential", "CPU: the sequential scan (DEER pays on accelerators)", {}
        )
    return MethodChoice("deer", f"{backend}: DEER (not measured)", {})


def _per_block(seconds: dict, block_size: int) -> str:
    times = ", ".join(f"{m} {s:.3g} s" for m, s in sorted(seconds.items()))
    return f"per block of {block_size}: {times}"


def measured_choice(seconds: dict, block_size: int) -> MethodChoice:
    """The faster method of ``seconds`` (method -> seconds for one block)."""
    method = min(seconds, key=seconds.get)
    return MethodChoice(
        method,
        f"measured {_per_block(seconds, block_size)}",
        dict(seconds),
        block_size=block_size,
    )


def pending_choice(seconds: dict, block_size: int) -> MethodChoice:
    """The sequential scan, provisionally: the run ended before DEER's
    program was compiled (``seconds`` holds the sequential scan's time)."""
    return MethodChoice(
        "sequential",
        f"provisional, {_per_block(seconds, block_size)}; the run ended before "
        "deer was compiled; a later run measures it",
        dict(seconds),
        final=False,
        block_size=block_size,
    )


def unfit_choice(message: str, seconds: dict, block_size: int) -> MethodChoice:
    """The sequential scan: DEER's block needs more memory than the device
    has free (``message``, the memory check's; ``seconds`` holds the
    sequential scan's time)."""
    return MethodChoice(
        "sequential",
        f"deer's block does not fit the device's free memory ({message}); "
        f"{_per_block(seconds, block_size)}",
        dict(seconds),
        block_size=block_size,
    )


def fitted_block_size(block_size: int, num_steps: int) -> int:
    """The block size for a run of ``num_steps`` sampling steps per chain.

    At most ``block_size``, and the blocks tile the run: with ``n =
    ceil(num_steps / block_size)`` blocks each has ``ceil(num_steps / n)``
    steps, so the last block computes fewer than ``n`` steps that no draw
    uses, where blocks of ``block_size`` could leave up to ``block_size - 1``
    unused. The solver needs no particular size (its segments round up), so
    no further rounding. ``num_steps <= 0`` (a warmup-only run) keeps
    ``block_size``.
    """
    if num_steps <= 0:
        return block_size
    num_blocks = -(-num_steps // block_size)
    return -(-num_steps // num_blocks)
