"""Memory of a block, checked against the device before it is allocated.

A DEER block holds ``O(B D)`` states plus, per Newton iteration, the
intermediates of ``B`` evaluations of the step and its JVP: for a model with
``N`` observations that is ``O(B N)`` and can exceed a GPU's memory long before
``B D`` does. Rather than guess, the block driver asks XLA: it compiles the
block step once ahead of time, reads the compiled program's memory analysis,
and compares it with what the device reports free. Devices that report no
memory statistics (the CPU) are not checked.

One array comes earlier: the kernel's buffer of a block's draws, ``B x D``
per chain, is part of the state ``init`` returns, so :func:`check_buffer_memory`
compares its size with the free memory before ``init`` allocates it (a buffer
larger than the device would otherwise fail inside XLA, before the block step
could be compiled and checked).
"""

from __future__ import annotations

import jax
import numpy as np

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


def check_block_memory(
    required: int | None,
    free: int | None,
    block_size: int,
    what: str = "per block",
    kernel: str = "DEERMALA",
    multiple: int = 1,
):
    """Raise ``ValueError`` if a block needs more memory than the device has free.

    The suggested ``block_size`` assumes memory grows about linearly with it,
    which holds for the per-step arrays that dominate large blocks. ``what``
    says what ``required`` covers, for the message; the suggestion is a
    multiple of ``multiple`` (a mesh's device count).
    """
    if required is None or free is None or required <= free:
        return
    suggestion = int(block_size * free / required * 0.8)
    suggestion = max(multiple, suggestion - suggestion % multiple)
    raise ValueError(
        f"{kernel}(block_size={block_size}) needs about {required / _GIB:.2f} GiB "
        f"of device memory {what}, but the device has {free / _GIB:.2f} GiB "
        f"free. Set block_size={suggestion} or smaller."
    )


def check_buffer_memory(
    block_size: int,
    dim: int,
    dtype,
    num_chains: int = 1,
    device=None,
    kernel: str = "DEERMALA",
    multiple: int = 1,
) -> None:
    """Raise ``ValueError`` if the buffer of a block's draws cannot fit.

    The buffer holds ``num_chains x block_size`` states of ``dim`` values and
    four per-step scalars. A solve needs several times this (the compiled
    check in the driver measures it), so passing here is necessary, not
    sufficient.
    """
    itemsize = np.dtype(dtype).itemsize
    required = num_chains * block_size * (dim + 4) * itemsize
    check_block_memory(
        required,
        free_device_bytes(device),
        block_size,
        what=f"for the buffer of its draws alone ({num_chains} x {block_size} "
        f"x {dim} values)",
        kernel=kernel,
        multiple=multiple,
    )
