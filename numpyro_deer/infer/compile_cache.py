"""Compiled functions shared across kernels and ``MCMC`` objects.

A second ``MCMC`` object for the same model and shapes (a notebook cell run
again), or a run on new data of the same shapes, should compile none of the
kernel's programs again. JAX caches a jitted function's compilations on the
function object, so the functions the kernel and the driver jit are kept here,
in a small process-wide cache, under a key of everything their trace depends on
apart from their array arguments: the run's
:meth:`~numpyro_deer.infer.program.BlockProgram.key` (model function or
potential, settings, latent structure, warmup length), the non-array model
arguments (compared by value) and the driver's static settings. Arrays, the
data included, are always arguments of the compiled functions, never constants
closed over, so a cached function cannot hold stale data. The functions close
over the run's :class:`~numpyro_deer.infer.program.BlockProgram`, which is
frozen, and a kernel's settings never change, so nothing done to a kernel
afterwards can change what a cached function computes either.

NumPyro's ``initialize_model`` builds the potential from the model function and
the arguments it is called with (``dynamic_args=True``), so two kernels of the
same model give the same potential for the same arguments; that is what lets
one kernel's compiled function serve another's run. Within a program the
potential is a jitted function too (:func:`flat_potential`), so that the
model is traced once per shape however often the program uses it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .lowering import THREEFRY_KERNEL, lowering_config

CACHE_SIZE = 32
"""Compiled function sets kept (least recently used dropped first)."""

_DYNAMIC = object()
"""Marks a leaf of the model arguments that is passed to the compiled function."""

_cache: OrderedDict = OrderedDict()


def cached(key: Hashable | None, build: Callable[[], Any]) -> Any:
    """``build()``, kept under ``key`` (``None``: not kept; unhashable: not kept)."""
    if key is None:
        return build()
    try:
        hit = key in _cache
    except TypeError:  # an unhashable setting or argument: no sharing
        return build()
    if hit:
        _cache.move_to_end(key)
        return _cache[key]
    value = _cache[key] = build()
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return value


def clear() -> None:
    """Forget every cached function and kept program (:func:`lower`)."""
    _cache.clear()
    with _programs_lock:
        _programs.clear()


def split_model_args(args, kwargs, jit_model_args: bool = False):
    """``(dynamic, static)``: the array leaves of ``(args, kwargs)``, and the rest.

    ``static = (treedef, leaves)`` with each array leaf replaced by a marker
    and each other leaf by ``(type, value)``, so that it compares by value
    (``1`` and ``1.0`` differ). Under ``jit_model_args`` every leaf is dynamic,
    as in stock ``MCMC``.
    """
    leaves, treedef = jax.tree.flatten((args, kwargs))
    dynamic, static = [], []
    for leaf in leaves:
        if jit_model_args or isinstance(leaf, (np.ndarray, jax.Array)):
            dynamic.append(leaf)
            static.append(_DYNAMIC)
        else:
            static.append((type(leaf), leaf))
    return tuple(dynamic), (treedef, tuple(static))


def join_model_args(static, dynamic):
    """``(args, kwargs)`` from :func:`split_model_args`'s two parts."""
    treedef, static_leaves = static
    dynamic = iter(dynamic)
    leaves = [next(dynamic) if s is _DYNAMIC else s[1] for s in static_leaves]
    return jax.tree.unflatten(treedef, leaves)


def _potential_at(model: tuple, x, dynamic):
    """:func:`flat_potential`'s potential, ``model`` its static part
    ``(potential_fn, potential_fn_gen, unravel, static model args)``."""
    potential_fn, potential_fn_gen, unravel, static = model
    if potential_fn_gen is not None:
        args, kwargs = join_model_args(static, dynamic)
        potential_fn = potential_fn_gen(*args, **({} if kwargs is None else kwargs))
    return potential_fn(unravel(x))


_jitted_potential_at = jax.jit(_potential_at, static_argnums=0, inline=True)


