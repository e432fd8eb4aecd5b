"""Where compile time goes: the kernel's warmup step and block refill, timed
through JAX's ahead-of-time pipeline, and the size of what XLA sees.

For each kernel variant (the default and one setting changed at a time) the
script initialises ``DEERMALA`` on a model and compiles, ahead of time,

* ``warmup_step``: ``kernel.program.warmup(..., window_end=False)`` (one MALA
  step and the adaptation, the body of the driver's warmup loop), and
  ``warmup_step_with_end``, the same with the Hessian window end inside (the
  step of NumPyro's own ``MCMC`` loop);
* ``window_end`` and ``step_size``: the Hessian mass matrix of a window end
  and the step size search, programs of their own in the driver;
* ``block_refill``: ``kernel.program.refill`` (one block: the DEER solve, or the
  sequential scan), the body of the driver's sampling loop,

with the model's data passed as arguments. Each is timed in three stages,
``jax.jit(f).trace(...)`` (tracing to a jaxpr), ``.lower()`` (to StableHLO) and
``.compile()`` (XLA), and its size counted: StableHLO operations of the
lowered module, and instructions of the optimised HLO module XLA compiled,
with the ``while``, conditional and custom-call ones apart (an unrolled loop
or a branch of an option that is off shows up there).

    PYTHONPATH=. python3 benchmarks/compile_profile.py --model eight_schools \\
        --out benchmarks/results/compile_profile_cpu.json
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

import numpyro_deer  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.models import BENCHMARK_MODELS  # noqa: E402

# every variant but ``sequential`` solves its blocks by DEER (the default
# ``method="auto"`` is the sequential chain on a CPU)
VARIANTS = {
    "deer": {"method": "deer"},
    "sequential": {"method": "sequential"},
    "sweep=0": {"method": "deer", "solver": {"sweep": 0}},
    "sweep=0,whitened": {
        "method": "deer",
        "solver": {"sweep": 0, "solve_basis": "whitened"},
    },
    "max_solves=1": {"method": "deer", "solver": {"max_solves": 1}},
    "jacobian=diag": {"method": "deer", "solver": {"jacobian": "diag"}},
    "mass=True": {"method": "deer", "adapt_mass_matrix": True},
}


def kernel_options(options: dict) -> dict:
    """``DEERMALA`` keywords, the solver's settings as a ``DEERSolver``."""
    options = dict(options)
    if "solver" in options:
        options["solver"] = numpyro_deer.DEERSolver(**options["solver"])
    return options


_STABLEHLO_OP = re.compile(r"\b(stablehlo|chlo|func|sdy|mhlo)\.([a-z_]+)")
_HLO_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s([a-z][a-z0-9\-]*)\(")


def stablehlo_counts(text: str) -> dict:
    """Operations of a lowered (StableHLO) module, by name, one per line."""
    ops = Counter()
    for line in text.splitlines():
        match = _STABLEHLO_OP.search(line)
        if match and not match.group(2).startswith("return"):
            ops[f"{match.group(1)}.{match.group(2)}"] += 1
    return {
        "ops": sum(ops.values()),
        "while": ops["stablehlo.while"],
        "cond": ops["stablehlo.case"] + ops["stablehlo.if"],
        "custom_call": ops["stablehlo.custom_call"],
        "functions": ops["func.func"],
        "calls": ops["func.call"],
    }


def hlo_counts(text: str) -> dict:
    """Instructions of an optimised HLO module (all computations), by opcode."""
    ops = Counter()
    for line in text.splitlines():
        match = _HLO_OP.match(line)
        if match:
            ops[match.group(2)] += 1
    return {
        "instructions": sum(ops.values()),
        "while": ops["while"],
        "conditional": ops["conditional"],
        "custom_call": ops["custom-call"],
        "fusion": ops["fusion"],
        "computations": text.count("\n}") if text else 0,
    }


def profile(fn, *args) -> dict:
    """Trace, lower and compile ``jax.jit(fn)`` on ``args``; times and sizes."""
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    traced = jitted.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    return {
        "trace_s": t1 - t0,
        "lower_s": t2 - t1,
        "compile_s": t3 - t2,
        "jaxpr_eqns": len(traced.jaxpr.jaxpr.eqns),
        "stablehlo": stablehlo_counts(lowered.as_text()),
        "hlo": hlo_counts(compiled.as_text() or ""),
    }


def run_variant(name: str, options: dict, ns) -> list[dict]:
    bench = BENCHMARK_MODELS[ns.model]
    args, kwargs = bench.make_data()
    args = tuple(args)
    kernel = numpyro_deer.DEERMALA(
        bench.model, block_size=ns.block_size, **kernel_options(options)
    )
    state = kernel.init(jax.random.PRNGKey(0), ns.num_warmup, None, args, kwargs)
    rows = []
    for fn_name, fn in (
        # the body of numpyro_deer.MCMC's warmup loop, and the same step with
        # the Hessian window end inside (NumPyro's own loop)
        ("warmup_step", partial(kernel.program.warmup, window_end=False)),
        ("warmup_step_with_end", kernel.program.warmup),
        ("window_end", kernel.program.window_end),
        ("step_size", lambda s, a, k: kernel.program.step_size(s, True, a, k)),
        ("block_refill", partial(kernel.program.refill, method=kernel.method_chosen)),
    ):
        row = {"model": ns.model, "variant": name, "function": fn_name}
        row.update(profile(fn, state, args, kwargs))
        print(
            f"{name:>18} {fn_name:>13}: trace {row['trace_s']:.2f} s, lower "
            f"{row['lower_s']:.2f} s, compile {row['compile_s']:.2f} s, "
            f"{row['hlo']['instructions']} HLO instructions",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default="eight_schools")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS)
    )
    parser.add_argument("--out", "--json", dest="out", default=None)
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    out = ns.out or common.default_json_path(f"compile_profile_{ns.model}")
    rows = []
    for name in ns.variants:
        rows += run_variant(name, VARIANTS[name], ns)
        common.write_json(
            out, {"machine": common.machine_info(), "args": vars(ns), "rows": rows}
        )
    flat = [
        {
            **{k: v for k, v in r.items() if not isinstance(v, dict)},
            **{f"shlo_{k}": v for k, v in r["stablehlo"].items()},
            **{f"hlo_{k}": v for k, v in r["hlo"].items()},
        }
        for r in rows
    ]
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            flat,
            [
                ("variant", "variant"),
                ("function", "function"),
                ("trace_s", "trace s", ".3g"),
                ("lower_s", "lower s", ".3g"),
                ("compile_s", "compile s", ".3g"),
                ("jaxpr_eqns", "jaxpr eqns"),
                ("shlo_ops", "StableHLO ops"),
                ("shlo_while", "while"),
                ("shlo_cond", "cond"),
                ("shlo_custom_call", "custom"),
                ("hlo_instructions", "HLO instr."),
                ("hlo_while", "while"),
                ("hlo_conditional", "cond"),
                ("hlo_custom_call", "custom"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
