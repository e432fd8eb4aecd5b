"""DEERMALA against the sequential chain, stock MCMC, NUTS and BlackJAX MALA.

Issue "Benchmarks on the H200". For each model of ``numpyro_deer.models``, in
one process:

1. one DEERMALA warmup (``--warmup`` steps) through ``numpyro_deer.MCMC``;
2. NumPyro NUTS once (its own warmup, ``--nuts-draws`` draws), the reference
   for ESS per second;
3. for each chain length T of ``--draws``, from the same post-warmup state:

   * ``deer``: DEERMALA through the block driver ``numpyro_deer.MCMC``;
   * ``sequential``: the same kernel with ``method="sequential"`` and the same
     key, i.e. the same taped chain computed by ``lax.scan``; its draws are
     compared with DEER's;
   * ``stock``: the DEER kernel through stock ``numpyro.infer.MCMC`` (only for
     T <= ``--stock-max-draws``), same key, so again the same chain;
   * ``blackjax``: ``blackjax.mala`` (when importable) with DEERMALA's adapted
     step size, on the potential whitened by the adapted mass matrix, a
     ``lax.scan`` of T steps (its own random numbers).

Every timing is of identical runs after a first, compiling one (``--repeats``
at least, more while they add up to under 0.5 s; median), so compilation is
excluded; the first run's time is reported too. The
block size is ``--block-size`` if given, else ``min(T, --max-block-size)``.

    PYTHONPATH=. python3 benchmarks/suite.py --draws 1024 --warmup 200 \\
        --models eight_schools logistic_regression            # CPU, small
    PYTHONPATH=. python3 benchmarks/suite.py --draws 16384 131072 1048576  # GPU
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from numpyro.infer import NUTS  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402

import numpyro_deer  # noqa: E402
from benchmarks import _setup, common  # noqa: E402
from numpyro_deer.models import BENCHMARK_MODELS  # noqa: E402

DEER_EXTRA_FIELDS = ("newton_iterations", "deer_converged")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--models", nargs="+", default=list(BENCHMARK_MODELS),
                        help="names in numpyro_deer.models.BENCHMARK_MODELS")
    parser.add_argument("--draws", nargs="+", type=int, default=[4096],
                        help="chain lengths T (post-warmup draws)")
    parser.add_argument("--warmup", type=int, default=500,
                        help="DEERMALA warmup steps")
    parser.add_argument("--block-size", type=int, default=None,
                        help="DEER block size B (default: min(T, --max-block-size))")
    parser.add_argument("--max-block-size", type=int, default=131072)
    parser.add_argument("--nuts-draws", type=int, default=1000)
    parser.add_argument("--nuts-warmup", type=int, default=None,
                        help="NUTS warmup steps (default: --warmup)")
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--skip-stock", action="store_true")
    parser.add_argument("--stock-max-draws", type=int, default=4096,
                        help="run stock numpyro.infer.MCMC only for T up to this")
    parser.add_argument("--skip-nuts", action="store_true")
    parser.add_argument("--skip-blackjax", action="store_true")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed runs after the compile run (median reported)")
    parser.add_argument("--match-tol", type=float, default=1e-3,
                        help="a draw agrees with DEER's when every component has "
                        "|a - b| <= tol * (1 + |a|)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=str(common.default_json_path("suite")))
    _setup.add_solver_arguments(parser)
    args = parser.parse_args(argv)
    for name in args.models:
        if name not in BENCHMARK_MODELS:
            parser.error(f"unknown model {name!r}; choose from "
                         f"{', '.join(BENCHMARK_MODELS)}")
    if args.nuts_warmup is None:
        args.nuts_warmup = args.warmup
    return args


# --------------------------------------------------------------------- rows
def _first_chain(samples):
    return {k: v[0] for k, v in samples.items()}


def _sample_stats(samples, time_s, num_draws):
    ess = common.min_ess(samples)
    return {
        "time_s": time_s,
        "draws_per_s": num_draws / time_s if time_s > 0 else None,
        "min_ess": ess["min_ess"],
        "min_ess_site": ess["min_site"],
        "ess_per_s": ess["min_ess"] / time_s if time_s > 0 else None,
        "ess_components": ess["num_components"],
        "ess_nonfinite_components": ess["num_nonfinite"],
    }


def _timing_fields(timing):
    return {
        "first_s": timing["first_s"],
        "first_compiles": timing["first_compiles"],
        "first_compile_s": timing["first_compile_s"],
        "times_s": timing["times_s"],
        "recompiles": timing["recompiles"],
    }


def _block_stats(extra, block_size):
    """Newton iterations and convergence per block, from the draws at block starts."""
    its = np.asarray(extra["newton_iterations"])[0, ::block_size]
    conv = np.asarray(extra["deer_converged"])[0, ::block_size]
    return {
        "num_blocks": int(its.size),
        "newton_its_median": float(np.median(its)) if its.size else None,
        "newton_its_max": int(np.max(its)) if its.size else None,
        "newton_its_per_block": its.tolist(),
        "blocks_converged_fraction": float(np.mean(conv)) if conv.size else None,
    }


def run_block_driver(kernel, state, bench_data, num_warmup, num_draws, key, repeats):
    """DEERMALA (either method) through ``numpyro_deer.MCMC``; sampling timed."""
    model_args, model_kwargs = bench_data
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_draws, progress_bar=False
    )
    mcmc.post_warmup_state = state

    def go():
        mcmc.run(key, *model_args, extra_fields=DEER_EXTRA_FIELDS, **model_kwargs)
        return (
            mcmc.get_samples(group_by_chain=True),
            mcmc.get_extra_fields(group_by_chain=True),
            mcmc.last_state,
        )

    with warnings.catch_warnings():
        # a non-converged block is reported in the row, not as a warning
        warnings.simplefilter("ignore", numpyro_deer.DEERConvergenceWarning)
        return common.timed(go, repeats)


def run_stock(kernel, state, bench_data, num_warmup, num_draws, key, repeats):
    """The same kernel through stock ``numpyro.infer.MCMC`` (under one jit)."""
    model_args, model_kwargs = bench_data
    mcmc = numpyro.infer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_draws, progress_bar=False
    )
    mcmc.post_warmup_state = state
    run = _setup.jitted_run(mcmc, extra_fields=DEER_EXTRA_FIELDS)
    return common.timed(lambda: run(key, model_args, model_kwargs), repeats)


def _deer_row(samples, extra, last, timing, num_draws, block_size):
    row = {"method": None, "T": num_draws, "B": block_size}
    row.update(_sample_stats(samples, timing["median_s"], num_draws))
    row.update(_timing_fields(timing))
    row.update(_block_stats(extra, block_size))
    info = last.block.info
    row["last_block_residual"] = float(info.residual)
    row["last_block_front"] = int(info.front)
    return row


def run_nuts(bench, bench_data, args, key):
    model_args, model_kwargs = bench_data
    mcmc = numpyro.infer.MCMC(
        NUTS(bench.model),
        num_warmup=args.nuts_warmup,
        num_samples=args.nuts_draws,
        progress_bar=False,
    )
    key_warmup, key_run = jax.random.split(key)
    t0 = time.perf_counter()
    mcmc.warmup(key_warmup, *model_args, **model_kwargs)
    jax.block_until_ready(mcmc.post_warmup_state)
    warmup_s = time.perf_counter() - t0
    run = _setup.jitted_run(mcmc, extra_fields=("num_steps", "accept_prob"))
    (samples, extra, _), timing = common.timed(
        lambda: run(key_run, model_args, model_kwargs), args.repeats
    )
    row = {"method": "nuts", "T": args.nuts_draws, "B": None}
    row.update(_sample_stats(samples, timing["median_s"], args.nuts_draws))
    row.update(_timing_fields(timing))
    row["warmup_s"] = warmup_s
    row["grad_evals_per_draw"] = float(np.mean(np.asarray(extra["num_steps"])))
    row["accept_rate"] = float(np.mean(np.asarray(extra["accept_prob"])))
    row["divergences"] = int(np.sum(np.asarray(extra["diverging"])))
    row["step_size"] = float(mcmc.post_warmup_state.adapt_state.step_size)
    return row


def run_blackjax(blackjax, bench, bench_data, state, num_draws, key, repeats):
    """``blackjax.mala`` on the whitened potential, from the post-warmup state."""
    model_args, model_kwargs = bench_data
    _, potential_fn, postprocess_fn, _ = initialize_model(
        jax.random.PRNGKey(0),
        bench.model,
        model_args=model_args,
        model_kwargs=model_kwargs,
    )
    x0, unravel = ravel_pytree(state.z)
    inverse_mass = state.adapt_state.inverse_mass_matrix
    if inverse_mass.ndim == 1:
        mass_sqrt = jnp.sqrt(inverse_mass)
        to_x = lambda w: mass_sqrt * w  # noqa: E731
        w0 = x0 / mass_sqrt
    else:
        mass_sqrt = jnp.linalg.cholesky(inverse_mass)
        to_x = lambda w: mass_sqrt @ w  # noqa: E731
        w0 = jax.scipy.linalg.solve_triangular(mass_sqrt, x0, lower=True)
    step_size = state.adapt_state.step_size

    def logdensity(w):
        return -potential_fn(unravel(to_x(w)))

    algorithm = blackjax.mala(logdensity, step_size)

    @jax.jit
    def run(rng_key, w0):
        def body(s, k):
            s, info = algorithm.step(k, s)
            return s, (s.position, info.acceptance_rate)

        keys = jax.random.split(rng_key, num_draws)
        _, (ws, accept) = jax.lax.scan(body, algorithm.init(w0), keys)
        samples = jax.vmap(lambda w: postprocess_fn(unravel(to_x(w))))(ws)
        return {k: v[None] for k, v in samples.items()}, accept

    (samples, accept), timing = common.timed(lambda: run(key, w0), repeats)
    row = {"method": "blackjax", "T": num_draws, "B": None}
    row.update(_sample_stats(samples, timing["median_s"], num_draws))
    row.update(_timing_fields(timing))
    row["accept_rate"] = float(np.mean(np.asarray(accept)))
    return row


# --------------------------------------------------------------------- main
COLUMNS = [
    ("model", "model"),
    ("T", "T"),
    ("B", "B"),
    ("method", "method"),
    ("time_s", "time s", ".3g"),
    ("draws_per_s", "draws/s", ".3g"),
    ("min_ess", "min ESS", ".3g"),
    ("ess_per_s", "ESS/s", ".3g"),
    ("speedup_vs_sequential", "vs seq", ".3g"),
    ("ess_per_s_vs_nuts", "vs NUTS", ".3g"),
    ("newton_its", "Newton med/max"),
    ("converged_pct", "conv %", ".0f"),
    ("max_abs_diff", "max|d| vs DEER", ".2g"),
    ("agree_pct", "agree %", ".1f"),
    ("peak_mb", "peak MB", ".4g"),
    ("first_s", "1st run s", ".3g"),
    ("status", "status"),
]


def _display(row):
    out = dict(row)
    if row.get("newton_its_median") is not None:
        out["newton_its"] = f"{row['newton_its_median']:g}/{row['newton_its_max']}"
    if row.get("blocks_converged_fraction") is not None:
        out["converged_pct"] = 100 * row["blocks_converged_fraction"]
    if row.get("agree_fraction") is not None:
        out["agree_pct"] = 100 * row["agree_fraction"]
    if row.get("peak_bytes") is not None:
        out["peak_mb"] = row["peak_bytes"] / 2**20
    if row.get("error"):
        out["status"] = "ERROR"
    elif row.get("skipped"):
        out["status"] = "skipped"
    elif row.get("within_tol") is False:
        kind = "flip" if row.get("parting") == "accept flip" else "drift"
        out["status"] = f"parted@{row.get('first_disagreement')} ({kind})"
    else:
        out["status"] = "ok"
    return out


def main(argv=None):
    args = parse_args(argv)
    info = common.machine_info()
    options = _setup.kernel_options(args)
    try:
        import blackjax
    except ImportError:
        blackjax = None
    results = {
        "script": "suite",
        "machine": info,
        "config": {
            "models": args.models,
            "draws": args.draws,
            "warmup": args.warmup,
            "block_size": args.block_size,
            "max_block_size": args.max_block_size,
            "nuts_draws": args.nuts_draws,
            "nuts_warmup": args.nuts_warmup,
            "stock_max_draws": args.stock_max_draws,
            "repeats": args.repeats,
            "match_tol": args.match_tol,
            "seed": args.seed,
            "kernel_options": options,
        },
        "notes": [],
        "models": {},
        "rows": [],
    }
    if blackjax is None and not args.skip_blackjax:
        results["notes"].append("blackjax is not importable: its rows are skipped")
    rows = results["rows"]

    def save():
        common.write_json(args.json, results)

    def finish(row, model_name):
        row["model"] = model_name
        row["peak_bytes"] = common.peak_memory_bytes()
        row["bytes_in_use"] = common.bytes_in_use()
        rows.append(row)
        save()
        d = _display(row)
        msg = ", ".join(
            f"{header}={common.fmt(d.get(key), *spec)}"
            for key, header, *spec in COLUMNS[3:]
            if d.get(key) is not None
        )
        print(f"  {model_name} T={row.get('T')}: {msg}", flush=True)
        if row.get("error"):
            print(f"    error: {row['error']}", flush=True)

    def attempt(method, fn, **fields):
        try:
            row = fn()
        except Exception as exc:  # keep going: one failure must not end the suite
            traceback.print_exc()
            row = dict(fields)
            row["error"] = f"{type(exc).__name__}: {exc}"
        row["method"] = method
        for key, value in fields.items():
            row.setdefault(key, value)
        return row

    print(f"# suite: {', '.join(args.models)}; T in {args.draws}; "
          f"{common.describe_machine(info)}", flush=True)
    root = jax.random.PRNGKey(args.seed)
    for model_index, name in enumerate(args.models):
        key_model = jax.random.fold_in(root, model_index)
        key_warmup, key_run, key_nuts, key_bjx = jax.random.split(key_model, 4)
        bench, model_args, model_kwargs = _setup.get_model(name)
        data = (model_args, model_kwargs)
        model_info = {"latent_dim": bench.latent_dim, "description": bench.description}
        results["models"][name] = model_info
        print(f"\n{name}: {bench.description}", flush=True)
        try:
            state0, warmup_s = _setup.warmup(
                bench, model_args, model_kwargs, args.warmup, key_warmup, options
            )
        except Exception as exc:
            traceback.print_exc()
            model_info["error"] = f"{type(exc).__name__}: {exc}"
            finish({"method": "warmup", "error": model_info["error"]}, name)
            continue
        model_info.update(
            warmup_s=warmup_s,
            step_size=float(state0.adapt_state.step_size),
            warmup_accept_rate=float(state0.mean_accept_prob),
        )
        print(f"  warmup {args.warmup} steps: {warmup_s:.1f} s (with compilation), "
              f"step size {model_info['step_size']:.3g}, accept "
              f"{model_info['warmup_accept_rate']:.2f}", flush=True)

        nuts_ess_per_s = None
        if not args.skip_nuts:
            row = attempt("nuts", lambda: run_nuts(bench, data, args, key_nuts),
                          T=args.nuts_draws)
            nuts_ess_per_s = row.get("ess_per_s")
            row["ess_per_s_vs_nuts"] = 1.0 if nuts_ess_per_s else None
            finish(row, name)

        for T in args.draws:
            B = args.block_size or min(T, args.max_block_size)
            fields = {"T": T, "B": B}
            kernel = _setup.make_kernel(bench, B, "deer", options)
            state = _setup.attach(kernel, state0, model_args, model_kwargs,
                                  args.warmup)
            deer_draws = {}

            def deer_method(method, kernel=kernel, state=state, T=T, B=B):
                if method == "stock":
                    out, timing = run_stock(kernel, state, data, args.warmup, T,
                                            key_run, args.repeats)
                else:
                    if method == "sequential":
                        kernel = _setup.make_kernel(bench, B, "sequential", options)
                        state = _setup.attach(kernel, state0, model_args,
                                              model_kwargs, args.warmup)
                    out, timing = run_block_driver(kernel, state, data, args.warmup,
                                                   T, key_run, args.repeats)
                samples, extra, last = out
                row = _deer_row(samples, extra, last, timing, T, B)
                chain = _first_chain(samples)
                row["accept_rate"] = float(np.mean(np.asarray(extra["accept_prob"])))
                row["divergences"] = int(np.sum(np.asarray(extra["diverging"])))
                flat = common.flatten_draws(chain)
                if method == "deer":
                    deer_draws["flat"] = flat
                elif "flat" in deer_draws:
                    row.update(common.compare_draws(deer_draws["flat"], flat,
                                                    args.match_tol))
                    row["within_tol"] = row["agree_fraction"] == 1.0
                if method == "sequential":
                    for key in ("newton_its_median", "newton_its_max",
                                "newton_its_per_block", "blocks_converged_fraction",
                                "last_block_residual", "last_block_front"):
                        row.pop(key, None)
                return row

            deer_row = attempt("deer", lambda: deer_method("deer"), **fields)
            finish(deer_row, name)
            t_seq = None
            if not args.skip_sequential:
                row = attempt("sequential", lambda: deer_method("sequential"),
                              **fields)
                t_seq = row.get("time_s")
                row["speedup_vs_sequential"] = 1.0 if t_seq else None
                finish(row, name)
            if t_seq and deer_row.get("time_s"):
                deer_row["speedup_vs_sequential"] = t_seq / deer_row["time_s"]
            if not args.skip_stock:
                if T <= args.stock_max_draws:
                    row = attempt("stock", lambda: deer_method("stock"), **fields)
                else:
                    row = dict(fields, skipped=f"T > --stock-max-draws "
                               f"{args.stock_max_draws}")
                    row["method"] = "stock"
                if t_seq and row.get("time_s"):
                    row["speedup_vs_sequential"] = t_seq / row["time_s"]
                finish(row, name)
            if not args.skip_blackjax:
                if blackjax is None:
                    row = {"method": "blackjax", "T": T, "skipped":
                           "blackjax not importable"}
                else:
                    row = attempt(
                        "blackjax",
                        lambda T=T: run_blackjax(blackjax, bench, data, state0, T,
                                                 key_bjx, args.repeats),
                        T=T,
                    )
                if t_seq and row.get("time_s"):
                    row["speedup_vs_sequential"] = t_seq / row["time_s"]
                finish(row, name)
            for row in rows:
                if (row.get("model") == name and row.get("T") == T
                        and row.get("method") != "nuts" and nuts_ess_per_s
                        and row.get("ess_per_s") is not None):
                    row["ess_per_s_vs_nuts"] = row["ess_per_s"] / nuts_ess_per_s
            save()

    save()
    print()
    for note in results["notes"]:
        print(f"note: {note}")
    print(f"wrote {args.json}")
    print(f"{common.describe_machine(info)}; warmup {args.warmup}; "
          f"timed runs exclude compilation; speed-up 'vs seq' = sequential time / "
          f"time; 'vs NUTS' = ESS/s / NUTS ESS/s")
    print(common.format_table([_display(r) for r in rows], COLUMNS))


if __name__ == "__main__":
    main()
