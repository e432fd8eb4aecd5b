"""How the package's programs are compiled: XLA's options and the lowering's
configuration.

:func:`jit` is :func:`jax.jit` with :func:`compiler_options` (XLA options
measured on each backend); :func:`lowering_config` is the configuration the
driver lowers its programs under (:func:`~.compile_cache.lower`): on a GPU,
JAX's random bits through its CUDA kernel. Neither changes JAX's global
configuration.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import jax
from jax._src import config as _jax_config

TRITON_GEMM = "xla_gpu_enable_triton_gemm"
"""The XLA option :func:`compiler_options` turns off on a GPU."""

OPT_LEVEL = "xla_backend_optimization_level"
"""The XLA option :func:`compiler_options` sets to 0 on a CPU for the
programs that run briefly."""

AUTOTUNE = "xla_gpu_autotune_level"
"""The XLA option :func:`compiler_options` sets to 0 on a GPU for the
programs that run briefly."""


def compiler_options(runs_briefly: bool = False) -> dict[str, Any] | None:
    """The XLA options the package compiles its programs with.

    On a GPU, matrix products go to cuBLAS rather than to Triton kernels,
    which XLA's GPU compiler tunes for each product's shape by compiling and
    timing candidate kernels: most of the compile time of a model with
    matrix products. Measured on an H100 on the six benchmark models
    (``docs/performance.md``): the warmup step and the sequential block
    compile up to 8.5 times faster (eight schools, without a matrix product,
    as fast) and run as fast; DEER's block compiles 1.3 to 4.8 times faster
    and runs 0.9 to 1.4 times as long.

    On a CPU, the programs that ``runs_briefly`` (the initial state and the
    step size search: a few potential evaluations and tens of transitions)
    are compiled without LLVM's optimisation (``OPT_LEVEL`` 0): they compile
    about a third faster, and a whole first run of a small model waits
    mostly for compiles. Measured on 2 CPU cores (``docs/performance.md``):
    whole processes of the three examples 4 to 11 % shorter, the first
    ``mcmc.run`` of the D = 100 logistic regression (N = 10,000) and of
    stochastic volatility 11 and 13 %; the warmup loop, the window end and
    the blocks run long enough to keep the optimisation (the warmup loop at
    level 0 too: the D = 100 regression's first ``mcmc.run`` about 15 %
    longer). On a GPU the programs that run briefly are compiled without
    XLA's autotuning of their products and convolutions (``AUTOTUNE`` 0): it
    times candidate kernels for each shape, which pays only in programs that
    run long. A user's own ``XLA_FLAGS`` setting of any of these options wins
    (that one not set then); other backends get no options.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    backend = jax.default_backend()
    options: dict[str, Any] = {}
    if backend == "gpu" and TRITON_GEMM not in flags:
        options[TRITON_GEMM] = False
    if backend == "gpu" and runs_briefly and AUTOTUNE not in flags:
        options[AUTOTUNE] = 0
    if backend == "cpu" and runs_briefly and OPT_LEVEL not in flags:
        options[OPT_LEVEL] = 0
    return options or None


def jit(fun: Callable, runs_briefly: bool = False, **kwargs) -> Callable:
    """:func:`jax.jit` with the package's :func:`compiler_options`, for the
    programs the kernel and the driver compile (:class:`OptionsJit`)."""
    options = compiler_options(runs_briefly)
    jitted = jax.jit(fun, compiler_options=options, **kwargs)
    if options is None:
        return jitted
    return OptionsJit(jitted, jax.jit(fun, **kwargs))


class OptionsJit:
    """A function jitted with compiler options, called inside another
    transformation without them.

    JAX takes compiler options on a top-level ``jax.jit`` only: called with
    traced arguments (a chain per device under NumPyro's ``pmap``,
    ``chain_method="parallel"``) the function is part of the enclosing
    program, and ``plain`` (the same function jitted without options) is
    what runs. Everything else (``lower``, the compiled cache) is
    ``jitted``'s.
    """

    def __init__(self, jitted: Callable, plain: Callable):
        self._jitted = jitted
        self._plain = plain

    def __call__(self, *args, **kwargs):
        leaves = jax.tree.leaves((args, kwargs))
        traced = any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)
        return (self._plain if traced else self._jitted)(*args, **kwargs)

    def __getattr__(self, name: str):
        if name in ("_jitted", "_plain"):  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self._jitted, name)


_THREEFRY_KERNEL = getattr(_jax_config, "threefry_gpu_kernel_lowering", None)
THREEFRY_KERNEL = "jax_threefry_gpu_kernel_lowering"
"""The JAX setting :func:`lowering_config` turns on on a GPU."""


def lowering_config() -> contextlib.AbstractContextManager:
    """The configuration the driver lowers its programs under.

    On a GPU, JAX's Threefry-2x32 random bits are lowered to JAX's CUDA
    kernel (``THREEFRY_KERNEL``) rather than to the 20 rounds of integer
    operations XLA otherwise compiles at each draw: the same bits, and
    fewer operations for XLA's GPU compiler in programs whose draws
    (NumPyro's search for initial values, the step size search's tapes, a
    block's tape) are a large part of what they compile. On an H100 the
    initial state's program of 1,024 chains of the Inference Gym's eight
    schools compiled in 0.5 s instead of 2.7 s, and every program of a
    first ``mcmc.run`` of one block had compiled by 3.3 s instead of 4.1 s
    (``docs/performance.md``). JAX lowered to the kernel by default before
    it chose the integer operations for their runtime memory. Other backends
    have no such kernel, nor a JAX without the setting: nothing changes
    there.
    """
    if _THREEFRY_KERNEL is None or jax.default_backend() != "gpu":
        return contextlib.nullcontext()
    return _THREEFRY_KERNEL(True)
