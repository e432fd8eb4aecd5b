"""Memory of a block, checked against the device before it is allocated.

A DEER block holds ``O(B D)`` states plus, per Newton iteration, the
intermediates of ``B`` evaluations of the step and its JVP: for a model with
``N`` observations that is ``O(B N)`` and can exceed a GPU's memory long before
``B D`` does. Rather than guess, the block driver asks XLA: it compiles the
block step once ahead of time, reads the compiled program's memory analysis,
and compares it with what the device reports free. Devices that report no
memory statistics (the CPU) are not checked.

Vectorized chains (``chain_method="vectorized"``) multiply a block's memory
by the chain count. Where the block of all chains does not fit but that of
one chain does, :func:`plan_chain_group` picks the largest group of chains
that fits, measured on the compiled program: the block is solved ``vmap``-ped
within a group and group after group (``lax.map``), with the block size the
user chose. Only where one chain alone does not fit does the check raise.

The buffer of a block's draws (``B x D`` per chain, in the state ``init``
returns) is checked before ``init`` allocates it (:func:`check_buffer_memory`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from . import compile_cache

_GIB = 2.0**30


def free_device_bytes(device=None) -> int | None:
    """Bytes the device can still allocate in one piece (``None``: it does not
    say): a program's temporaries are one allocation, and the GPU allocator
    keeps the regions it grew, so after a 34 GiB program a 43 GiB one fails
    with 57 GiB free. At most the larger of the largest free block and the
    memory not yet grown, where the device reports them."""
    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without statistics
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    limit = int(stats["bytes_limit"])
    free = limit - int(stats.get("bytes_in_use", 0))
    if "largest_free_block_bytes" in stats and "pool_bytes" in stats:
        ungrown = limit - int(stats["pool_bytes"])
        return min(free, max(int(stats["largest_free_block_bytes"]), ungrown))
    return free


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
    """Raise ``ValueError`` if a block needs more memory than the device has
    free, suggesting a ``block_size`` (a multiple of ``multiple``) on a line
    through zero; ``what`` says what ``required`` covers."""
    if required is None or free is None or required <= free:
        return
    suggestion = int(block_size * free / required * 0.8)
    suggestion = max(multiple, suggestion - suggestion % multiple)
    raise ValueError(
        f"{kernel}(block_size={block_size}) needs about {_size(required)} "
        f"of device memory {what}, but the device has {_size(free)} "
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


class CompileOutOfMemory(NamedTuple):
    """A block program whose compile ran out of device memory (XLA's
    autotuner allocates the program's largest buffers while compiling), with
    the shapes it was to run on (``jax.ShapeDtypeStruct``), to plan groups of
    chains from."""

    error: Exception
    args: Any


def is_out_of_memory(error: Exception) -> bool:
    """Whether ``error`` is XLA's out-of-device-memory error."""
    return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


FILL = 0.9
"""Fraction of the free memory a group is planned to take (memory ~ linear)."""

MAX_COMPILES = 3
"""Block programs :func:`plan_chain_group` compiles at most."""


class ChainGroups(NamedTuple):
    """A block of vectorized chains solved in groups (:func:`plan_chain_group`).

    Attributes:
        size: chains per group (``vmap``).
        groups: groups, solved one after the other (``lax.map``).
        required: bytes of the compiled program with groups of ``size``.
        compiled: that compiled program.
    """

    size: int
    groups: int
    required: int | None
    compiled: Any


def group_size(num_chains: int, group: int) -> int:
    """The group size :func:`~.chains.map_chain_groups` uses for groups of at
    most ``group`` chains: ``ceil(C / n)`` with ``n = ceil(C / group)`` groups."""
    return -(-num_chains // -(-num_chains // group))


def plan_chain_group(
    required: int | None,
    free: int,
    num_chains: int,
    compile_group: Callable[[int], Any],
    block_size: int,
    kernel: str = "DEERMALA",
    multiple: int = 1,
) -> ChainGroups:
    """The largest group of chains whose block fits ``free`` bytes.

    ``required`` is the block program's memory with all ``num_chains`` chains
    at once (more than ``free``); ``compile_group(g)`` compiles the block in
    groups of ``g`` chains. Memory is about linear in the group size, ``a +
    b g`` (``a``: the arguments of every chain, the collection of draws;
    ``b g``: a group's solve). The first guess takes ``a = 0`` (``b =
    required / C``) and aims at :data:`FILL` of ``free``; a guess that does
    not fit is refined on the line through the last two measured points.
    Groups of one chain are the last resort; at most :data:`MAX_COMPILES`
    programs are compiled. ``required=None`` (the compile of all chains ran
    out of memory): one chain's program is compiled first for the line
    through zero, and a group that fits on it is widened once (:func:`_wider`).

    Raises:
        ValueError: a block of one chain does not fit either
            (:func:`check_block_memory`'s message, with its ``block_size``).
    """
    one_chain = None
    if required is None:  # unknown (its compile ran out of memory): one chain's
        one = compile_group(1)
        used = compiled_bytes(one)
        if used is None or used <= free / num_chains:
            return ChainGroups(1, num_chains, used, one)
        required = used * num_chains  # the line through zero and one chain
        one_chain = (1, used)
    points = [(num_chains, required)]
    guess = math.floor(num_chains * FILL * free / required)
    for attempt in range(MAX_COMPILES):
        last = attempt == MAX_COMPILES - 1
        g = 1 if last else group_size(num_chains, min(max(guess, 1), num_chains - 1))
        compiled = compile_group(g)
        used = compiled_bytes(compiled)
        groups = -(-num_chains // g)
        if used is None or used <= free:
            plan = ChainGroups(g, groups, used, compiled)
            if one_chain is None or used is None or g == 1:
                return plan
            return _wider(plan, one_chain, free, num_chains, compile_group)
        if g == 1:
            what = f"per block with one of its {num_chains} vectorized chains at a time"
            check_block_memory(used, free, block_size, what, kernel, multiple)
        points.append((g, used))
        (g0, b0), (g1, b1) = points[-2], points[-1]
        slope = (b0 - b1) / (g0 - g1) if b0 > b1 else b1 / g1
        # below 1: the line says one chain does not fit
        guess = min(_filling(free, slope, g1, b1), g - 1)
    raise AssertionError("unreachable: the last attempt is a group of one")


def _filling(free: int, slope: float, group: int, used: int) -> int:
    """The group at :data:`FILL` of ``free`` on a line through ``(group, used)``."""
    return math.floor((FILL * free - (used - slope * group)) / slope)


def _wider(plan: ChainGroups, one_chain, free, num_chains, compile_group):
    """``plan``, or a group at least twice as large that fits, on the line through
    both measured points (through zero, the fixed part, every chain's
    arguments, counts per chain); one more compile, kept if it fits."""
    (g1, b1), g, b = one_chain, plan.size, plan.required
    slope = (b - b1) / (g - g1)
    if slope <= 0:
        return plan
    wider = _filling(free, slope, g, b)
    if wider < 2 * g:
        return plan
    wider = group_size(num_chains, min(wider, num_chains - 1))
    try:
        compiled = compile_group(wider)
    except Exception as error:  # noqa: BLE001 - XLA's runtime error
        if not is_out_of_memory(error):
            raise
        return plan
    used = compiled_bytes(compiled)
    fits = used is not None and used <= free
    return ChainGroups(wider, -(-num_chains // wider), used, compiled) if fits else plan


def chain_groups_message(
    kernel: str,
    num_chains: int,
    required: int | None,
    free: int,
    plan: ChainGroups,
    name: str = "block",
) -> str:
    """The warning of a program (``name``: a block's method, or
    ``"window_end"``) solved in groups of chains."""
    what = "Hessian mass matrix" if name == "window_end" else "block"
    per_group = "an unknown amount" if plan.required is None else _size(plan.required)
    needs = (
        "ran out of device memory while compiling"
        if required is None
        else f"needs about {_size(required)} of device memory"
    )
    advice = (
        "The block size is kept; a smaller block_size solves more chains at once."
        if what == "block"
        else "The draws are the same as with all chains at once."
    )
    return (
        f"{kernel}: the {what} of all {num_chains} vectorized chains {needs}, "
        f"and the device has {_size(free)} free. The chains are solved in "
        f"{plan.groups} groups of {plan.size} chains, one group after the "
        f"other: {per_group} per group's {what}, of the {_size(free)} free. "
        f"{advice}"
    )


def with_chain_group(program, group: int | None):
    """A copy of a block program (:class:`~.program.BlockProgram`) whose
    vectorized chains are solved in groups of ``group`` (``None``: all at
    once): its settings' ``chain_group``, part of its compile-cache key."""
    if program.settings.chain_group == group:
        return program
    settings = dataclasses.replace(program.settings, chain_group=group)
    return dataclasses.replace(program, settings=settings)


def _size(n: int) -> str:
    """Bytes in GiB, MiB or KiB, whichever reads best."""
    for unit, scale in (("GiB", _GIB), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def check_block_program(kernel, name: str, compiled, checked: set) -> None:
    """Raise ``ValueError`` with a ``block_size`` that fits where a compiled
    block program needs more than the device's free memory, before it runs;
    each ``name`` once (recorded in ``checked``), not where the device has no
    memory statistics (the CPU)."""
    free = free_device_bytes()
    if free is None or name in checked:
        return
    check_block_memory(
        compiled_bytes(compiled),
        free,
        kernel.program.block_size,
        kernel=type(kernel).__name__,
        multiple=kernel.block_multiple,
    )
    checked.add(name)


def fit_program(
    kernel,
    num_chains: int,
    run,
    name: str,
    compiled,
    checked,
    grouped: Callable[[str, int], Any],
    ungrouped: tuple[str, ...] = (),
):
    """The program ``name`` to run (a block step, or the Hessian mass
    matrix's ``"window_end"``): ``compiled`` if it fits the device's free
    memory (:func:`check_block_program`), else, for vectorized chains
    (``run``: the :class:`~.host_run.HostRun`), the same program with the
    chains in groups, the largest that fits (:func:`plan_chain_group`;
    ``grouped(name, group)`` is the program to lower for a group), with a
    warning. ``compiled`` may be a :class:`CompileOutOfMemory`. Never for
    the names in ``ungrouped``: ``method="auto"``'s DEER trial would wait for
    the groups' compiles (item response theory, 256 chains, an H100: over
    160 s) where the sequential scan is ready.

    Raises ``ValueError`` (the memory check's) where even one chain's program
    does not fit, or the chains are not vectorized or not to be grouped.
    """
    free = free_device_bytes()
    groups = run.batched and kernel.mesh is None and num_chains > 1
    groups = groups and name not in ungrouped
    if name == "window_end" and not groups:  # runs as it is (or fails: XLA's)
        if isinstance(compiled, CompileOutOfMemory):
            raise compiled.error
        return compiled
    if isinstance(compiled, CompileOutOfMemory):
        if not groups or free is None:
            raise compiled.error
        required, args = None, compiled.args
    else:
        try:
            check_block_program(kernel, name, compiled, checked)
            return compiled
        except ValueError:
            required = compiled_bytes(compiled)
            if not groups or required is None or free is None:
                raise
        # the arguments the program was lowered with (shapes and dtypes)
        args = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type),
            compiled.in_avals[0],
        )

    def compile_group(group):
        return compile_cache.lower(grouped(name, group), *args).compile()

    label = type(kernel).__name__
    try:
        plan = plan_chain_group(
            required,
            free,
            num_chains,
            compile_group,
            kernel.program.block_size,
            kernel=label,
            multiple=kernel.block_multiple,
        )
    except ValueError as error:
        if name != "window_end":
            raise
        raise ValueError(
            f"{label}: the Hessian mass matrix of one chain does not fit the "
            f"device's {_size(free)} free memory (it evaluates 16 D gradients "
            "at once). Use adapt_mass_matrix=True (NumPyro's windowed "
            "estimate) for this model."
        ) from error
    if kernel.program.first_warning(f"chain groups {name}"):
        warnings.warn(
            chain_groups_message(label, num_chains, required, free, plan, name),
            UserWarning,
            stacklevel=2,
        )
    return plan.compiled
