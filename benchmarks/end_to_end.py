"""What a user waits for: compilation, warmup and sampling of a first ``run``.

For each model and method the script starts fresh Python processes (children
of this one, so every first run is cold) and measures, in the first:

* ``first``: the wall time of the first ``mcmc.run`` of a new ``MCMC`` object,
  including model initialisation, split into the time spent in JAX's compile
  pipeline and the rest (execution). The compile time is measured, not
  guessed: JAX reports every tracing (``/jax/core/compile/jaxpr_trace_duration``),
  lowering to MLIR (``.../jaxpr_to_mlir_module_duration``) and XLA backend
  compilation (``.../backend_compile_duration``) as a time span through
  ``jax.monitoring``; the spans nest (a jitted function traced inside another
  reports its own span), so each phase is the *union* of its spans, and
  ``compile_s`` the union of all three.
* ``second``: a second ``MCMC`` object (a new kernel too) for the same model
  and data in the same process, as a notebook user re-running a cell.
* ``phases``: a third object with ``mcmc.warmup`` and then ``mcmc.run`` timed
  separately; their execution times (wall less compile) are the warmup and
  sampling parts of the first run.
* ``jit_args`` / ``new_data``: an object with ``jit_model_args=True`` run on
  the data, then the same object run again on new data of the same shapes.

Then two more processes with JAX's persistent compilation cache turned on by
the user's code (a fresh temporary directory, ``min_compile_time_secs=0``,
``min_entry_size_bytes=-1``): the first fills the cache (``cache_cold``), the
second reads it (``cache_warm``).

The ``phases`` object's warmup and sampling also give ``gradients`` (all
gradient-equivalents) and ``critical_path_gradients`` (the longest chain of
dependent ones), defined in ``benchmarks/race.py`` (NUTS: from its
``num_steps``; DEER: from each block's Newton iterations and front).

The minimum effective sample size over the latent sites of the first run
(``numpyro.diagnostics.effective_sample_size``) gives the end-to-end ESS per
second, compile and warmup included.

Methods: ``auto``, ``deer`` and ``sequential`` (``DEERMALA``'s ``method``,
through ``numpyro_deer.MCMC``), ``nuts`` (NumPyro's NUTS through
``numpyro.infer.MCMC``) and ``nuts_cpu`` (NUTS with a chain per host CPU core,
``chain_method="parallel"``). With ``auto`` on a GPU, DEER's program compiles
in the background while the run samples, so ``compile_s`` (a union of time
spans) overlaps execution there; ``process_s`` includes the wait at exit for
a compile still under way. Each DEER row records ``method_chosen`` and
``choice_reason``, and ``package`` (the ``numpyro_deer`` that ran: the
caller's ``PYTHONPATH`` comes first, so an older copy can be timed).
Progress bars are off. ``--xla-flags`` adds XLA options to every process
(``XLA_FLAGS``), e.g. to compare GPU compiler settings for all methods
alike (see ``benchmarks/compile_options.py``).

    PYTHONPATH=. python3 benchmarks/end_to_end.py \\
        --models eight_schools logistic_regression \\
        --out benchmarks/results/end_to_end_cpu.json
    PYTHONPATH=. python3 benchmarks/end_to_end.py --quick --models eight_schools
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("auto", "deer", "sequential", "nuts", "nuts_cpu")
PHASE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "backend",
}


# ------------------------------------------------------------ compile spans
class CompileSpans:
    """Every tracing, lowering and backend-compile span JAX reports, in order."""

    def __init__(self):
        self.spans: list[tuple[str, float, float, str]] = []
        self.events: dict[str, int] = {}
        self._lock = threading.Lock()

    def install(self) -> None:
        import jax

        jax.monitoring.register_event_time_span_listener(self._span)
        jax.monitoring.register_event_listener(self._event)

    def _span(self, event, start, end, **kwargs):
        phase = PHASE_EVENTS.get(event)
        if phase is not None:
            with self._lock:
                self.spans.append((phase, start, end, str(kwargs.get("fun_name"))))

    def _event(self, event, **kwargs):
        if event.startswith("/jax/compilation_cache/"):
            with self._lock:
                name = event.rsplit("/", 1)[-1]
                self.events[name] = self.events.get(name, 0) + 1

    def mark(self) -> tuple[int, dict]:
        return len(self.spans), dict(self.events)

    def summary(self, mark: tuple[int, dict]) -> dict:
        """Phase times (unions of spans) and compile counts since ``mark``."""
        spans = self.spans[mark[0] :]
        phases = {
            p: _union([(s, e) for q, s, e, _ in spans if q == p])
            for p in ("trace", "lower", "backend")
        }
        total = _union([(s, e) for _, s, e, _ in spans])
        after_trace = _union([(s, e) for q, s, e, _ in spans if q != "trace"])
        backend = sorted(
            ((e - s, name) for q, s, e, name in spans if q == "backend"), reverse=True
        )
        events = {k: v - mark[1].get(k, 0) for k, v in self.events.items()}
        return {
            "compile_s": total,
            "trace_s": total - after_trace,
            "lower_s": phases["lower"],
            "backend_compile_s": phases["backend"],
            "compiles": len(backend),
            "largest_compiles": [
                {"fun": name, "s": round(d, 4)} for d, name in backend[:4]
            ],
            "cache_hits": events.get("cache_hits", 0),
            "cache_misses": events.get("cache_misses", 0),
        }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


# ------------------------------------------------------------------- child
def _child(spec: dict) -> dict:
    """One fresh process: the measurements of ``spec`` (see the module doc)."""
    spans = CompileSpans()
    import jax

    from benchmarks import common

    if spec.get("cache_dir"):
        common.use_compilation_cache(spec["cache_dir"])
    spans.install()
    import numpy as np
    import numpyro
    from numpyro.infer import NUTS

    import numpyro_deer
    from benchmarks.models import BENCHMARK_MODELS

    bench = BENCHMARK_MODELS[spec["model"]]
    method = spec["method"]
    args, kwargs = bench.make_data()
    args = tuple(args)
    is_nuts = method.startswith("nuts")
    num_samples = spec["nuts_num_samples"] if is_nuts else spec["num_samples"]
    chains = spec.get("nuts_chains", 1)

    def new_mcmc(**options):
        if is_nuts:
            return numpyro.infer.MCMC(
                NUTS(
                    bench.model,
                    dense_mass=spec.get("nuts_dense", False) and method == "nuts",
                ),
                num_warmup=spec["num_warmup"],
                num_samples=num_samples,
                num_chains=chains,
                chain_method="parallel" if method == "nuts_cpu" else "vectorized",
                progress_bar=False,
                **options,
            )
        kernel = numpyro_deer.DEERMALA(
            bench.model, block_size=spec["block_size"], method=method
        )
        return numpyro_deer.MCMC(
            kernel,
            num_warmup=spec["num_warmup"],
            num_samples=num_samples,
            progress_bar=False,
            **options,
        )

    def timed(fn):
        mark = spans.mark()
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        out = {"wall_s": wall, **spans.summary(mark)}
        out["execute_s"] = wall - out["compile_s"]
        return out

    def run(mcmc, seed, a=args, k=kwargs, extra=()):
        mcmc.run(jax.random.PRNGKey(seed), *a, extra_fields=extra, **k)
        jax.block_until_ready(mcmc.get_samples())

    result = {
        "model": spec["model"],
        "method": method,
        "num_samples": num_samples,
        "num_chains": chains if is_nuts else 1,
        "platform": jax.default_backend(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "package": str(Path(numpyro_deer.__file__).parent),
    }
    mcmc = new_mcmc()
    result["first"] = timed(lambda: run(mcmc, 0))
    latent = set(mcmc.last_state.z)
    samples = mcmc.get_samples(group_by_chain=True)
    ess = common.min_ess({s: v for s, v in samples.items() if s in latent})
    result["min_ess"] = ess["min_ess"]
    result["min_ess_site"] = ess["min_site"]
    if not is_nuts:
        info = mcmc.last_state.block.info
        result["newton_iterations"] = int(np.max(np.asarray(info.iterations)))
        choice = mcmc.sampler.method_choice
        result["method_chosen"] = mcmc.sampler.method_chosen
        result["choice_reason"] = choice.reason if choice is not None else None
    if spec.get("first_only"):
        return result

    result["second"] = timed(lambda: run(new_mcmc(), 0))
    phased = new_mcmc()
    key = jax.random.PRNGKey(0)
    # the gradient counts are those of this warmup and sampling (NUTS: its
    # num_steps; DEER: Newton iterations and fronts of its blocks)
    warm_extra = {"extra_fields": ("num_steps",), "collect_warmup": True}
    result["warmup_call"] = timed(
        lambda: (
            phased.warmup(key, *args, **(warm_extra if is_nuts else {}), **kwargs),
            jax.block_until_ready(phased.post_warmup_state),
        )
    )
    warm_fields = phased.get_extra_fields(group_by_chain=True) if is_nuts else None
    extra = ("num_steps",) if is_nuts else ("newton_iterations", "block.info.front")
    result["sampling_call"] = timed(lambda: run(phased, 1, extra=extra))
    result["counts"] = _counts_of(phased, spec, warm_fields, chains, is_nuts)
    jit_args = new_mcmc(jit_model_args=True)
    result["jit_args"] = timed(lambda: run(jit_args, 0))
    new_args, new_kwargs = _new_data(bench, args, kwargs)
    result["new_data"] = timed(lambda: run(jit_args, 0, new_args, new_kwargs))
    return result


def _counts_of(mcmc, spec, warm_fields, chains, is_nuts) -> dict:
    """``gradients``, ``critical_path_gradients`` and ``scan_levels`` of a
    warmup and sampling run (definitions: ``benchmarks/race.py``)."""
    import jax
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _counts

    if is_nuts:
        fields = mcmc.get_extra_fields(group_by_chain=True)
        counter = _counts.StepsCounter(lockstep=spec["method"] == "nuts")
        counts = counter.add(warm_fields["num_steps"]) + counter.add(
            fields["num_steps"]
        )
        return counts.as_dict()
    z = mcmc.last_state.z
    dim = sum(int(np.size(v)) for v in jax.tree.leaves(z))
    counts = _counts.deer_warmup(mcmc.sampler, 1, spec["num_warmup"])
    return (counts + _counts.deer_run_blocks(mcmc, dim)).as_dict()


def _new_data(bench, args, kwargs):
    """Data of the same shapes and dtypes, other values (seed 1; the eight
    schools data are fixed, so their floating arrays are scaled by 1.01)."""
    import jax
    import jax.numpy as jnp

    new_args, new_kwargs = bench.make_data(seed=1)
    new_args = tuple(new_args)
    same = all(
        bool(jnp.all(a == b))
        for a, b in zip(
            jax.tree.leaves((args, kwargs)),
            jax.tree.leaves((new_args, new_kwargs)),
            strict=True,
        )
    )
    if same:
        scale = lambda x: x * 1.01 if jnp.issubdtype(x.dtype, jnp.floating) else x  # noqa: E731
        new_args, new_kwargs = jax.tree.map(scale, (new_args, new_kwargs))
    return new_args, new_kwargs


def _spawn(spec: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ)
        if spec.get("xla_flags"):
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {spec['xla_flags']}".strip()
        if spec["method"] == "nuts_cpu":
            # NumPyro's NUTS on the host CPU, a chain per (host) device
            env["JAX_PLATFORMS"] = "cpu"
            count = f"--xla_force_host_platform_device_count={spec['nuts_chains']}"
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {count}".strip()
        # the caller's PYTHONPATH first (it may hold another numpyro_deer to
        # time), then this checkout for the benchmarks
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(ROOT)]
        )
        cmd = [sys.executable, str(Path(__file__).resolve())]
        cmd += ["--child", json.dumps(spec), "--child-out", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or not out.exists():
            return {"error": proc.stderr[-3000:], "process_s": elapsed}
        result = json.loads(out.read_text())
        result["process_s"] = elapsed
        return result


# ------------------------------------------------------------------ parent
def measure(model: str, method: str, ns) -> dict:
    spec = {
        "model": model,
        "method": method,
        "num_warmup": ns.num_warmup,
        "num_samples": ns.num_samples,
        "nuts_num_samples": ns.nuts_num_samples,
        "block_size": ns.block_size,
        "first_only": ns.first_only,
        "nuts_chains": ns.nuts_chains,
        "nuts_dense": ns.nuts_dense,
        "xla_flags": ns.xla_flags,
    }
    print(f"{model} / {method} ...", file=sys.stderr, flush=True)
    row = {"model": model, "method": method, **_spawn(spec, ns.timeout)}
    if not ns.no_cache:
        with tempfile.TemporaryDirectory(prefix="jax_cache_") as cache:
            cached = {**spec, "cache_dir": cache, "first_only": True}
            cold = _spawn(cached, ns.timeout)
            warm = _spawn(cached, ns.timeout)
        row["cache_cold"] = cold.get("first", cold)
        row["cache_warm"] = warm.get("first", warm)
    return _derive(row)


def _derive(row: dict) -> dict:
    """The phase split of the first run and ESS per second."""
    first = row.get("first")
    if not first:
        return row
    warmup = row.get("warmup_call", {}).get("execute_s")
    sampling = row.get("sampling_call", {}).get("execute_s")
    row["compile_s"] = first["compile_s"]
    for key, value in (row.get("counts") or {}).items():
        row[key] = value
    row["warmup_s"] = warmup
    row["sampling_s"] = sampling
    if warmup is not None and sampling is not None:
        row["other_s"] = first["wall_s"] - first["compile_s"] - warmup - sampling
    ess = row.get("min_ess")
    for stage in ("first", "second", "cache_warm"):
        wall = row.get(stage, {}).get("wall_s")
        if ess is not None and wall:
            row[f"ess_per_s_{stage}"] = ess / wall
    return row


def _ratios(rows: list[dict]) -> list[dict]:
    """Wall times relative to NUTS on the same model (the issue's goals)."""
    nuts = [r for r in rows if r.get("method", "").startswith("nuts")]
    out = []
    for r in rows:
        if r.get("method", "").startswith("nuts") or "first" not in r:
            continue
        for ref in (n for n in nuts if n.get("model") == r.get("model")):
            entry = {"model": r["model"], "method": r["method"], "vs": ref["method"]}
            for stage in ("first", "second", "new_data", "cache_warm"):
                a = r.get(stage, {}).get("wall_s")
                b = ref.get(stage, {}).get("wall_s")
                entry[f"{stage}_vs_nuts"] = a / b if a and b else None
            a, b = r.get("ess_per_s_first"), ref.get("ess_per_s_first")
            entry["ess_per_s_first_vs_nuts"] = a / b if a and b else None
            out.append(entry)
    return out


def _table(rows: list[dict]) -> str:
    from benchmarks import common

    flat = []
    for r in rows:
        f = {k: v for k, v in r.items() if not isinstance(v, dict)}
        for stage in ("first", "second", "new_data", "cache_warm"):
            f[f"{stage}_wall"] = r.get(stage, {}).get("wall_s")
            f[f"{stage}_compiles"] = r.get(stage, {}).get("compiles")
        f["second_compile"] = r.get("second", {}).get("compile_s")
        flat.append(f)
    columns = [
        ("model", "model"),
        ("method", "method"),
        ("first_wall", "first s", ".3g"),
        ("compile_s", "compile", ".3g"),
        ("warmup_s", "warmup", ".3g"),
        ("sampling_s", "sampling", ".3g"),
        ("first_compiles", "#comp", ".3g"),
        ("second_wall", "2nd obj s", ".3g"),
        ("second_compile", "2nd compile", ".3g"),
        ("new_data_wall", "new data s", ".3g"),
        ("new_data_compiles", "#comp", ".3g"),
        ("cache_warm_wall", "cached proc s", ".3g"),
        ("min_ess", "min ESS", ".4g"),
        ("gradients", "grads", ".3g"),
        ("critical_path_gradients", "crit. path", ".3g"),
        ("ess_per_s_first", "ESS/s first", ".3g"),
        ("ess_per_s_second", "ESS/s 2nd", ".3g"),
    ]
    return common.format_table(flat, columns)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--models", nargs="+", default=None, help="default: all six")
    parser.add_argument(
        "--methods", nargs="+", default=["deer", "sequential", "nuts"], choices=METHODS
    )
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument(
        "--num-samples", type=int, default=4096, help="draws of the DEERMALA methods"
    )
    parser.add_argument("--nuts-num-samples", type=int, default=1000)
    parser.add_argument(
        "--nuts-chains",
        type=int,
        default=1,
        help="NUTS chains: vectorized for nuts, one per host device for nuts_cpu",
    )
    parser.add_argument(
        "--nuts-dense",
        action="store_true",
        help="a dense mass matrix for nuts (not nuts_cpu)",
    )
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument(
        "--xla-flags",
        default="",
        help="added to XLA_FLAGS in every process, e.g. '--xla_gpu_autotune_level=0'",
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="skip the persistent-cache processes"
    )
    parser.add_argument(
        "--first-only",
        action="store_true",
        help="only the first run in each process (no second object, phases, new data)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--timeout", type=float, default=1800, help="per process, s")
    parser.add_argument("--out", "--json", dest="out", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.quick:
        ns.num_warmup, ns.num_samples, ns.nuts_num_samples = 20, 64, 20
        ns.block_size = 32
    return ns


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    if ns.child:
        result = _child(json.loads(ns.child))
        Path(ns.child_out).write_text(json.dumps(result))
        return [result]
    sys.path.insert(0, str(ROOT))
    from benchmarks import common
    from benchmarks.models import BENCHMARK_MODELS

    models = ns.models or list(BENCHMARK_MODELS)
    out = ns.out or common.default_json_path("end_to_end")
    rows = []
    for model in models:
        for method in ns.methods:
            rows.append(measure(model, method, ns))
            common.write_json(
                out,
                {
                    "machine": common.machine_info(),
                    "args": vars(ns),
                    "rows": rows,
                    "vs_nuts": _ratios(rows),
                },
            )
    print(common.describe_machine(common.machine_info()))
    ratios = _ratios(rows)
    if ratios:
        print(
            common.format_table(
                ratios,
                [
                    ("model", "model"),
                    ("method", "method"),
                    ("vs", "vs"),
                    ("first_vs_nuts", "first / NUTS", ".3g"),
                    ("second_vs_nuts", "2nd obj / NUTS", ".3g"),
                    ("new_data_vs_nuts", "new data / NUTS", ".3g"),
                    ("cache_warm_vs_nuts", "cached / NUTS", ".3g"),
                    ("ess_per_s_first_vs_nuts", "ESS/s first / NUTS", ".3g"),
                ],
            )
        )
        print()
    print(_table(rows))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"error in {r.get('model')} / {r.get('method')}:\n{r['error']}")
    return rows


if __name__ == "__main__":
    main()
