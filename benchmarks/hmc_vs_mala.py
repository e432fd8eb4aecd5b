"""DEERHMC against DEERMALA, sequential HMC and NUTS, end to end.

For each model and method a fresh Python process (a child of this one, so
every run is cold) builds a new ``MCMC`` object and times its first ``run``:
model initialisation, compilation, warmup and sampling, as a user waits for
it. Reported per row: that wall time, the smallest effective sample size over
all scalar components of the latent sites (``numpyro.diagnostics``), ESS per
draw and per second (end to end), and for the DEER methods the mean Newton
iterations per block and the number of blocks that did not converge.

Methods: ``deer_hmc`` (``DEERHMC`` through ``numpyro_deer.MCMC``),
``deer_mala`` (``DEERMALA``, same driver), ``sequential_hmc``
(``DEERHMC(method="sequential")``: the same taped HMC chain, one transition
after the other) and ``nuts`` (NumPyro's NUTS through ``numpyro.infer.MCMC``).
The DEER methods solve their blocks with DEER (``method="deer"``: the
default ``"auto"`` would take the sequential scan on a CPU); otherwise every
method uses its kernel's defaults; warmup is the model's ``num_warmup``
unless ``--num-warmup`` is given. Progress bars are off.

CPU (small):

    PYTHONPATH=. python benchmarks/hmc_vs_mala.py --num-samples 2048 --block-size 512 \\
        --out benchmarks/results/hmc_vs_mala_cpu.json

GPU (one command; writes JSON to --out, prints a table last):

    PYTHONPATH=. python benchmarks/hmc_vs_mala.py --num-samples 16384 \\
        --block-size 4096 --out benchmarks/results/hmc_vs_mala_h200.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("deer_hmc", "deer_mala", "sequential_hmc", "nuts")
MODELS = (
    "eight_schools",
    "logistic_regression",
    "logistic_regression_large",
    "hierarchical_logistic_regression",
    "stochastic_volatility",
    "ill_conditioned_gaussian",
)


def child(spec: dict) -> dict:
    """One cold run in this process; returns its row."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    t_import = time.perf_counter()
    import common
    import jax
    import numpy as np
    import numpyro.infer

    import numpyro_deer
    from benchmarks.models import BENCHMARK_MODELS

    bench = BENCHMARK_MODELS[spec["model"]]
    args, kwargs = bench.make_data()
    num_warmup = spec["num_warmup"] or bench.num_warmup
    method = spec["method"]
    extra = ("accept_prob",)
    if method == "nuts":
        kernel = numpyro.infer.NUTS(bench.model)
        driver = numpyro.infer.MCMC
    else:
        options = {
            "block_size": spec["block_size"],
            "method": "deer",
            **spec.get("options", {}),
        }
        if method == "deer_mala":
            kernel = numpyro_deer.DEERMALA(bench.model, **options)
        else:
            if method == "sequential_hmc":
                options["method"] = "sequential"
            kernel = numpyro_deer.DEERHMC(bench.model, **options)
        driver = numpyro_deer.MCMC
        extra += ("newton_iterations", "deer_converged")
    import_seconds = time.perf_counter() - t_import
    mcmc = driver(
        kernel,
        num_warmup=num_warmup,
        num_samples=spec["num_samples"],
        progress_bar=False,
    )
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(spec["seed"]), *args, **kwargs, extra_fields=extra)
    jax.block_until_ready(mcmc.get_samples())
    seconds = time.perf_counter() - t0
    samples = mcmc.get_samples(group_by_chain=True)
    ess = common.min_ess(samples)
    row = {
        "model": spec["model"],
        "method": method,
        "num_warmup": num_warmup,
        "num_samples": spec["num_samples"],
        "block_size": spec["block_size"] if method != "nuts" else None,
        "seconds": seconds,
        "import_seconds": import_seconds,
        "min_ess": ess["min_ess"],
        "min_ess_site": ess["min_site"],
        "ess_per_draw": ess["min_ess"] / spec["num_samples"],
        "ess_per_second": ess["min_ess"] / seconds,
    }
    fields = mcmc.get_extra_fields()
    if "newton_iterations" in fields:
        its = np.asarray(fields["newton_iterations"]).reshape(-1)
        conv = np.asarray(fields["deer_converged"]).reshape(-1)
        size = spec["block_size"]
        its, conv = its[::size], conv[::size]  # one entry per block
        row.update(
            newton_iterations=float(np.mean(its)),
            max_newton_iterations=int(np.max(its)),
            unconverged_blocks=int(np.sum(~conv)),
        )
    if hasattr(kernel, "num_steps"):
        row["num_leapfrog"] = kernel.num_steps
    state = mcmc.last_state
    step = getattr(getattr(state, "adapt_state", None), "step_size", None)
    row["step_size"] = None if step is None else float(np.mean(step))
    row["accept_prob"] = float(np.mean(np.asarray(fields["accept_prob"])))
    row["machine"] = common.machine_info()
    return row


COLUMNS = (
    ("model", "model", "s"),
    ("method", "method", "s"),
    ("seconds", "run s", ".1f"),
    ("min_ess", "min ESS", ".0f"),
    ("ess_per_draw", "ESS/draw", ".3f"),
    ("ess_per_second", "ESS/s", ".3g"),
    ("newton_iterations", "Newton its", ".1f"),
    ("unconverged_blocks", "unconv", "d"),
    ("step_size", "eps", ".3g"),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--num-warmup", type=int, default=None)
    parser.add_argument("--num-samples", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", "--json", dest="out", default=None)
    ns = parser.parse_args()
    if ns.child:
        print(json.dumps(child(json.loads(ns.child))))
        return

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import common

    out = Path(ns.out) if ns.out else common.default_json_path("hmc_vs_mala")
    rows = []
    for model in ns.models:
        for method in ns.methods:
            spec = {
                "model": model,
                "method": method,
                "num_warmup": ns.num_warmup,
                "num_samples": ns.num_samples,
                "block_size": ns.block_size,
                "seed": ns.seed,
            }
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    timeout=ns.timeout,
                    cwd=ROOT,
                )
                lines = proc.stdout.strip().splitlines()
                if proc.returncode != 0 or not lines:
                    raise RuntimeError(proc.stderr[-2000:])
                row = json.loads(lines[-1])
            except Exception as err:  # a failed run is a row, not a crash
                row = {"model": model, "method": method, "error": str(err)[-500:]}
            rows.append(row)
            print(common.format_table([row], COLUMNS), flush=True)
            common.write_json(out, {"args": vars(ns), "rows": rows})
    print(common.format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
