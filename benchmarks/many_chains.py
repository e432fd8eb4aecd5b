"""Sampling with many chains: draws/s and ESS/s against chain count and block length.

For each model (eight schools, D = 10; the logistic regression of N = 10,000
and D = 100), kernel (``DEERMALA``, ``DEERHMC`` with its default 4 leapfrog
steps), chain count ``C`` (vectorized chains, ``chain_method="vectorized"``)
and block length ``B``, one ``numpyro_deer.MCMC`` warms up (NumPyro's
adaptation, ``--warmup`` steps per chain, not timed), runs ``--blocks`` blocks
once (compiling the sampling loop) and then runs the same number of blocks
again from where it stopped. Only that second run is timed: the *sampling
phase*, ``C * blocks * B`` draws.

Columns: ``draws_per_s`` (all chains), ``min_ess`` (smallest over the latent
sites' components, ``benchmarks/common.py``'s ``min_ess`` over all chains),
``ess_per_s``, ``newton_iterations`` (mean over blocks of the slowest chain's
iterations), ``median_chain_iterations`` (the same of the median chain's),
``batch_iterations`` and ``straggler_iterations`` (mean over
blocks of the iterations the loop over all chains ran and of those the small
batch of unconverged chains ran after it: ``NewtonInfo.batch_iterations``,
``straggler_iterations``; per block in the JSON), ``converged`` (fraction of
chain-blocks whose solve passed), and
the gradient counts of ``benchmarks/race.py`` for the timed run
(``gradients``, ``critical_path_gradients``, ``scan_levels``) with
``critical_path_per_draw`` (critical path over draws per chain; these
counts assume every chain pays the slowest chain's iterations, the plain
``vmap``).

``--sweeps`` runs each row with ``DEERSolver(sweep=k)`` for each ``k`` given
(the default solver where left out); ``first_s`` is the first ``warmup`` and
``run`` together, compilation included.

``--stragglers`` picks how vectorized chains are solved: ``auto`` as the
kernel does (the unconverged chains set apart where the chains are
``vmap``-ped, i.e. not on the CPU), ``on`` that path on any backend (to try it
on the CPU at tiny sizes), ``off`` the plain ``vmap`` of every chain's solve
(the comparison; on the CPU ``lax.map``).

    PYTHONPATH=. python3 benchmarks/many_chains.py --size tiny
    PYTHONPATH=. python3 benchmarks/many_chains.py --size tiny --stragglers on \\
        --models eight_schools --chains 8
    # the GPU comparison, eight schools, blocks of 1,024:
    PYTHONPATH=. python3 benchmarks/many_chains.py --models eight_schools \\
        --chains 1 1024 --block-sizes 1024 --stragglers off --json $OUT/off.json
    PYTHONPATH=. python3 benchmarks/many_chains.py --models eight_schools \\
        --chains 1 1024 --block-sizes 1024 --stragglers auto --json $OUT/on.json
    PYTHONPATH=. python3 benchmarks/many_chains.py --models eight_schools \\
        --chains 1 16 256 1024 4096 --block-sizes 256 1024 --json $OUT/mc.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODELS = ("eight_schools", "logistic_regression_large")
KERNELS = ("mala", "hmc")
SIZES = {
    "tiny": {"chains": [1, 4], "block_sizes": [16], "warmup": 50, "blocks": 1},
    "full": {
        "chains": [1, 4, 16, 64, 256, 1024, 4096],
        "block_sizes": [256, 1024, 4096],
        "warmup": 500,
        "blocks": 2,
    },
}


def set_stragglers(mode: str) -> None:
    """How the kernel's vectorized refill solves the chains, for this process:
    ``auto`` leaves the kernel's choice; ``on``/``off`` fix the internal
    ``stragglers`` argument of ``BlockProgram.refill``."""
    from functools import partialmethod

    from numpyro_deer.infer.program import BlockProgram

    refill = getattr(BlockProgram.refill, "_original", BlockProgram.refill)
    if mode != "auto":
        patched = partialmethod(refill, stragglers=mode == "on")
        patched._original = refill
        refill = patched
    BlockProgram.refill = refill


def measure(
    model: str, kernel_name: str, chains: int, B: int, ns, sweep: int | None = None
) -> dict:
    import _counts
    import common
    import jax
    import numpy as np
    from models import BENCHMARK_MODELS

    import numpyro_deer

    bench = BENCHMARK_MODELS[model]
    args, kwargs = bench.make_data()
    cls = numpyro_deer.DEERMALA if kernel_name == "mala" else numpyro_deer.DEERHMC
    solver = {} if sweep is None else {"solver": numpyro_deer.DEERSolver(sweep=sweep)}
    kernel = cls(bench.model, block_size=B, method="deer", **solver)
    blocks = ns.blocks
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=ns.warmup, num_samples=blocks * B, num_chains=chains,
        chain_method="vectorized" if chains > 1 else "sequential",
        progress_bar=False,
    )  # fmt: skip
    extra = (
        "newton_iterations",
        "block.info.front",
        "block.info.batch_iterations",
        "block.info.straggler_iterations",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numpyro_deer.DEERConvergenceWarning)
        t0 = time.perf_counter()
        mcmc.warmup(jax.random.PRNGKey(ns.seed), *args, **kwargs)
        mcmc.run(mcmc.post_warmup_state.rng_key, *args, extra_fields=extra, **kwargs)
        jax.block_until_ready(mcmc.get_samples())
        first_s = time.perf_counter() - t0
        mcmc.post_warmup_state = mcmc.last_state
        t0 = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, *args, extra_fields=extra, **kwargs)
        samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
        seconds = time.perf_counter() - t0
    latent = set(mcmc.last_state.z)
    ess = common.min_ess({k: v for k, v in samples.items() if k in latent})
    fields = mcmc.get_extra_fields(group_by_chain=True)
    its = np.asarray(fields["newton_iterations"])[:, ::B]
    fronts = np.asarray(fields["block.info.front"])[:, ::B]
    # per block: the loop over all chains, then the straggler batch
    batch_its = np.asarray(fields["block.info.batch_iterations"])[:, ::B].max(0)
    straggler_its = np.asarray(fields["block.info.straggler_iterations"])[:, ::B]
    straggler_its = straggler_its.max(0)
    dim = sum(int(np.size(v)) for v in jax.tree.leaves(mcmc.last_state.z)) // chains
    counts = _counts.deer_kernel_blocks(
        kernel, its, fronts, dim, num_steps=_counts.run_num_steps(mcmc)
    )
    draws = chains * blocks * B
    return {
        "model": model,
        "kernel": kernel_name,
        "chains": chains,
        "block_size": B,
        "sweep": "default" if sweep is None else sweep,
        "blocks": blocks,
        "first_s": first_s,
        "seconds": seconds,
        "draws_per_s": draws / seconds,
        "min_ess": ess["min_ess"],
        "ess_per_s": ess["min_ess"] / seconds,
        "newton_iterations": float(its.max(0).mean()),
        "median_chain_iterations": float(np.median(its, axis=0).mean()),
        "batch_iterations": float(batch_its.mean()),
        "straggler_iterations": float(straggler_its.mean()),
        "batch_iterations_per_block": batch_its.tolist(),
        "straggler_iterations_per_block": straggler_its.tolist(),
        "stragglers": ns.stragglers,
        "converged": float(np.mean(fronts >= B)),
        **counts.as_dict(),
        "critical_path_per_draw": counts.critical_path_gradients / (blocks * B),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--chains", nargs="+", type=int, default=None)
    parser.add_argument("--block-sizes", nargs="+", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=None, help="blocks per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sweeps", nargs="+", type=int, default=None,
        help="DEERSolver(sweep=k) for each k (default: the default solver)",
    )  # fmt: skip
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="rows not started once this is spent are skipped",
    )
    parser.add_argument(
        "--stragglers",
        choices=("auto", "on", "off"),
        default="auto",
        help="vectorized chains: unconverged chains set apart where chains are "
        "vmapped (auto: not on the CPU), on any backend (on), or never (off)",
    )
    parser.add_argument("--json", default=None, help="default results/many_chains.json")
    ns = parser.parse_args(argv)
    set_stragglers(ns.stragglers)
    size = SIZES[ns.size]
    for key in ("chains", "block_sizes", "warmup", "blocks"):
        if getattr(ns, key) is None:
            setattr(ns, key, size[key])

    import common

    out = Path(ns.json) if ns.json else common.default_json_path("many_chains")
    rows: list[dict] = []
    start = time.perf_counter()
    grid = itertools.product(
        ns.models, ns.kernels, ns.block_sizes, ns.chains, ns.sweeps or [None]
    )
    for model, kernel, B, chains, sweep in grid:
        spent = time.perf_counter() - start
        base = {"model": model, "kernel": kernel, "chains": chains, "block_size": B,
                "sweep": "default" if sweep is None else sweep}  # fmt: skip
        if ns.max_seconds is not None and spent > ns.max_seconds:
            rows.append({**base, "status": "skipped (time budget)"})
            continue
        try:
            row = {**measure(model, kernel, chains, B, ns, sweep), "status": "ok"}
        except Exception as err:  # reported, not hidden
            row = {**base, "status": f"failed: {type(err).__name__}: {str(err)[:300]}"}
        rows.append(row)
        print(f"{model} {kernel} C={chains} B={B} sweep={base['sweep']}: "
              f"{row['status']}", flush=True)  # fmt: skip
        common.write_json(
            out, {"machine": common.machine_info(), "args": vars(ns), "rows": rows}
        )
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            rows,
            [
                ("model", "model"),
                ("kernel", "kernel"),
                ("chains", "C"),
                ("block_size", "B"),
                ("sweep", "sweep"),
                ("first_s", "first s", ".3g"),
                ("draws_per_s", "draws/s", ".3g"),
                ("min_ess", "min ESS", ".3g"),
                ("ess_per_s", "ESS/s", ".3g"),
                ("newton_iterations", "Newton its", ".3g"),
                ("median_chain_iterations", "median its", ".3g"),
                ("batch_iterations", "batch its", ".3g"),
                ("straggler_iterations", "straggler its", ".3g"),
                ("converged", "conv.", ".2f"),
                ("critical_path_per_draw", "crit./draw", ".3g"),
                ("status", "status"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
