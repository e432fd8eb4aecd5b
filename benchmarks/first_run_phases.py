"""Where a first run of vectorized ``DEERHMC`` chains spends its time.

For each chain count and warmup length a fresh Python process runs
``DEERHMC(model, num_steps=4, block_size=B)`` with
``chain_method="vectorized"`` through ``numpyro_deer.MCMC`` and times, apart,

* ``warmup_s``: ``mcmc.warmup`` (the initial state, the step size search, the
  warmup loop and its Hessian window ends), of which ``warmup_compile_s`` is
  spent in JAX's compile pipeline (tracing, lowering and XLA's compile: the
  union of the spans JAX reports, ``end_to_end.CompileSpans``), with the
  largest compiles by name;
* ``block_s``: the first ``mcmc.run`` of one block (``--block-size``, 1,024)
  (``block_compile_s`` of it compiling), and ``block_again_s`` a second one.

The race's rows (``benchmarks/race.py``) reach 0.01 on the small targets at
their first checkpoint after warmup, so ``warmup_s`` is what they wait for.

``--one-call`` times instead what a user's first call waits for: one
``mcmc.run`` of the warmup and ``--blocks`` blocks (``run_s``; its programs
compile side by side while the warmup runs), with ``--methods`` (``auto``,
``deer``, ``sequential``) in a process each, and its timeline in the JSON
(``timeline``: each XLA compile, and each tracing and lowering over 10 ms,
with its program, start and end in seconds from the call's start; the
tracing and lowering run one after the other in the calling thread).
``--models`` takes the benchmark models and the race's Inference Gym targets
(``gym_eight_schools``, ...). ``--sweeps K ...`` runs each row with
``DEERSolver(sweep=K)`` for each ``K``,
``--masses`` with each ``adapt_mass_matrix`` (``auto``, ``hessian``, ``true``:
NumPyro's diagonal estimate).

    PYTHONPATH=. python3 benchmarks/first_run_phases.py --models eight_schools
    PYTHONPATH=. python3 benchmarks/first_run_phases.py --platform gpu \\
        --chains 1 64 1024 --json $OUT/first_run_phases_gpu.json
    PYTHONPATH=. python3 benchmarks/first_run_phases.py --platform gpu --one-call \\
        --chains 1024 --methods sequential deer auto --block-size 512
    # what the sweep costs the DEER block's compile, 1 and 1,024 chains:
    PYTHONPATH=. python3 benchmarks/first_run_phases.py --platform gpu --one-call \
        --chains 1 1024 --methods deer --sweeps 8 0 --block-size 512
    # where a first call with the Hessian metric and many chains waits:
    PYTHONPATH=. python3 benchmarks/first_run_phases.py --platform gpu --one-call \
        --models hierarchical_logistic_regression --chains 1024 \
        --masses hessian true --block-size 512 --blocks 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402


def _child(
    model: str,
    chains: int,
    num_warmup: int,
    block_size: int,
    platform: str | None,
    method: str = "auto",
    blocks: int = 0,
    sweep: int | None = None,
    mass: str = "auto",
) -> dict:
    if platform:
        import jax

        jax.config.update("jax_platforms", "cuda" if platform == "gpu" else platform)
    import gym_models
    import jax
    from end_to_end import CompileSpans

    import numpyro_deer
    from benchmarks.models import BENCHMARK_MODELS

    spans = CompileSpans()
    spans.install()
    if model in gym_models.GYM_TARGETS:  # a race target of the Inference Gym
        target = gym_models.get_target(model)
        model_fn, args, kwargs = target.model, target.args, target.kwargs
    else:
        model_fn = BENCHMARK_MODELS[model].model
        args, kwargs = BENCHMARK_MODELS[model].make_data()
    solver = {} if sweep is None else {"solver": numpyro_deer.DEERSolver(sweep=sweep)}
    adapt = common.adapt_mass_matrix(mass)
    kernel = numpyro_deer.DEERHMC(
        model_fn,
        num_steps=4,
        block_size=block_size,
        method=method,
        adapt_mass_matrix=adapt,
        **solver,
    )
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=block_size * max(blocks, 1),
        num_chains=chains, chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    row = {"model": model, "chains": chains, "num_warmup": num_warmup}
    row["method"] = method
    row["mass"] = mass
    row["sweep"] = "default" if sweep is None else sweep
    if blocks:
        return {**row, **_one_call(mcmc, spans, args, kwargs)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mark, tic = spans.mark(), time.perf_counter()
        mcmc.warmup(jax.random.PRNGKey(0), *args, **kwargs)
        jax.block_until_ready(mcmc.post_warmup_state)
        row["warmup_s"] = time.perf_counter() - tic
        compiles = spans.summary(mark)
        row["warmup_compile_s"] = compiles["compile_s"]
        row["warmup_compiles"] = compiles["largest_compiles"]
        for key in ("block_s", "block_again_s"):
            mark, tic = spans.mark(), time.perf_counter()
            mcmc.run(mcmc.post_warmup_state.rng_key, *args, **kwargs)
            jax.block_until_ready(mcmc.get_samples())
            row[key] = time.perf_counter() - tic
            if key == "block_s":
                row["block_compile_s"] = spans.summary(mark)["compile_s"]
    return row


def _one_call(mcmc, spans, args, kwargs) -> dict:
    """One ``mcmc.run`` of warmup and blocks, with its compiles' timeline."""
    import jax

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mark, start = spans.mark(), time.time()
        tic = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(0), *args, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
        run_s = time.perf_counter() - tic
    timeline = [
        {
            "phase": phase,
            "fun": name.removeprefix("jit(").removesuffix(")"),
            "start": round(s - start, 3),
            "end": round(e - start, 3),
        }
        for phase, s, e, name in spans.spans[mark[0] :]
        if phase == "backend" or e - s > 0.01
    ]
    compiles = [c for c in timeline if c["phase"] == "backend"]
    largest = sorted(compiles, key=lambda c: c["start"] - c["end"])[:3]
    return {
        "run_s": run_s,
        "run_compile_s": spans.summary(mark)["compile_s"],
        "compiles": len(compiles),
        "largest": ", ".join(
            f"{c['fun']} {c['start']:.2f}-{c['end']:.2f}" for c in largest
        ),
        "method_chosen": mcmc.sampler.method_chosen,
        "timeline": sorted(timeline, key=lambda c: c["start"]),
    }


