"""Shared helpers of the benchmark scripts: timing, compiles, memory, ESS, output.

The scripts in ``benchmarks/`` are run from the repository root,

    PYTHONPATH=. python3 benchmarks/<script>.py [options]

and import this module as ``from benchmarks import common`` (``benchmarks`` is a
namespace package; the scripts also put the repository root on ``sys.path``, so
``PYTHONPATH`` may be left out). Nothing here enables float64 or changes any
other global JAX setting.

Helpers:

* :func:`timed` runs a function ``repeats + 1`` times, blocking on its result;
  the first call includes compilation, the rest are timed and their median
  reported. :class:`CompileCounter` counts XLA compilations (through
  ``jax.monitoring``) so each timing says whether it compiled.
* :func:`peak_memory_bytes`: the device's ``peak_bytes_in_use`` (``None`` where
  the backend keeps no statistics, e.g. on CPU).
* :func:`machine_info`: versions, device, git commit.
* :func:`min_ess`: the smallest effective sample size over all scalar
  components of all sites, with :func:`numpyro.diagnostics.effective_sample_size`.
* :func:`write_json`, :func:`format_table`: output.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def default_json_path(name: str) -> Path:
    """``benchmarks/results/<name>.json`` under the repository root."""
    return RESULTS_DIR / f"{name}.json"


# ----------------------------------------------------------------- compiles
class _CompileLog:
    """Process-wide tally of XLA backend compilations (one listener, never removed)."""

    EVENT = "/jax/core/compile/backend_compile_duration"
    PREFIX = "/jax/core/compile/"  # tracing, lowering and backend compilation

    def __init__(self):
        self.count = 0
        self.seconds = 0.0
        self.pipeline_seconds = 0.0
        self._lock = threading.Lock()
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        try:
            jax.monitoring.register_event_duration_secs_listener(self._listener)
            self.installed = True
        except Exception:  # pragma: no cover - monitoring API missing
            self.installed = False

    def _listener(self, event: str, duration: float, **_: Any) -> None:
        if not event.startswith(self.PREFIX):
            return
        with self._lock:
            self.pipeline_seconds += float(duration)
            if event == self.EVENT:
                self.count += 1
                self.seconds += float(duration)


_COMPILE_LOG = _CompileLog()


class CompileCounter:
    """Counts XLA compilations inside a ``with`` block.

    After the block: ``count`` (backend compilations), ``seconds`` (their
    backend compile time) and ``pipeline_seconds`` (tracing, lowering and
    compiling together). All are ``None`` when ``jax.monitoring`` is not
    available (then nothing is known, rather than "no compilation").
    """

    def __init__(self):
        _COMPILE_LOG.install()
        self.count: int | None = None
        self.seconds: float | None = None
        self.pipeline_seconds: float | None = None

    def __enter__(self):
        self._start = (
            _COMPILE_LOG.count,
            _COMPILE_LOG.seconds,
            _COMPILE_LOG.pipeline_seconds,
        )
        return self

    def __exit__(self, *exc):
        if _COMPILE_LOG.installed:
            count0, seconds0, pipeline0 = self._start
            self.count = _COMPILE_LOG.count - count0
            self.seconds = _COMPILE_LOG.seconds - seconds0
            self.pipeline_seconds = _COMPILE_LOG.pipeline_seconds - pipeline0
        return False


# ------------------------------------------------------------------- timing
def block(x: Any) -> Any:
    """``jax.block_until_ready`` on every array leaf of ``x``."""
    return jax.block_until_ready(x)


def timed(
    fn: Callable[[], Any],
    repeats: int = 1,
    min_total_s: float = 0.5,
    max_repeats: int = 50,
    single_run_above_s: float | None = None,
) -> tuple[Any, dict]:
    """Call ``fn()`` once to compile, then ``repeats`` more times, timed.

    Runs that are fast are repeated further, until the timed runs add up to
    ``min_total_s`` (at most ``max_repeats`` runs), so that a median of
    milliseconds is not one noisy sample. When the first call took longer
    than ``single_run_above_s``, it is not repeated: its time less the
    compile time measured in it stands for the timing (``from_first_run``).

    ``fn`` must return what is to be waited for (or anything holding arrays);
    each call is timed to the end of :func:`block` on its result.

    Returns:
        ``(result of the last call, timing)`` where ``timing`` has
        ``first_s`` (the compile run, wall time), ``first_compiles`` and
        ``first_compile_s`` (XLA compilations in it), ``times_s`` (the timed
        runs), ``median_s``, ``recompiles`` (compilations during the timed
        runs: should be 0), ``recompile_s`` (their tracing, lowering and
        compiling time) and ``median_minus_recompile_s`` (the median less the
        recompile time per run: an estimate where recompiles could not be
        avoided).
    """
    with CompileCounter() as first_cc:
        t0 = time.perf_counter()
        out = block(fn())
        first = time.perf_counter() - t0
    if (
        single_run_above_s is not None
        and first > single_run_above_s
        and first_cc.pipeline_seconds is not None
    ):
        estimate = first - first_cc.pipeline_seconds
        return out, {
            "first_s": first,
            "first_compiles": first_cc.count,
            "first_compile_s": first_cc.pipeline_seconds,
            "times_s": [estimate],
            "median_s": estimate,
            "recompiles": None,
            "recompile_s": None,
            "median_minus_recompile_s": estimate,
            "from_first_run": True,
        }
    times = []
    repeats = max(1, repeats)
    with CompileCounter() as rest_cc:
        while len(times) < repeats or (
            sum(times) < min_total_s and len(times) < max_repeats
        ):
            t0 = time.perf_counter()
            out = block(fn())
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    recompile_s = rest_cc.pipeline_seconds
    return out, {
        "first_s": first,
        "first_compiles": first_cc.count,
        "first_compile_s": first_cc.pipeline_seconds,
        "times_s": times,
        "median_s": median,
        "recompiles": rest_cc.count,
        "recompile_s": recompile_s,
        "median_minus_recompile_s": (
            None if recompile_s is None else median - recompile_s / len(times)
        ),
        "from_first_run": False,
    }


# ------------------------------------------------------------------- memory
def memory_stats(device=None) -> dict | None:
    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:
        return None
    return dict(stats) if stats else None


def peak_memory_bytes(device=None) -> int | None:
    """``peak_bytes_in_use`` of the device since the process started, or ``None``.

    JAX offers no reset, so this is a running maximum over the whole process:
    a later measurement includes everything before it.
    """
    stats = memory_stats(device)
    if not stats:
        return None
    value = stats.get("peak_bytes_in_use")
    return None if value is None else int(value)


def bytes_in_use(device=None) -> int | None:
    stats = memory_stats(device)
    if not stats:
        return None
    value = stats.get("bytes_in_use")
    return None if value is None else int(value)


def compiled_memory(compiled) -> dict | None:
    """Sizes from XLA's ``memory_analysis()`` of a compiled function, if any."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:
        return None
    if analysis is None:
        return None
    out = {}
    for name in (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "temp_size_in_bytes",
        "alias_size_in_bytes",
        "generated_code_size_in_bytes",
    ):
        value = getattr(analysis, name, None)
        if value is not None:
            out[name] = int(value)
    return out or None


