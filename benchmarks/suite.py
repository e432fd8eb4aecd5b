"""DEERMALA against the sequential chain, stock MCMC, NUTS and BlackJAX MALA.

Issue "Benchmarks on the H200". For each model of ``benchmarks.models``, in
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
import contextlib
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
from benchmarks.models import BENCHMARK_MODELS  # noqa: E402

DEER_EXTRA_FIELDS = ("newton_iterations", "deer_converged")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(BENCHMARK_MODELS),
        help="names in benchmarks.models.BENCHMARK_MODELS",
    )
    parser.add_argument(
        "--draws",
        nargs="+",
        type=int,
        default=[4096],
        help="chain lengths T (post-warmup draws)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="DEERMALA warmup steps (default: the model's num_warmup in "
        "benchmarks.models.BENCHMARK_MODELS, 500 or 3,000)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="DEER block size B (default: min(T, --max-block-size))",
    )
    parser.add_argument("--max-block-size", type=int, default=131072)
    parser.add_argument("--nuts-draws", type=int, default=1000)
    parser.add_argument(
        "--nuts-warmup",
        type=int,
        default=None,
        help="NUTS warmup steps (default: --warmup, else 500)",
    )
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--skip-stock", action="store_true")
    parser.add_argument(
        "--stock-max-draws",
        type=int,
        default=4096,
        help="run stock numpyro.infer.MCMC only for T up to this",
    )
    parser.add_argument("--skip-nuts", action="store_true")
    parser.add_argument("--skip-blackjax", action="store_true")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed runs after the compile run (median reported)",
    )
    parser.add_argument(
        "--single-run-above",
        type=float,
        default=120.0,
        help="when a first (compiling) run takes longer than this "
        "many seconds, do not repeat it: time it as that run less "
        "its measured compile time (marked in the JSON)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="time budget of the whole run: once spent, the "
        "remaining rows are marked skipped (checked between rows)",
    )
    parser.add_argument(
        "--match-tol",
        type=float,
        default=1e-3,
        help="a draw agrees with DEER's when every component has "
        "|a - b| <= tol * (1 + |a|)",
    )
    parser.add_argument(
        "--ess-backend",
        default="auto",
        choices=["auto", "numpyro", "jax"],
        help="numpyro: numpyro.diagnostics.effective_sample_size on the host "
        "(float64); jax: the same estimator on the device (float32, fast for "
        "millions of draws); auto: jax for sites of more than 2**24 numbers",
    )
    parser.add_argument(
        "--baseline-matmul-precision",
        default=None,
        choices=["default", "high", "highest"],
        help="run NUTS and BlackJAX under jax.default_matmul_precision(this) "
        "(default: JAX's setting; DEERMALA has its own matmul_precision)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=str(common.default_json_path("suite")))
    _setup.add_solver_arguments(parser)
    args = parser.parse_args(argv)
    for name in args.models:
        if name not in BENCHMARK_MODELS:
            parser.error(
                f"unknown model {name!r}; choose from {', '.join(BENCHMARK_MODELS)}"
            )
    if args.nuts_warmup is None:
        args.nuts_warmup = 500 if args.warmup is None else args.warmup
    return args


# --------------------------------------------------------------------- rows
def _first_chain(samples):
    return {k: v[0] for k, v in samples.items()}


ESS_BACKEND = "auto"


def _sample_stats(samples, time_s, num_draws):
    ess = common.min_ess(samples, backend=ESS_BACKEND)
    return {
        "time_s": time_s,
        "draws_per_s": num_draws / time_s if time_s > 0 else None,
        "min_ess": ess["min_ess"],
        "min_ess_site": ess["min_site"],
        "ess_per_s": ess["min_ess"] / time_s if time_s > 0 else None,
        "ess_components": ess["num_components"],
        "ess_nonfinite_components": ess["num_nonfinite"],
        "ess_backend": ess["backends"],
    }


def _timing_options(args):
    return {"repeats": args.repeats, "single_run_above_s": args.single_run_above}


def _timing_fields(timing):
    return {
        "from_first_run": timing["from_first_run"],
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


def run_block_driver(kernel, state, bench_data, num_warmup, num_draws, key, timing):
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
        return common.timed(go, **timing)


def run_stock(kernel, state, bench_data, num_warmup, num_draws, key, timing):
    """The same kernel through stock ``numpyro.infer.MCMC`` (under one jit)."""
    model_args, model_kwargs = bench_data
    mcmc = numpyro.infer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=num_draws, progress_bar=False
    )
    mcmc.post_warmup_state = state
    run = _setup.jitted_run(
        mcmc, model_args, model_kwargs, extra_fields=DEER_EXTRA_FIELDS
    )
    return common.timed(lambda: run(key), **timing)


def _deer_row(samples, extra, last, timing, num_draws, block_size):
    row = {"method": None, "T": num_draws, "B": block_size}
    row.update(_sample_stats(samples, timing["median_s"], num_draws))
    row.update(_timing_fields(timing))
    row.update(_block_stats(extra, block_size))
    info = last.block.info
    row["last_block_residual"] = float(info.residual)
    row["last_block_front"] = int(info.front)
    return row


def _baseline_precision(args):
    if args.baseline_matmul_precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(args.baseline_matmul_precision)


def run_nuts(bench, bench_data, args, key):
    with _baseline_precision(args):
        return _run_nuts(bench, bench_data, args, key)


def _run_nuts(bench, bench_data, args, key):
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
    run = _setup.jitted_run(
        mcmc, model_args, model_kwargs, extra_fields=("num_steps", "accept_prob")
    )
    (samples, extra, _), timing = common.timed(
        lambda: run(key_run), **_timing_options(args)
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


def run_blackjax_with_precision(args, *rest):
    with _baseline_precision(args):
        return run_blackjax(*rest)


def run_blackjax(blackjax, bench, bench_data, state, num_draws, key, timing):
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

    (samples, accept), timing = common.timed(lambda: run(key, w0), **timing)
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
    elif row.get("from_first_run"):
        out["status"] = "ok (1 run)"
    elif row.get("within_tol") is False:
        kind = "flip" if row.get("parting") == "accept flip" else "drift"
        out["status"] = f"parted@{row.get('first_disagreement')} ({kind})"
    else:
        out["status"] = "ok"
    return out


class Suite:
    """The run: options, results, the JSON written after every row."""

    def __init__(self, args):
        self.args = args
        self.options = _setup.kernel_options(args)
        self.info = common.machine_info()
        try:
            import blackjax
        except ImportError:
            blackjax = None
        self.blackjax = blackjax
        self.started = time.perf_counter()
        self.results = {
            "script": "suite",
            "machine": self.info,
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
                "single_run_above": args.single_run_above,
                "max_seconds": args.max_seconds,
                "match_tol": args.match_tol,
                "ess_backend": args.ess_backend,
                "baseline_matmul_precision": args.baseline_matmul_precision,
                "seed": args.seed,
                "kernel_options": self.options,
            },
            "notes": [],
            "models": {},
            "rows": [],
        }
        if blackjax is None and not args.skip_blackjax:
            self.results["notes"].append(
                "blackjax is not importable: its rows are skipped"
            )
        self.rows = self.results["rows"]

    # ------------------------------------------------------------ bookkeeping
    def save(self):
        common.write_json(self.args.json, self.results)

    def finish(self, row, model_name):
        row["model"] = model_name
        row["peak_bytes"] = common.peak_memory_bytes()
        row["bytes_in_use"] = common.bytes_in_use()
        self.rows.append(row)
        self.save()
        shown = _display(row)
        msg = ", ".join(
            f"{header}={common.fmt(shown.get(key), *spec)}"
            for key, header, *spec in COLUMNS[3:]
            if shown.get(key) is not None
        )
        print(f"  {model_name} T={row.get('T')}: {msg}", flush=True)
        if row.get("error"):
            print(f"    error: {row['error']}", flush=True)

    def out_of_time(self):
        budget = self.args.max_seconds
        return budget is not None and time.perf_counter() - self.started > budget

    def attempt(self, method, fn, *fn_args, **fields):
        """``fn(*fn_args)`` as a row; a failure becomes a row with ``error``."""
        if self.out_of_time():
            budget = self.args.max_seconds
            return dict(
                fields, method=method, skipped=f"time budget --max-seconds {budget}"
            )
        try:
            row = fn(*fn_args)
        except Exception as exc:  # keep going: one failure must not end the suite
            traceback.print_exc()
            row = dict(fields, error=f"{type(exc).__name__}: {exc}")
        row["method"] = method
        for key, value in fields.items():
            row.setdefault(key, value)
        return row

    # ----------------------------------------------------------------- model
    def run_model(self, model_index, name):
        args = self.args
        key_model = jax.random.fold_in(jax.random.PRNGKey(args.seed), model_index)
        key_warmup, key_run, key_nuts, key_bjx = jax.random.split(key_model, 4)
        bench, model_args, model_kwargs = _setup.get_model(name)
        model = ModelRun(
            bench,
            (model_args, model_kwargs),
            key_run,
            key_bjx,
            _setup.warmup_steps(bench, args.warmup),
        )
        model_info = {
            "latent_dim": bench.latent_dim,
            "description": bench.description,
            "warmup": model.num_warmup,
        }
        self.results["models"][name] = model_info
        print(f"\n{name}: {bench.description}", flush=True)
        if self.out_of_time():
            model_info["skipped"] = "time budget spent"
            row = {"method": "warmup", "skipped": "time budget spent"}
            self.finish(row, name)
            return
        try:
            model.state0, warmup_s = _setup.warmup(
                bench,
                model_args,
                model_kwargs,
                model.num_warmup,
                key_warmup,
                self.options,
            )
        except Exception as exc:
            traceback.print_exc()
            model_info["error"] = f"{type(exc).__name__}: {exc}"
            self.finish({"method": "warmup", "error": model_info["error"]}, name)
            return
        model_info.update(
            warmup_s=warmup_s,
            step_size=float(model.state0.adapt_state.step_size),
            warmup_accept_rate=float(model.state0.mean_accept_prob),
        )
        print(
            f"  warmup {model.num_warmup} steps: {warmup_s:.1f} s (with compilation), "
            f"step size {model_info['step_size']:.3g}, accept "
            f"{model_info['warmup_accept_rate']:.2f}",
            flush=True,
        )

        nuts_ess_per_s = None
        if not args.skip_nuts:
            row = self.attempt(
                "nuts", run_nuts, bench, model.data, args, key_nuts, T=args.nuts_draws
            )
            nuts_ess_per_s = row.get("ess_per_s")
            row["ess_per_s_vs_nuts"] = 1.0 if nuts_ess_per_s else None
            self.finish(row, name)

        for num_draws in args.draws:
            self.run_length(model, name, num_draws, nuts_ess_per_s)

    def run_length(self, model, name, num_draws, nuts_ess_per_s):
        """The rows of one chain length T."""
        args = self.args
        block_size = args.block_size or min(num_draws, args.max_block_size)
        fields = {"T": num_draws, "B": block_size}
        new_rows = []

        def add(row):
            self.finish(row, name)
            new_rows.append(row)

        deer = self.attempt(
            "deer", self.deer_row, model, "deer", num_draws, block_size, **fields
        )
        add(deer)
        t_seq = None
        if not args.skip_sequential:
            row = self.attempt(
                "sequential",
                self.deer_row,
                model,
                "sequential",
                num_draws,
                block_size,
                **fields,
            )
            t_seq = row.get("time_s")
            add(row)
        if not args.skip_stock:
            if num_draws <= args.stock_max_draws:
                row = self.attempt(
                    "stock",
                    self.deer_row,
                    model,
                    "stock",
                    num_draws,
                    block_size,
                    **fields,
                )
            else:
                limit = args.stock_max_draws
                row = dict(fields, skipped=f"T > --stock-max-draws {limit}")
                row["method"] = "stock"
            add(row)
        if not args.skip_blackjax:
            if self.blackjax is None:
                row = {"method": "blackjax", "T": num_draws}
                row["skipped"] = "blackjax not importable"
            else:
                row = self.attempt(
                    "blackjax",
                    run_blackjax_with_precision,
                    args,
                    self.blackjax,
                    model.bench,
                    model.data,
                    model.state0,
                    num_draws,
                    model.key_bjx,
                    _timing_options(args),
                    T=num_draws,
                )
            add(row)
        for row in new_rows:
            if t_seq and row.get("time_s"):
                row["speedup_vs_sequential"] = t_seq / row["time_s"]
            if nuts_ess_per_s and row.get("ess_per_s") is not None:
                row["ess_per_s_vs_nuts"] = row["ess_per_s"] / nuts_ess_per_s
        model.deer_draws = None
        self.save()

    def deer_row(self, model, method, num_draws, block_size):
        """A ``deer``, ``sequential`` or ``stock`` row (same post-warmup state, key)."""
        args = self.args
        model_args, model_kwargs = model.data
        kernel_method = "sequential" if method == "sequential" else "deer"
        kernel = _setup.make_kernel(
            model.bench, block_size, kernel_method, self.options
        )
        state = _setup.attach(
            kernel, model.state0, model_args, model_kwargs, model.num_warmup
        )
        run = run_stock if method == "stock" else run_block_driver
        (samples, extra, last), timing = run(
            kernel,
            state,
            model.data,
            model.num_warmup,
            num_draws,
            model.key_run,
            _timing_options(args),
        )
        row = _deer_row(samples, extra, last, timing, num_draws, block_size)
        row["kernel"] = _setup.describe_kernel(kernel)
        row["accept_rate"] = float(np.mean(np.asarray(extra["accept_prob"])))
        row["divergences"] = int(np.sum(np.asarray(extra["diverging"])))
        flat = common.flatten_draws(_first_chain(samples))
        if method == "deer":
            model.deer_draws = flat
        elif model.deer_draws is not None:
            row.update(common.compare_draws(model.deer_draws, flat, args.match_tol))
            row["within_tol"] = row["agree_fraction"] == 1.0
        if method == "sequential":
            for key in (
                "newton_its_median",
                "newton_its_max",
                "newton_its_per_block",
                "blocks_converged_fraction",
                "last_block_residual",
                "last_block_front",
            ):
                row.pop(key, None)
        return row

    # ------------------------------------------------------------------ main
    def run(self):
        args = self.args
        print(
            f"# suite: {', '.join(args.models)}; T in {args.draws}; "
            f"{common.describe_machine(self.info)}",
            flush=True,
        )
        for model_index, name in enumerate(args.models):
            self.run_model(model_index, name)
        self.save()
        print()
        for note in self.results["notes"]:
            print(f"note: {note}")
        print(f"wrote {args.json}")
        warmup = args.warmup or "per model (models' num_warmup)"
        print(
            f"{common.describe_machine(self.info)}; warmup {warmup}; timed runs "
            "exclude compilation; 'vs seq' = sequential time / time; 'vs NUTS' = "
            "ESS/s / NUTS's ESS/s"
        )
        print(common.format_table([_display(r) for r in self.rows], COLUMNS))


class ModelRun:
    """What the rows of one model share."""

    def __init__(self, bench, data, key_run, key_bjx, num_warmup):
        self.bench = bench
        self.data = data
        self.key_run = key_run
        self.key_bjx = key_bjx
        self.num_warmup = num_warmup
        self.state0 = None
        self.deer_draws = None


def main(argv=None):
    global ESS_BACKEND
    args = parse_args(argv)
    ESS_BACKEND = args.ess_backend
    Suite(args).run()


if __name__ == "__main__":
    main()
