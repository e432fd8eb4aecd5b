"""What the block driver costs on top of the block solves (issue "Block driver").

After one warmup, the same N post-warmup draws (same state, same key, so the
same blocks and the same chain) are produced three ways:

* ``driver``: ``numpyro_deer.MCMC.run`` (one block per loop iteration, NumPyro's
  postprocess vmapped over the block, draws scattered into the collection);
* ``raw``: the block solves alone, a jitted ``lax.fori_loop`` over N/B calls of
  ``kernel.program.refill`` (each followed by ``emit`` of the block's last
  draw, so the next block starts where the chain is), nothing collected;
* ``stock``: ``numpyro.infer.MCMC`` with the same kernel (one draw per loop
  iteration, the refill under ``lax.cond``). Stock ``MCMC.run`` recompiles its
  loop on every call (NumPyro 0.21/0.22), so it is run under an outer
  ``jax.jit`` (traced once); ``--stock-plain`` adds the plain call, whose time
  includes that recompilation.

Each is run once to compile, then timed (``--repeats`` runs at least, more
while they add up to under 0.5 s; the median is reported); the first run's
time shows compilation, and the XLA compilations in each are counted. The
driver's overhead per draw is ``(driver - raw) / N``. All paths use the same
post-warmup state and key, so they compute the same blocks; ``|z_last - raw|``
checks it.

    PYTHONPATH=. python3 benchmarks/driver_overhead.py                 # CPU
    PYTHONPATH=. python3 benchmarks/driver_overhead.py --draws 131072 \\
        --block-size 16384                                              # GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402

import numpyro_deer  # noqa: E402
from benchmarks import _setup, common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default="eight_schools")
    parser.add_argument(
        "--draws",
        type=int,
        default=16384,
        help="post-warmup draws N (rounded up to whole blocks)",
    )
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument(
        "--method",
        default="deer",
        choices=["deer", "sequential"],
        help="how blocks are solved; 'sequential' makes the solves "
        "cheap and isolates the loop overhead",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed runs after the compile run (median reported)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-stock", action="store_true", help="do not run numpyro.infer.MCMC"
    )
    parser.add_argument(
        "--stock-plain",
        action="store_true",
        help="also time stock MCMC.run called plainly (its time "
        "includes the recompilation NumPyro does on every run)",
    )
    parser.add_argument(
        "--progress-bar",
        action="store_true",
        help="also time driver and stock (plain call) with progress_bar=True",
    )
    parser.add_argument(
        "--json", default=str(common.default_json_path("driver_overhead"))
    )
    _setup.add_solver_arguments(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    info = common.machine_info()
    bench, model_args, model_kwargs = _setup.get_model(args.model)
    options = _setup.kernel_options(args)
    B = args.block_size
    num_blocks = -(-args.draws // B)
    N = num_blocks * B
    key_warmup, key_run = jax.random.split(jax.random.PRNGKey(args.seed))

    print(
        f"# driver_overhead: {bench.name} (D={bench.latent_dim}), N={N}, B={B}, "
        f"method={args.method}; {common.describe_machine(info)}",
        flush=True,
    )
    state, warmup_s = _setup.warmup(
        bench, model_args, model_kwargs, args.warmup, key_warmup, options
    )
    print(
        f"warmup: {args.warmup} steps in {warmup_s:.1f} s (with compilation), "
        f"step size {float(state.adapt_state.step_size):.3g}",
        flush=True,
    )

    kernel = _setup.make_kernel(bench, B, args.method, options)
    state = _setup.attach(kernel, state, model_args, model_kwargs, args.warmup)

    results = {
        "script": "driver_overhead",
        "machine": info,
        "config": {
            "model": bench.name,
            "latent_dim": bench.latent_dim,
            "draws": N,
            "block_size": B,
            "num_blocks": num_blocks,
            "warmup": args.warmup,
            "method": args.method,
            "repeats": args.repeats,
            "seed": args.seed,
            "kernel_options": options,
        },
        "warmup_s": warmup_s,
        "step_size": float(state.adapt_state.step_size),
        "kernel": _setup.describe_kernel(kernel),
        "rows": [],
    }
    rows = results["rows"]
    last_z = {}

    def save():
        common.write_json(args.json, results)

    # (a) the block driver ------------------------------------------------
    def run_driver(progress_bar):
        mcmc = numpyro_deer.MCMC(
            kernel, num_warmup=args.warmup, num_samples=N, progress_bar=progress_bar
        )
        mcmc.post_warmup_state = state

        def go():
            mcmc.run(key_run, *model_args, **model_kwargs)
            return mcmc.get_samples(), mcmc.last_state

        (_, last), timing = common.timed(go, args.repeats)
        return last, timing

    # (b) the raw block solves ----------------------------------------------
    def raw_loop(state):
        # the data are closed over (constants), as in the driver and in MCMC
        # with its default jit_model_args=False
        zero = jnp.zeros((), jnp.int32)

        def body(_, carry):
            s, iterations, converged = carry
            s = s._replace(block=s.block._replace(index=jnp.asarray(B, jnp.int32)))
            program = kernel.program
            s = program.refill(s, model_args, model_kwargs, kernel.method_chosen)
            s = program.emit(s, B - 1)
            return (
                s,
                iterations + s.block.info.iterations,
                converged + s.block.info.converged.astype(jnp.int32),
            )

        return jax.lax.fori_loop(0, num_blocks, body, (state, zero, zero))

    # (c) stock numpyro.infer.MCMC ------------------------------------------
    def run_stock(progress_bar, plain):
        mcmc = numpyro.infer.MCMC(
            kernel, num_warmup=args.warmup, num_samples=N, progress_bar=progress_bar
        )
        mcmc.post_warmup_state = state
        if plain:

            def go():
                mcmc.run(key_run, *model_args, **model_kwargs)
                return mcmc.get_samples(), mcmc.last_state

        else:
            run = _setup.jitted_run(mcmc, model_args, model_kwargs)

            def go():
                samples, _, last = run(key_run)
                return samples, last

        (_, last), timing = common.timed(go, args.repeats)
        return last, timing

    def add_row(path, timing, last, extra=None):
        row = {
            "path": path,
            "first_s": timing["first_s"],
            "first_compiles": timing["first_compiles"],
            "median_s": timing["median_s"],
            "times_s": timing["times_s"],
            "recompiles": timing["recompiles"],
            "recompile_s": timing["recompile_s"],
            "median_minus_recompile_s": timing["median_minus_recompile_s"],
            "us_per_draw": timing["median_s"] / N * 1e6,
            "peak_bytes": common.peak_memory_bytes(),
        }
        row.update(extra or {})
        rows.append(row)
        last_z[path] = np.asarray(_setup.flat_z(last))
        print(
            f"{path}: first {row['first_s']:.2f} s "
            f"({row['first_compiles']} compiles), timed {row['median_s']:.4f} s "
            f"({row['recompiles']} compiles), {row['us_per_draw']:.2f} us/draw",
            flush=True,
        )
        save()

    last, timing = run_driver(False)
    add_row("driver", timing, last)

    raw_jit = jax.jit(raw_loop)
    # MCMC.run(key_run) replaces the post-warmup state's key; do the same
    raw_state = state._replace(rng_key=key_run)
    t0 = time.perf_counter()
    with common.CompileCounter() as cc:
        compiled = raw_jit.lower(raw_state).compile()
    compile_s = time.perf_counter() - t0
    (last, iterations, converged), timing = common.timed(
        lambda: compiled(raw_state), args.repeats
    )
    timing["first_s"] += compile_s
    timing["first_compiles"] = (cc.count or 0) + (timing["first_compiles"] or 0)
    add_row(
        "raw",
        timing,
        last,
        {
            "newton_iterations_per_block": int(iterations) / num_blocks,
            "blocks_converged_fraction": int(converged) / num_blocks,
            "compiled_memory": common.compiled_memory(compiled),
        },
    )

    if not args.skip_stock:
        last, timing = run_stock(False, plain=False)
        add_row("stock", timing, last)
        if args.stock_plain:
            last, timing = run_stock(False, plain=True)
            add_row("stock-plain", timing, last)
    if args.progress_bar:
        last, timing = run_driver(True)
        add_row("driver+bar", timing, last)
        if not args.skip_stock:
            last, timing = run_stock(True, plain=True)
            add_row("stock+bar", timing, last)

    # summary -----------------------------------------------------------------
    by_path = {row["path"]: row for row in rows}
    raw_s = by_path["raw"]["median_s"]
    for row in rows:
        row["overhead_us_per_draw"] = (row["median_s"] - raw_s) / N * 1e6
        row["overhead_pct"] = 100.0 * (row["median_s"] - raw_s) / row["median_s"]
        row["last_z_max_abs_diff_vs_raw"] = float(
            np.max(np.abs(last_z[row["path"]] - last_z["raw"]))
        )
    driver = by_path["driver"]
    results["summary"] = {
        "driver_overhead_us_per_draw": driver["overhead_us_per_draw"],
        "driver_overhead_pct": driver["overhead_pct"],
        "raw_us_per_draw": by_path["raw"]["us_per_draw"],
        "driver_us_per_draw": driver["us_per_draw"],
        "stock_us_per_draw": by_path.get("stock", {}).get("us_per_draw"),
        "newton_iterations_per_block": by_path["raw"]["newton_iterations_per_block"],
        "blocks_converged_fraction": by_path["raw"]["blocks_converged_fraction"],
    }
    save()

    columns = [
        ("path", "path"),
        ("first_s", "first s", ".3g"),
        ("first_compiles", "compiles"),
        ("median_s", "timed s", ".4g"),
        ("recompiles", "recompiles"),
        ("median_minus_recompile_s", "timed-recompile s", ".4g"),
        ("us_per_draw", "us/draw", ".4g"),
        ("overhead_us_per_draw", "over raw us/draw", ".3g"),
        ("overhead_pct", "over raw %", ".1f"),
        ("last_z_max_abs_diff_vs_raw", "|z_last - raw|", ".2g"),
    ]
    s = results["summary"]
    print()
    print(f"wrote {args.json}")
    print(
        f"{bench.name}: N={N} draws, B={B} ({num_blocks} blocks), "
        f"method={args.method}, Newton its/block "
        f"{s['newton_iterations_per_block']:.1f}, converged "
        f"{100 * s['blocks_converged_fraction']:.0f}% of blocks"
    )
    print(
        f"driver overhead: {s['driver_overhead_us_per_draw']:.3g} us/draw "
        f"({s['driver_overhead_pct']:.1f}% of the driver's time)"
    )
    print(common.format_table(rows, columns))


if __name__ == "__main__":
    main()
