"""``method="auto"`` against both methods, per benchmark model.

For each model: one warmup (``--num-warmup``, default the model's
recommended warmup capped at ``--max-warmup``) with ``method="sequential"``,
then from that post-warmup state, for ``method="sequential"``, ``"deer"`` and
``"auto"``: a first run of ``--blocks`` blocks of ``--block-size`` draws
(compiles; ``auto`` measures both here, or keeps the sequential scan
provisionally if the run ends before DEER's program is compiled) and
``--repeats`` timed runs of the same length, each continuing from the last
(the fastest counts). A row
gives the seconds per block of each, the method ``auto`` chose with its
reason, and ``auto``'s time over the faster method's. Run from the repository root::

    PYTHONPATH=. python3 benchmarks/method_auto.py --json OUT.json
    PYTHONPATH=. python3 benchmarks/method_auto.py --models eight_schools \\
        --block-size 16384 --blocks 4 --json OUT.json     # on a GPU

The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import time

import _setup  # noqa: F401  (the repository root on sys.path)
import common
import jax

import numpyro_deer
from benchmarks.models import BENCHMARK_MODELS

METHODS = ("sequential", "deer", "auto")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=sorted(BENCHMARK_MODELS))
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--num-warmup", type=int, default=None)
    parser.add_argument("--max-warmup", type=int, default=1000)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs; the fastest counts"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def _mcmc(kernel, num_warmup, num_samples):
    return numpyro_deer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False
    )


def run_model(name, ns):
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    num_warmup = ns.num_warmup or min(bench.num_warmup, ns.max_warmup)
    num_samples = ns.block_size * ns.blocks
    key_warmup, key_first, key_timed = jax.random.split(jax.random.PRNGKey(ns.seed), 3)
    warm = _mcmc(
        numpyro_deer.DEERMALA(
            bench.model, block_size=ns.block_size, method="sequential"
        ),
        num_warmup,
        num_samples,
    )
    warm.warmup(key_warmup, *args, **kwargs)
    start = jax.block_until_ready(warm.post_warmup_state)
    row = {"model": name, "dim": bench.latent_dim, "num_warmup": num_warmup}
    for method in METHODS:
        kernel = numpyro_deer.DEERMALA(
            bench.model, block_size=ns.block_size, method=method
        )
        mcmc = _mcmc(kernel, num_warmup, num_samples)
        mcmc.post_warmup_state = start
        tic = time.perf_counter()
        mcmc.run(key_first, *args, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
        first = time.perf_counter() - tic
        timed = []
        for _ in range(ns.repeats):
            mcmc.post_warmup_state = mcmc.last_state
            tic = time.perf_counter()
            mcmc.run(key_timed, *args, **kwargs)
            jax.block_until_ready(mcmc.get_samples())
            timed.append(time.perf_counter() - tic)
        seconds = min(timed)
        row[method] = seconds / ns.blocks
        row[f"{method}_first_run_s"] = first
        if method == "auto":
            row["auto_chose"] = kernel.method_chosen
            row["auto_reason"] = kernel.method_choice.reason
    best = min(row["sequential"], row["deer"])
    row["auto_over_best"] = row["auto"] / best
    row["auto_over_sequential"] = row["auto"] / row["sequential"]
    return row


def main(argv=None):
    ns = parse_args(argv)
    rows = []
    for name in ns.models:
        rows.append(run_model(name, ns))
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "machine": common.machine_info(),
        "args": vars(ns),
        "rows": rows,
    }
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=2)
    header = (
        f"{'model':34s} {'D':>4s} {'seq s/blk':>10s} {'deer s/blk':>10s} "
        f"{'auto s/blk':>10s} {'auto chose':>11s} {'auto/best':>9s}"
    )
    print(f"\nblocks of {ns.block_size}, {jax.default_backend()}")
    print(header)
    for r in rows:
        print(
            f"{r['model']:34s} {r['dim']:4d} {r['sequential']:10.4f} "
            f"{r['deer']:10.4f} {r['auto']:10.4f} {r['auto_chose']:>11s} "
            f"{r['auto_over_best']:9.2f}"
        )


if __name__ == "__main__":
    main()
