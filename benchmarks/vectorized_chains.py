"""Chains solved together (``chain_method="vectorized"``) with and without the sweep.

Under ``vmap`` the ``lax.cond`` that holds the sweep back for the first
``sweep_after`` Newton iterations of a block becomes a select, so the sweep's
set-up (a gradient at each segment start, a gather, a scatter) runs in every
iteration for every chain (docs/limitations.md, "The sweep with vectorized
chains"). This script measures what that costs and what the sweep still saves.

For each model: one warmup of ``--chains`` chains side by side (sequential
MALA with adaptation, as in ``_setup.warmup``), then for each ``--sweeps``
value and for one chain and all chains, ``--blocks`` blocks of
``--block-size`` draws through ``numpyro_deer.MCMC`` from that post-warmup
state, timed after a first (compiling) run. Reports Newton iterations per
block (median and max over blocks and chains), blocks converged and
microseconds per draw (all chains' draws counted). Run from the repository
root::

    PYTHONPATH=. python3 benchmarks/vectorized_chains.py \\
        --models eight_schools logistic_regression --chains 4 \\
        --block-size 16384 --blocks 2 --sweeps 0 8

The table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import warnings

import _setup
import common
import jax
import numpy as np

import numpyro_deer

EXTRA_FIELDS = ("newton_iterations", "deer_converged")


def warmup_chains(bench, model_args, model_kwargs, num_warmup, num_chains, key):
    """Post-warmup state of ``num_chains`` chains warmed up side by side."""
    kernel = numpyro_deer.DEERMALA(bench.model, block_size=1, method="sequential")
    mcmc = numpyro_deer.MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=1,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.warmup(key, *model_args, **model_kwargs)
    return jax.block_until_ready(mcmc.post_warmup_state)


def run_row(name, ns, bench, data, state, num_warmup, num_chains, sweep):
    model_args, model_kwargs = data
    solver = numpyro_deer.DEERSolver(sweep=sweep)
    kernel = numpyro_deer.DEERMALA(
        bench.model, block_size=ns.block_size, solver=solver, method="deer"
    )
    # the first `num_chains` warmed-up chains, each with its own empty block
    # buffer (key) from a vectorized init of this kernel
    state = jax.tree.map(lambda x: x[:num_chains], state)
    keys = jax.random.split(jax.random.PRNGKey(0), num_chains)
    if num_chains == 1:
        state, keys = jax.tree.map(lambda x: x[0], (state, keys))
    fresh = kernel.init(keys, num_warmup, None, model_args, model_kwargs)
    state = state._replace(block=fresh.block)
    mcmc = numpyro_deer.MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=ns.blocks * ns.block_size,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )

    def go():
        mcmc.post_warmup_state = state
        mcmc.run(
            jax.random.PRNGKey(1),
            *model_args,
            extra_fields=EXTRA_FIELDS,
            **model_kwargs,
        )
        return mcmc.get_extra_fields(group_by_chain=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numpyro_deer.DEERConvergenceWarning)
        extra, timing = common.timed(go, repeats=ns.repeats)
    its = np.asarray(extra["newton_iterations"])[:, :: ns.block_size]
    conv = np.asarray(extra["deer_converged"])[:, :: ns.block_size]
    draws = num_chains * ns.blocks * ns.block_size
    row = {
        "model": name,
        "chains": num_chains,
        "sweep": sweep,
        "block_size": ns.block_size,
        "iterations": its.tolist(),
        "converged": int(conv.sum()),
        "blocks": int(conv.size),
        "seconds": timing["median_s"],
        "us_per_draw": 1e6 * timing["median_s"] / draws,
        "first_run_s": timing["first_s"],
        "recompiles": timing["recompiles"],
    }
    print(row, flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["eight_schools", "logistic_regression"]
    )
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16384)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--sweeps", type=int, nargs="+", default=[0, 8])
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--json", default=str(common.default_json_path("vectorized_chains"))
    )
    ns = parser.parse_args(argv)
    rows = []
    for name in ns.models:
        bench, model_args, model_kwargs = _setup.get_model(name)
        data = (model_args, model_kwargs)
        num_warmup = _setup.warmup_steps(bench, ns.warmup)
        state = warmup_chains(
            bench,
            model_args,
            model_kwargs,
            num_warmup,
            ns.chains,
            jax.random.PRNGKey(0),
        )
        for sweep in ns.sweeps:
            for num_chains in sorted({1, ns.chains}):
                rows.append(
                    run_row(name, ns, bench, data, state, num_warmup, num_chains, sweep)
                )
        common.write_json(
            ns.json, {"machine": common.machine_info(), "args": vars(ns), "rows": rows}
        )
    print(f"\nB = {ns.block_size}, {ns.blocks} blocks per chain, vectorized chains")
    print("| model | chains | sweep | its (median, max) | converged | us/draw |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        its = np.asarray(r["iterations"])
        print(
            f"| {r['model']} | {r['chains']} | {r['sweep']} | "
            f"{np.median(its):g}, {its.max()} | {r['converged']}/{r['blocks']} | "
            f"{r['us_per_draw']:.3f} |"
        )


if __name__ == "__main__":
    main()
