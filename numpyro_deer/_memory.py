"""Memory of a block, checked against the device before it is allocated.

A DEER block holds ``O(B D)`` states plus, per Newton iteration, the
intermediates of ``B`` evaluations of the step and its JVP: for a model with
``N`` observations that is ``O(B N)`` and can exceed a GPU's memory long before
``B D`` does. Rather than guess, the block driver asks XLA: it compiles the
block step once ahead of time, reads the compiled program's memory analysis,
and compares it with what the device reports free. Devices that report no
memory statistics (the CPU) are not checked.
"""

from __future__ import annotations

import jax

_GIB = 2.0**30


def free_device_bytes(device=None) -> int | None:
    """Bytes the device can still allocate, or ``None`` if it does not say."""
    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without statistics
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def compiled_bytes(compiled) -> int | None:
    """Arguments, outputs and temporaries of a compiled program, in bytes."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - getattr(analysis, "alias_size_in_bytes", 0)
    )


def check_block_memory(required: int | None, free: int | None, block_size: int):
    """Raise ``ValueError`` if a block needs more memory than the device has free.

    The suggested ``block_size`` assumes memory grows about linearly with it,
    which holds for the per-step arrays that dominate large blocks.
    """
    if required is None or free is None or required <= free:
        return
    suggestion = max(1, int(block_size * free / required * 0.8))
    raise ValueError(
        f"DEERMALA(block_size={block_size}) needs about {required / _GIB:.2f} GiB "
        f"of device memory per block, but the device has {free / _GIB:.2f} GiB "
        f"free. Set block_size={suggestion} or smaller, or a window "
        f"(DEERMALA(window=...)) so that an iteration evaluates fewer steps."
    )