def _run_child(spec: dict) -> dict | None:
    """``_child(**spec)`` in a fresh process; ``None`` (stderr shown) if it failed."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [x for x in done.stdout.splitlines() if x.startswith("ROW")]
    if not lines:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    row = json.loads(lines[0][3:])
    if "warmup_compiles" in row:
        top = row["warmup_compiles"][:3]
        row["largest"] = ", ".join(f"{c['fun'][4:-1]} {c['s']:.2f}" for c in top)
    return row


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["eight_schools"])
    parser.add_argument("--chains", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--num-warmup", nargs="+", type=int, default=[500])
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--platform", choices=("cpu", "gpu"), default=None)
    parser.add_argument("--one-call", action="store_true")
    parser.add_argument("--methods", nargs="+", default=["auto"])
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument(
        "--sweeps", nargs="+", type=int, default=None,
        help="a row per DEERSolver(sweep=K) (default: the default solver)",
    )  # fmt: skip
    parser.add_argument(
        "--masses", nargs="+", default=["auto"], choices=common.MASS_WORDS,
        help="a row per adapt_mass_matrix (true: NumPyro's diagonal estimate)",
    )  # fmt: skip
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        spec = json.loads(ns.child)
        print("ROW" + json.dumps(_child(**spec)))
        return []
    rows = []
    grid = itertools.product(
        ns.models, ns.chains, ns.num_warmup, ns.methods, ns.sweeps or [None], ns.masses
    )
    for model, chains, num_warmup, method, sweep, mass in grid:
        spec = {"model": model, "chains": chains, "num_warmup": num_warmup}
        spec.update(block_size=ns.block_size, platform=ns.platform, sweep=sweep)
        spec.update(mass=mass)
        spec.update(method=method, blocks=ns.blocks if ns.one_call else 0)
        row = _run_child(spec)
        if row is not None:
            rows.append(row)
    path = ns.json or common.default_json_path("first_run_phases")
    common.write_json(path, {"machine": common.machine_info(), "rows": rows})
    print(common.describe_machine(common.machine_info()))
    head = [("model", "model"), ("chains", "chains"), ("num_warmup", "warmup steps")]
    head.append(("mass", "adapt_mass_matrix"))
    if ns.one_call:
        columns = head + [
            ("method", "method"), ("sweep", "sweep"), ("method_chosen", "chosen"),
            ("run_s", "first mcmc.run s", ".3g"), ("run_compile_s", "compiling", ".3g"),
            ("compiles", "compiles"), ("largest", "largest compiles: from-to s"),
        ]  # fmt: skip
    else:
        columns = head + [
            ("warmup_s", "warmup s", ".3g"),
            ("warmup_compile_s", "compiling", ".3g"),
            ("block_s", "first block s", ".3g"),
            ("block_compile_s", "compiling", ".3g"),
            ("block_again_s", "next block s", ".3g"),
            ("largest", "largest compiles, s"),
        ]  # fmt: skip
    print(common.format_table(rows, columns))
    return rows


if __name__ == "__main__":
    main()