def flat_potential(
    potential_fn: Callable | None,
    potential_fn_gen: Callable | None,
    unravel: Callable,
    args,
    kwargs,
) -> Callable:
    """The potential energy on one chain's flat values ``x``:
    ``potential_fn(unravel(x))``, or NumPyro's ``potential_fn_gen(*args,
    **kwargs)`` in its place.

    A jitted function of ``x`` and the model's array arguments, its model
    and other arguments static: a program that evaluates, grads, vmaps or
    linearizes the potential many times traces the model once per shape
    (JAX's trace cache) and transforms that jaxpr after; the jaxpr is
    inlined into each program (``inline=True``), whose HLO is the same as
    with the model traced at every use. Unhashable static arguments: the
    model is traced at every use.
    """
    dynamic, static = split_model_args(args, kwargs)
    source = potential_fn if potential_fn_gen is None else None
    model = (source, potential_fn_gen, unravel, static)
    try:
        hash(model)
    except TypeError:  # an unhashable argument or potential: traced each time
        return lambda x: _potential_at(model, x, dynamic)
    return lambda x: _jitted_potential_at(model, x, dynamic)


def latent_signature(params, batched: bool = False) -> tuple:
    """The structure, shapes and dtypes of one chain's latent values."""
    leaves, treedef = jax.tree.flatten(params)
    return treedef, tuple(
        (np.shape(x)[1:] if batched else np.shape(x), jnp.result_type(x))
        for x in leaves
    )


PROGRAMS_KEPT = 64
"""Compiled programs :func:`lower` keeps (least recently used dropped first)."""

_programs: OrderedDict = OrderedDict()
_programs_lock = threading.Lock()

# the configuration a program's trace depends on, besides its arguments
_CONFIG = (
    "jax_enable_x64",
    "jax_default_device",
    "jax_default_matmul_precision",
    "jax_numpy_rank_promotion",
    "jax_numpy_dtype_promotion",
    "jax_default_prng_impl",
    "jax_threefry_partitionable",
    THREEFRY_KERNEL,
)


def lower(fun: Callable, *args) -> Any:
    """``fun.lower(*args)``, or the program compiled earlier in this process
    for the same :func:`signature`, whose ``compile()`` then returns it.

    A repeat run (a second ``MCMC`` object, new data of the same shapes)
    calls the same cached functions (:func:`cached`) at the same shapes.
    JAX's caches make lowering and compiling them again cheap but not free:
    on 2 CPU cores a repeat run of a 512-step banana block took 9.2 ms with
    them and 7.1 ms with the programs kept here (medians of 40 alternated
    runs). Arguments without a signature are lowered every time. Programs
    are lowered under :func:`~.lowering.lowering_config`.
    """
    with lowering_config():
        key = signature(fun, args)
        if key is not None:
            with _programs_lock:
                compiled = _programs.get(key)
                if compiled is not None:
                    _programs.move_to_end(key)
                    return _Compiled(compiled)
        lowered = fun.lower(*args)
    return lowered if key is None else _Kept(lowered, key)


def eval_shape(fun: Callable, *args) -> Any:
    """``fun``'s output shapes at ``args``, traced as :func:`lower` traces it
    (under :func:`~.lowering.lowering_config`), so that lowering ``fun`` at
    the same arguments later reuses this trace (JAX's trace cache)."""
    with lowering_config():
        return fun.eval_shape(*args)


def signature(fun: Callable, args: tuple) -> Hashable | None:
    """What ``fun``'s program compiled at ``args`` depends on: the function,
    the arguments' tree, shapes, dtypes, weak types and placements (an
    array's sharding where it is committed to one, a shape's where it names
    one), the configuration that changes a trace and the default backend.
    ``None`` where a leaf is neither an array nor a shape."""
    leaves, treedef = jax.tree.flatten(args)
    keys = []
    for x in leaves:
        if isinstance(x, jax.ShapeDtypeStruct):
            keys.append((x.shape, x.dtype, x.weak_type, x.sharding))
        elif isinstance(x, jax.Array):
            placed = x.sharding if x.committed else None
            keys.append((x.shape, x.dtype, x.aval.weak_type, placed))
        elif isinstance(x, (np.ndarray, np.generic)):
            keys.append((x.shape, x.dtype, False, None))
        else:
            return None
    config = tuple(getattr(jax.config, name, None) for name in _CONFIG)
    return fun, treedef, tuple(keys), config, jax.default_backend()


