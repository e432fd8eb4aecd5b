"""One Hessian window end with many vectorized chains: what its parts cost.

At the end of each middle warmup window, ``adapt_mass_matrix="hessian"``
gives every chain the inverse of its mean Hessian over ``K = 16`` curvature
points (``numpyro_deer.infer.hessian_mass.hessian_inverse_mass``). With
``C`` vectorized chains that is ``C K D`` Hessian-vector products and ``C``
``D x D`` matrices to invert. This script times, for each model and chain
count, with the chains under one ``jax.vmap`` as the kernel maps them on a
GPU:

* ``hessian``: the mean Hessians alone (the chains in groups of
  ``--hessian-group``, as the memory plan solves a large model's, each
  chain's columns by ``mean_hessian``'s own rule: all at once up to
  ``D = 128``);
* ``hessian_8``: the mean Hessians of all chains under one ``jax.vmap``,
  8 columns at a time (``column_batch=8``, what a GPU's window end of
  vectorized chains takes), and the memory XLA plans for that program
  (``temp_gb_8``) and for the same with all columns at once
  (``temp_gb_all``, compiled, not run);
* ``eigh``: every matrix's ``|H|^{-1}`` as the package computes it
  (``core.hessian.inverse_abs``, an eigendecomposition per matrix);
* ``cholesky``, for comparison: every matrix's ``H^{-1}`` by its Cholesky
  factor, which equals ``|H|^{-1}`` where ``H`` is positive definite and the
  eigenvalue floor does not bind, and ``positive``, the share of chains
  whose Hessian is positive definite.

The curvature points are those of one chain after ``--warmup`` steps of
``DEERMALA``'s sequential warmup, each chain's with small noise added. Each
time is the median of at least ``--repeats`` calls after a first (compiling) one
(``benchmarks.common.timed``: fast calls repeated to half a second).

    PYTHONPATH=. python3 benchmarks/window_end.py --platform gpu \\
        --models eight_schools hierarchical_logistic_regression \\
        logistic_regression_large --chains 1 64 256 1024 \\
        --json benchmarks/results/h100/window_end_h100.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--platform", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["eight_schools", "hierarchical_logistic_regression"],
    )
    parser.add_argument("--chains", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--hessian-group", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def median_seconds(fn, arg, repeats: int) -> float:
    """The median time of ``fn(arg)`` after a compiling call
    (:func:`benchmarks.common.timed`)."""
    from benchmarks import common

    return common.timed(lambda: fn(arg), repeats=repeats)[1]["median_s"]


def cholesky_inverse(hessian):
    """``H^{-1}`` through ``H = R R^T`` (NaN where ``H`` is not positive definite)."""
    import jax
    import jax.numpy as jnp

    eye = jnp.eye(hessian.shape[-1], dtype=hessian.dtype)
    return jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(hessian), True), eye)


def run_model(name: str, ns) -> list[dict]:
    import jax
    import jax.numpy as jnp

    import numpyro_deer
    from benchmarks.models import BENCHMARK_MODELS
    from benchmarks.parallel_warmup import flat_potential
    from numpyro_deer.core import hessian as hessian_module

    potential, dim = flat_potential(name)
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    kernel = numpyro_deer.DEERMALA(bench.model, method="sequential")
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=ns.warmup, num_samples=1, progress_bar=False
    )
    mcmc.warmup(jax.random.PRNGKey(0), *args, **kwargs)
    warm_points = mcmc.post_warmup_state.curvature_points
    rows = []
    for num_chains in ns.chains:
        key = jax.random.PRNGKey(num_chains)
        noise = jax.random.normal(key, (num_chains, *warm_points.shape))
        points = warm_points + 0.01 * noise
        group = min(num_chains, ns.hessian_group)

        hessian = partial(hessian_module.mean_hessian, potential)
        hessians = jax.jit(partial(jax.lax.map, hessian, batch_size=group))
        matrices = hessians(points)
        by_columns = {
            batch: jax.jit(jax.vmap(partial(hessian, column_batch=batch)))
            for batch in (None, 8)
        }
        temp = {
            batch: fn.lower(points).compile().memory_analysis().temp_size_in_bytes / 1e9
            for batch, fn in by_columns.items()
        }
        eigh = jax.jit(jax.vmap(hessian_module.inverse_abs))
        cholesky = jax.jit(jax.vmap(cholesky_inverse))
        positive = jnp.all(jnp.isfinite(cholesky(matrices)), axis=(1, 2))
        row = {
            "model": name,
            "dim": dim,
            "num_chains": num_chains,
            "hessian_s": median_seconds(hessians, points, ns.repeats),
            "hessian_8_s": median_seconds(by_columns[8], points, ns.repeats),
            "temp_gb_all": temp[None],
            "temp_gb_8": temp[8],
            "eigh_s": median_seconds(eigh, matrices, ns.repeats),
            "cholesky_s": median_seconds(cholesky, matrices, ns.repeats),
            "positive": float(jnp.mean(positive)),
        }
        print(
            f"{name} D={dim} chains={num_chains}: hessian {row['hessian_s']:.4f} s"
            f" ({row['hessian_8_s']:.4f} s by 8 columns; {row['temp_gb_all']:.3g} GB"
            f" planned for all columns, {row['temp_gb_8']:.3g} GB by 8),"
            f" eigh {row['eigh_s']:.4f} s, cholesky {row['cholesky_s']:.4f} s"
            f" (positive definite {row['positive']:.2f})",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    return rows


def main(argv=None) -> None:
    ns = parse_args(argv)
    import jax

    from benchmarks import common

    jax.config.update("jax_platforms", "cuda" if ns.platform == "gpu" else "cpu")
    rows = [row for name in ns.models for row in run_model(name, ns)]
    columns = [
        ("model", "model", "s"),
        ("dim", "D", "d"),
        ("num_chains", "chains", "d"),
        ("hessian_s", "hessian s", ".4f"),
        ("hessian_8_s", "by 8 columns s", ".4f"),
        ("temp_gb_all", "GB all columns", ".3g"),
        ("temp_gb_8", "GB by 8", ".3g"),
        ("eigh_s", "eigh s", ".4f"),
        ("cholesky_s", "cholesky s", ".4f"),
        ("positive", "positive", ".2f"),
    ]
    print(common.format_table(rows, columns))
    path = ns.json or common.default_json_path("window_end")
    common.write_json(path, {"machine": common.machine_info(), "rows": rows})


if __name__ == "__main__":
    main()
