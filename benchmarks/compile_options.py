"""XLA compiler options against the compile time of the kernel's programs.

On a GPU the compile time of the DEER block grows with the dimension (the
block is a few matrix products of ``D x D`` matrices per step, and XLA's GPU
compiler tunes each matrix product for its shape by running candidate
kernels). This script compiles, ahead of time, the two bodies of the driver's
loops -- ``kernel.program.warmup`` (one warmup step) and ``kernel.program.refill``
(one block) -- with each set of compiler options passed to
``Lowered.compile(compiler_options=...)``, and then times the compiled block
(median of three calls after one) and warmup step (median of ten after one),
so that a faster compile can be weighed against a slower program. The
option sets named ``xla_gpu_*`` are the GPU's; ``O0``, ``O1`` and
``cheap_llvm`` (LLVM's level and passes) apply to the CPU as well.
``--method sequential`` compiles the sequential block instead of DEER's.

Every (model, options) pair runs in a fresh process: XLA keeps what its tuner
found for the life of a process, so a second compile in the same process would
be faster for that reason alone.

    PYTHONPATH=. python3 benchmarks/compile_options.py \\
        --models logistic_regression_large eight_schools \\
        --options autotune=0 autotune=0,fusion_autotuner=off default \\
        --out benchmarks/results/h100/compile_options_h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

OPTION_SETS = {
    "default": {},
    "autotune=0": {"xla_gpu_autotune_level": 0},
    "fusion_autotuner=off": {"xla_gpu_experimental_enable_fusion_autotuner": False},
    "autotune=0,fusion_autotuner=off": {
        "xla_gpu_autotune_level": 0,
        "xla_gpu_experimental_enable_fusion_autotuner": False,
    },
    "triton_gemm=off": {"xla_gpu_enable_triton_gemm": False},
    "autotune=0,triton_gemm=off": {
        "xla_gpu_autotune_level": 0,
        "xla_gpu_enable_triton_gemm": False,
    },
    "autotune=0,cheap_llvm": {
        "xla_gpu_autotune_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
    # the package's option (triton_gemm=off) and the GPU assembler (ptxas)
    # without optimisation, LLVM without its expensive passes, or both
    "triton_gemm=off,ptxas=O0": {
        "xla_gpu_enable_triton_gemm": False,
        "xla_gpu_disable_gpuasm_optimizations": True,
    },
    "triton_gemm=off,cheap_llvm": {
        "xla_gpu_enable_triton_gemm": False,
        "xla_llvm_disable_expensive_passes": True,
    },
    "triton_gemm=off,ptxas=O0,cheap_llvm": {
        "xla_gpu_enable_triton_gemm": False,
        "xla_gpu_disable_gpuasm_optimizations": True,
        "xla_llvm_disable_expensive_passes": True,
    },
    # any backend: LLVM's optimisation level, its expensive passes
    "O0": {"xla_backend_optimization_level": 0},
    "O1": {"xla_backend_optimization_level": 1},
    "cheap_llvm": {"xla_llvm_disable_expensive_passes": True},
    "O1,cheap_llvm": {
        "xla_backend_optimization_level": 1,
        "xla_llvm_disable_expensive_passes": True,
    },
}


def child(model: str, option_set: str, ns) -> dict:
    import jax

    import numpyro_deer
    from benchmarks.models import BENCHMARK_MODELS

    options = OPTION_SETS[option_set]
    bench = BENCHMARK_MODELS[model]
    args, kwargs = bench.make_data()
    args = tuple(args)
    kernel = numpyro_deer.DEERMALA(
        bench.model, block_size=ns.block_size, method=ns.method
    )
    t0 = time.perf_counter()
    state = kernel.init(jax.random.PRNGKey(0), ns.num_warmup, None, args, kwargs)
    jax.block_until_ready(state)
    row = {
        "model": model,
        "options": option_set,
        "compiler_options": options,
        "method": ns.method,
        "block_size": ns.block_size,
        "init_s": time.perf_counter() - t0,
    }
    for name, fn in (
        ("warmup_step", kernel.program.warmup),
        ("block_refill", partial(kernel.program.refill, method=kernel.method_chosen)),
    ):
        t0 = time.perf_counter()
        lowered = jax.jit(fn).lower(state, args, kwargs)
        t1 = time.perf_counter()
        compiled = lowered.compile(compiler_options=options or None)
        t2 = time.perf_counter()
        row[f"{name}_lower_s"] = t1 - t0
        row[f"{name}_compile_s"] = t2 - t1
        # median of the calls after the first: the block, and one warmup step
        repeats = 4 if name == "block_refill" else 11
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(state, args, kwargs))
            times.append(time.perf_counter() - t0)
        key = "block_run_s" if name == "block_refill" else "warmup_step_run_s"
        row[key] = statistics.median(times[1:])
    return row


def xla_flags(options: dict) -> str:
    """``options`` as the ``XLA_FLAGS`` environment variable writes them."""
    return " ".join(
        f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in options.items()
    )


def pick(rows: list[dict], slowdown: float = 1.15) -> str:
    """The option set with the least compile time summed over the models, among
    those whose block runs at most ``slowdown`` times the default's on each."""
    ok = [r for r in rows if "error" not in r]
    models = {r["model"] for r in ok}
    by_set = {
        name: {r["model"]: r for r in ok if r["options"] == name}
        for name in OPTION_SETS
    }
    default = by_set["default"]
    best, best_s = "default", float("inf")
    for name, mine in by_set.items():
        if set(mine) != models or set(default) != models:
            continue
        slower = (
            mine[m]["block_run_s"] > slowdown * default[m]["block_run_s"]
            for m in models
        )
        if any(slower):
            continue
        total = sum(
            mine[m]["warmup_step_compile_s"] + mine[m]["block_refill_compile_s"]
            for m in models
        )
        if total < best_s:
            best, best_s = name, total
    return best


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--models", nargs="+", default=["eight_schools"])
    parser.add_argument(
        "--options", nargs="+", default=list(OPTION_SETS), choices=list(OPTION_SETS)
    )
    parser.add_argument("--method", default="deer")
    parser.add_argument("--block-size", type=int, default=4096)
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument("--deadline", type=float, default=1e9, help="whole run, s")
    parser.add_argument("--timeout", type=float, default=300, help="per process, s")
    parser.add_argument("--out", "--json", dest="out", default=None)
    parser.add_argument(
        "--pick",
        metavar="JSON",
        help="print the fastest-compiling option set of a result file (as "
        "XLA_FLAGS) and exit",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    if ns.child:
        print("ROW " + json.dumps(child(*ns.child, ns)), flush=True)
        return []
    if ns.pick:
        name = pick(json.loads(Path(ns.pick).read_text())["rows"])
        print(xla_flags(OPTION_SETS[name]))
        print(f"picked: {name}", file=sys.stderr)
        return []
    # this process only reads the machine's description: leave the GPU's
    # memory to the children (JAX takes most of it at its first use)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    out = ns.out or common.default_json_path("compile_options")
    end = time.monotonic() + ns.deadline
    rows = []
    passthrough = [
        f"--method={ns.method}",
        f"--block-size={ns.block_size}",
        f"--num-warmup={ns.num_warmup}",
    ]
    for model in ns.models:
        for option_set in ns.options:
            left = end - time.monotonic()
            if left < 20:
                print(f"deadline: {model} {option_set} not run", file=sys.stderr)
                continue
            cmd = [sys.executable, __file__, "--child", model, option_set]
            try:
                proc = subprocess.run(
                    cmd + passthrough,
                    capture_output=True,
                    text=True,
                    timeout=min(ns.timeout, left),
                )
                found = [
                    json.loads(line[4:])
                    for line in proc.stdout.splitlines()
                    if line.startswith("ROW ")
                ]
                row = found[0] if found else {"error": proc.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                row = {"error": "timeout"}
            row.setdefault("model", model)
            row.setdefault("options", option_set)
            rows.append(row)
            print(json.dumps(row)[:400], file=sys.stderr, flush=True)
            common.write_json(
                out, {"machine": common.machine_info(), "args": vars(ns), "rows": rows}
            )
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            rows,
            [
                ("model", "model"),
                ("options", "options"),
                ("method", "method"),
                ("warmup_step_compile_s", "warmup step compile s", ".3g"),
                ("warmup_step_run_s", "warmup step run s", ".3g"),
                ("block_refill_compile_s", "block compile s", ".3g"),
                ("block_run_s", "block run s", ".3g"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