# ------------------------------------------------------------- machine info
def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except Exception:
        return None
    return getattr(module, "__version__", "unknown")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except Exception:
        return None
    return out.stdout.strip()


def machine_info() -> dict:
    """Versions, device and repository state, for the JSON results."""
    devices = jax.devices()
    device = devices[0]
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "numpyro": _version("numpyro"),
        "numpyro_deer": _version("numpyro_deer"),
        "blackjax": _version("blackjax"),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
        "device_kind": getattr(device, "device_kind", None),
        "device_platform": device.platform,
        "device_count": len(devices),
        "x64": bool(jnp.zeros(()).dtype == jnp.float64),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# -------------------------------------------------------------------- ESS
def _ess_components(x: np.ndarray, max_elements: int) -> np.ndarray:
    """ESS of each trailing component of ``x`` (chains, draws, K), in chunks,
    bounded at ``S log10 S`` of ``S`` draws as Stan and ArviZ bound it
    (``numpyro_deer.infer.diagnostics.bounded_ess``: never negative)."""
    num_chains, num_draws, k = x.shape
    chunk = max(1, max_elements // max(1, num_chains * num_draws))
    from numpyro.diagnostics import effective_sample_size

    from numpyro_deer.infer.diagnostics import bounded_ess

    out = []
    for start in range(0, k, chunk):
        part = np.asarray(x[:, :, start : start + chunk], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            ess = effective_sample_size(part)
            out.append(bounded_ess(ess, num_chains * num_draws))
    return np.concatenate(out) if out else np.zeros((0,))


def _next_fast_len(n: int) -> int:
    """Smallest integer >= n whose only prime factors are 2, 3 and 5."""
    if n <= 2:
        return n
    while True:
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        if m == 1:
            return n
        n += 1


@jax.jit
def _ess_device_chunk(x):
    """``numpyro.diagnostics.effective_sample_size`` (bias=True) in JAX, ``(C, N, K)``.

    The same estimator step for step (FFT autocovariance, Stan's combination
    of chains, Geyer's initial monotone sequence), in the input's precision, on
    the default device (unbounded: :func:`_ess_components_device` bounds it).
    """
    num_chains, num_draws = x.shape[:2]
    size = 2 * _next_fast_len(num_draws)
    centred = x - x.mean(axis=1, keepdims=True)
    freq = jnp.fft.rfft(centred, n=size, axis=1)
    autocov = jnp.fft.irfft(freq * jnp.conj(freq), n=size, axis=1)[:, :num_draws]
    autocov = autocov / num_draws
    var_within = x.var(axis=1, ddof=1).mean(axis=0)
    var_estimator = var_within * (num_draws - 1) / num_draws
    if num_chains > 1:
        var_estimator = var_estimator + x.mean(axis=1).var(axis=0, ddof=1)
    else:
        var_within = var_estimator
    rho = 1.0 - (var_within - autocov.mean(axis=0)) / var_estimator
    rho = rho.at[0].set(1.0)
    pairs = rho[:-1:2] + rho[1::2]
    monotone = jax.lax.cummin(jnp.clip(pairs[1:], 0.0, None), axis=0)
    tau = -1.0 + 2.0 * (pairs[0] + monotone.sum(axis=0))
    return num_chains * num_draws / tau


def _ess_components_device(x: np.ndarray, max_elements: int) -> np.ndarray:
    """:func:`_ess_components` on the default device, bounded alike."""
    from numpyro_deer.infer.diagnostics import bounded_ess

    num_chains, num_draws, k = x.shape
    chunk = max(1, max_elements // max(1, num_chains * num_draws))
    out = []
    for start in range(0, k, chunk):
        part = jnp.asarray(x[:, :, start : start + chunk])
        ess = np.asarray(_ess_device_chunk(part), dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(bounded_ess(ess, num_chains * num_draws))
    return np.concatenate(out) if out else np.zeros((0,))


ESS_DEVICE_THRESHOLD = 1 << 24
"""``backend="auto"`` uses the device for sites with more numbers than this."""


def min_ess(
    samples: dict,
    max_elements: int = 1 << 24,
    exclude: Sequence[str] = (),
    backend: str = "auto",
) -> dict:
    """The smallest ESS over all scalar components of all sites.

    Args:
        samples: site -> array of shape ``(chains, draws, ...)`` (e.g.
            ``mcmc.get_samples(group_by_chain=True)``).
        max_elements: components are processed in chunks of at most this many
            numbers (the FFT in float64 needs about 16 times that in bytes).
        exclude: site names left out.
        backend: ``"numpyro"``: :func:`numpyro.diagnostics.effective_sample_size`
            (NumPy/SciPy, float64, on the host); ``"jax"``: the same estimator
            in JAX on the default device, in the samples' precision (float32),
            much faster for millions of draws; ``"auto"``: ``"jax"`` for a site
            with more than ``ESS_DEVICE_THRESHOLD`` numbers, else ``"numpyro"``.

    Returns:
        ``{"min_ess", "min_site", "per_site" (site -> its minimum),
        "num_components", "num_nonfinite", "backends"}``; components whose ESS
        is not finite (a constant component) are counted in ``num_nonfinite``
        and left out of the minimum.
    """
    if backend not in ("auto", "numpyro", "jax"):
        raise ValueError(f"backend={backend!r}: use 'auto', 'numpyro' or 'jax'")
    per_site = {}
    backends = set()
    num_components = 0
    num_nonfinite = 0
    for site, value in samples.items():
        if site in exclude:
            continue
        shape = np.shape(value)
        if len(shape) < 2 or shape[1] < 2:
            continue
        use = backend
        if use == "auto":
            use = "jax" if int(np.prod(shape)) > ESS_DEVICE_THRESHOLD else "numpyro"
        backends.add(use)
        if use == "jax":
            x = jnp.reshape(jnp.asarray(value), (shape[0], shape[1], -1))
            ess = _ess_components_device(x, max_elements)
        else:
            x = np.asarray(jax.device_get(value))
            x = x.reshape(x.shape[0], x.shape[1], -1)
            ess = _ess_components(x, max_elements)
        num_components += ess.size
        finite = np.isfinite(ess)
        num_nonfinite += int(np.sum(~finite))
        per_site[site] = float(np.min(ess[finite])) if finite.any() else float("nan")
    finite_sites = {k: v for k, v in per_site.items() if math.isfinite(v)}
    if finite_sites:
        min_site = min(finite_sites, key=finite_sites.get)
        value = finite_sites[min_site]
    else:
        min_site, value = None, float("nan")
    return {
        "min_ess": value,
        "min_site": min_site,
        "per_site": per_site,
        "num_components": num_components,
        "num_nonfinite": num_nonfinite,
        "backends": sorted(backends),
    }


def flatten_draws(samples: dict, sites: Sequence[str] | None = None) -> np.ndarray:
    """All sites of ``samples`` (site -> ``(draws, ...)``) side by side, ``(draws, K)``.

    Sites are taken in sorted order unless ``sites`` says otherwise.
    """
    sites = sorted(samples) if sites is None else sites
    parts = []
    for site in sites:
        x = np.asarray(jax.device_get(samples[site]))
        parts.append(x.reshape(x.shape[0], -1))
    return np.concatenate(parts, axis=1)


def compare_draws(a: np.ndarray, b: np.ndarray, tol: float) -> dict:
    """How far draws ``a`` (reference) and ``b`` agree, both ``(draws, K)``.

    A draw agrees when every component satisfies
    ``|a - b| <= tol * (1 + |a|)``. A draw *stayed* when it equals the draw
    before it (the step was rejected).

    Returns:
        ``max_abs_diff``, ``max_rel_diff`` (of ``|a - b| / (1 + |a|)``);
        ``agree_fraction``; ``first_disagreement`` (draw index or ``None``);
        ``first_accept_flip``: the first draw where one chain stayed and the
        other moved (in float32 an accept decision within rounding of its
        threshold can come out differently; from there the two chains are
        different valid chains); ``max_rel_diff_before_flip``: the largest
        relative difference before that draw (solver tolerance accumulated
        along the chain); ``parting``: ``None`` when all draws agree,
        ``"accept flip"`` when the first disagreement is an accept flip, else
        ``"drift"`` (differences grew past ``tol`` before any flip).
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"draw shapes differ: {a.shape} vs {b.shape}")
    diff = np.abs(a - b)
    rel = diff / (1.0 + np.abs(a))
    rel = np.where(np.isnan(rel), np.inf, rel)
    agree = np.all(rel <= tol, axis=1)
    bad = np.flatnonzero(~agree)
    stayed_a = np.all(a[1:] == a[:-1], axis=1)
    stayed_b = np.all(b[1:] == b[:-1], axis=1)
    flips = np.flatnonzero(stayed_a != stayed_b) + 1
    first_flip = int(flips[0]) if flips.size else None
    before = rel[:first_flip] if first_flip is not None else rel
    parting = None
    if bad.size:
        parting = "accept flip" if bad[0] == first_flip else "drift"
    return {
        "max_abs_diff": float(np.nanmax(diff)) if diff.size else 0.0,
        "max_rel_diff": float(np.max(rel)) if rel.size else 0.0,
        "agree_fraction": float(np.mean(agree)) if agree.size else 1.0,
        "first_disagreement": int(bad[0]) if bad.size else None,
        "first_accept_flip": first_flip,
        "max_rel_diff_before_flip": float(np.max(before)) if before.size else 0.0,
        "parting": parting,
    }


# ------------------------------------------------------------------ output
def _to_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.generic, jax.Array, np.ndarray)):
        arr = np.asarray(obj)
        return _to_jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    return repr(obj)  # settings objects such as DEERSolver


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (NumPy and JAX scalars converted; NaN -> null)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(_to_jsonable(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def rows_per_model(run_model, ns) -> list[dict]:
    """``run_model(name, ns)`` for each of ``ns.models``, the rows written to
    ``ns.json`` (with the machine and the arguments) after every model."""
    rows = []
    for name in ns.models:
        rows += run_model(name, ns)
        write_json(ns.json, {"machine": machine_info(), "args": vars(ns), "rows": rows})
    return rows


MASS_WORDS = ("auto", "hessian", "true", "false")
"""The command-line words of the kernels' ``adapt_mass_matrix``."""


def adapt_mass_matrix(word: str | None) -> bool | str | None:
    """The kernels' ``adapt_mass_matrix`` for a word of :data:`MASS_WORDS`:
    ``"true"`` and ``"false"`` as booleans, the others (and ``None``) as
    they are."""
    return {"true": True, "false": False}.get(word, word)


def num_steps_word(value: str) -> int | str:
    """``DEERHMC``'s ``num_steps`` from the command line: ``"auto"`` or a count."""
    return value if value == "auto" else int(value)


def use_compilation_cache(path: str) -> None:
    """Turn on JAX's persistent compilation cache in ``path`` for this process,
    every compile kept whatever its size or duration: what a user writes in
    their own code (``docs/gpu-guide.md``). The second process of the same
    script then loads its programs from disk."""
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def fmt(value: Any, spec: str = ".3g") -> str:
    """Format a table cell; ``None`` and NaN print as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)) and spec == ".3g":
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return "-" if math.isnan(value) else str(value)
        return format(float(value), spec)
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[tuple]) -> str:
    """A plain-text table.

    Args:
        rows: dicts of values.
        columns: ``(key, header)`` or ``(key, header, format_spec)``; a key
            missing from a row prints ``-``.
    """
    headers = [c[1] for c in columns]
    cells = [
        [fmt(row.get(c[0]), *(c[2:] if len(c) > 2 else ())) for c in columns]
        for row in rows
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
        for i, h in enumerate(headers)
    ]
    lines = [
        "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += [
        "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells
    ]
    return "\n".join(lines)


def describe_machine(info: dict) -> str:
    """One line for the printed output."""
    return (
        f"{info.get('device_kind')} ({info.get('backend')}), jax {info.get('jax')}, "
        f"numpyro {info.get('numpyro')}, python {info.get('python')}, "
        f"blackjax {info.get('blackjax') or 'not installed'}"
    )