class _Kept:
    """A lowered program whose ``compile()`` keeps what it compiles under
    its signature; its other attributes are the lowering's."""

    def __init__(self, lowered, key: Hashable):
        self._lowered = lowered
        self._key = key

    def compile(self):
        compiled = self._lowered.compile()
        with _programs_lock:
            _programs[self._key] = compiled
            while len(_programs) > PROGRAMS_KEPT:
                _programs.popitem(last=False)
        return compiled

    def __getattr__(self, name: str):
        if name in ("_lowered", "_key"):  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self._lowered, name)


class _Compiled:
    """A program compiled earlier, where its lowering would be."""

    def __init__(self, compiled):
        self._compiled = compiled

    def compile(self):
        return self._compiled


# compiles under way, by the lowered computation they compile (see below)
_UNDER_WAY: dict[int, tuple[Any, Future]] = {}

MAX_COMPILE_WORKERS = 8
"""Most programs compiled side by side (:func:`compile_workers`)."""


def compile_workers() -> int:
    """Programs :func:`compile_in_background` compiles side by side: one per
    processor this process may run on, at most :data:`MAX_COMPILE_WORKERS`.

    XLA compiles a program mostly on one thread; more compiles than cores
    only slow the first-needed programs (the initial state, the warmup loop)
    down by sharing the cores with those needed later. On 2 CPU cores, two at
    a time against eight, whole processes, five runs each alternated (median
    wall ratio): ``examples/eight_schools.py`` 0.962,
    ``examples/logistic_regression.py`` 0.984,
    ``examples/hierarchical_logistic.py`` 0.981, stochastic volatility's
    first ``mcmc.run`` (``benchmarks/first_run_phases.py``) 0.962, with 23-37 %
    less peak memory (``docs/performance.md``).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_COMPILE_WORKERS, cores))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (as it was after).

    Tracing and lowering a run's programs allocate objects by the hundred
    thousand, and the collector's passes over a large heap (an application's
    imports, JAX's caches) hold the calling thread while the later programs
    wait to be lowered; with JAX's persistent compilation cache that
    lowering is most of a first call. On 2 CPU cores, with the Inference
    Gym imported (``docs/performance.md``, alternated processes): a first
    run of 1,024 chains of the Gym's eight schools had lowered its programs
    1.56 s after it started against 1.96 s (medians of five), and a first
    call of 4 chains with every program in the persistent cache took 1.20 s
    against 1.27 s (medians of six). Nothing is left uncollected: the
    collector runs again after.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compile_in_background(lowered: Iterable[tuple[str, Any]]) -> dict[str, Future]:
    """Each lowered program's compilation, started in a thread of its own.

    ``lowered`` yields ``(name, lowered program)`` pairs (a dict's ``items()``,
    or a generator that lowers them one by one: each compile starts as soon
    as its program is lowered, while the next is lowered). Returns a future
    per name; ``future.result()`` is the compiled program. XLA compiles
    outside Python's global lock, so the programs compile side by side
    (:func:`compile_workers` at a time, in the order given) and the caller
    runs each as soon as its own compile is done (warmup runs while the
    blocks still compile). A program still compiling for an earlier call (the
    same lowered computation: JAX caches the lowering of a jitted function) is
    not compiled twice: its future is returned. Python's collector is
    paused while ``lowered`` is lowered (:func:`collector_paused`). The
    threads are not daemons: a process that ends while a compile is under
    way waits for it.
    """
    pool = ThreadPoolExecutor(max_workers=compile_workers())
    futures = {}
    try:
        with collector_paused():
            for name, low in lowered:
                futures[name] = _compile_once(low, pool)
    finally:
        pool.shutdown(wait=False)
    return futures


def _compile_once(low, pool: ThreadPoolExecutor) -> Future:
    """``low``'s compile in ``pool``; done at once for a program an earlier
    run compiled, and the same future for a computation whose compile is
    under way."""
    if isinstance(low, _Compiled):
        future = Future()
        future.set_result(low.compile())
        return future
    computation = getattr(low, "_lowering", None)
    under_way = _UNDER_WAY.get(id(computation))
    if under_way is not None and under_way[0] is computation:
        return under_way[1]
    future = pool.submit(low.compile)
    if computation is not None:
        key = id(computation)
        _UNDER_WAY[key] = (computation, future)
        future.add_done_callback(lambda _, key=key: _UNDER_WAY.pop(key, None))
    return future
