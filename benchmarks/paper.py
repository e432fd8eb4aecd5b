"""The benchmarks of Zoltowski et al. (2025), sequential against DEER.

Zoltowski et al., "Parallelizing MCMC Across the Sequence Length" (2025): two
of the paper's settings, sequential against DEER on the same tape, with no
warmup and no adaptation (the kernels run at the paper's fixed step sizes):

* ``banana``: the Inference Gym's banana target (D = 2),
  ``x0 ~ N(0, 10^2)``, ``x1 | x0 ~ N(0.03 (x0^2 - 100), 1)`` (its ground truth
  ``E[x^2] = (100, 19)``), HMC with 8 leapfrog steps of 0.5, no jitter, one
  chain started at ``10 * N(0, I)``, ``T`` transitions (100,000 at
  ``--size full``) in one block. Rows: ``sequential``
  (``DEERHMC(method="sequential")``), ``deer`` (Hutchinson's diagonal,
  ``DEERSolver(jacobian="stochastic")``) and ``deer_full``
  (``DEERSolver(jacobian="full")``, the paper's DEER proper and the default
  solver's choice at D <= 2; the paper damps its Newton steps, which
  ``DEERSolver`` does not).
* ``mala``: MALA at step size 0.0015 on a logistic regression of German
  credit's shape (N = 1,000 rows, D = 25 coefficients with the intercept,
  synthetic standardized data, prior ``N(0, 1)``), 2 chains (vectorized) of
  2,048 and of 16,384 steps, each length one block; rows ``sequential``,
  ``deer`` and ``deer_full`` as for the banana.

Every row times a first ``MCMC`` object (``first_s``: tracing and compiling
included) and then ``--repeats`` more built the same way (``second_s``, the
median of their times, each in ``second_s_all``: a new kernel and driver, the
compiled programs reused); ``compile_s`` is the difference. It reports the
Newton iterations of the block (``newton_iterations``, the extra field; the
largest over chains), ``converged`` (every chain's solve passed, no
sequential fallback), the
gradient counts of ``benchmarks/race.py`` (``gradients``,
``critical_path_gradients``, ``scan_levels``), and ``max_abs_diff``: the
largest ``|x_t - x_t^seq|`` over all draws and coordinates against the
sequential row of the same setting (the same tape). Float32 unless ``--x64``.
``--looped-leapfrog`` keeps the banana's leapfrog loop where ``DEERHMC``
writes its 8 steps out (on an accelerator). ``--variants`` picks the DEER
rows, ``--sweeps k ...`` runs each with
``DEERSolver(sweep=k)`` (``--sweep-after n`` its hold-back): the sweep's
sequential steps against the Newton iterations they save.

    PYTHONPATH=. python3 benchmarks/paper.py --size tiny
    PYTHONPATH=. python3 benchmarks/paper.py --platform gpu --size full \\
        --json $OUT/paper.json
    # the banana chain's repeat runs, the median of nine (the spread between
    # runs and processes is several milliseconds on a GPU)
    PYTHONPATH=. python3 benchmarks/paper.py --platform gpu --size full \\
        --cases banana --variants deer_full --repeats 9
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SIZES = {
    # banana transitions; MALA chains and lengths
    "tiny": {"banana": 512, "mala": (256, 1024)},
    "full": {"banana": 100_000, "mala": (2048, 16_384)},
}
BANANA_CURVATURE = 0.03
BANANA_SCALE = 10.0


def banana_potential(x):
    """Negative log density of the Gym's banana (up to a constant)."""
    import jax.numpy as jnp

    x0, x1 = x[..., 0], x[..., 1]
    shift = BANANA_CURVATURE * (x0**2 - BANANA_SCALE**2)
    return 0.5 * (x0 / BANANA_SCALE) ** 2 + 0.5 * jnp.square(x1 - shift)


def german_credit_shape(seed: int = 0, rows: int = 1000, features: int = 24):
    """Synthetic data of German credit's shape: standardized features, an
    intercept column (D = features + 1) and labels from a coefficient vector
    drawn from the prior."""
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, features))
    X = np.concatenate([np.ones((rows, 1)), X], axis=1)
    w = rng.standard_normal(features + 1)
    y = (rng.uniform(size=rows) < 1 / (1 + np.exp(-X @ w))).astype(np.float32)
    return X.astype(np.float32), y


def logistic_model(X, y):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def _run(make_kernel, chains, T, run_kwargs, repeats=1):
    """``1 + repeats`` ``MCMC`` objects of ``make_kernel()``: times (the first,
    the repeats' median and all of them), draws, extra fields."""
    import jax
    import numpy as np

    import numpyro_deer

    seconds = []
    for _ in range(1 + repeats):
        kernel = make_kernel()
        mcmc = numpyro_deer.MCMC(
            kernel, num_warmup=0, num_samples=T, num_chains=chains,
            chain_method="vectorized" if chains > 1 else "sequential",
            progress_bar=False,
        )  # fmt: skip
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", numpyro_deer.DEERConvergenceWarning)
            mcmc.run(
                jax.random.PRNGKey(0),
                extra_fields=("newton_iterations", "block.info.front"),
                **run_kwargs,
            )
            samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
        seconds.append(time.perf_counter() - t0)
    out = {"first_s": seconds[0], "second_s": float(np.median(seconds[1:]))}
    out["second_s_all"] = seconds[1:]
    if not isinstance(samples, dict):  # a potential_fn on one array
        samples = {"x": samples}
    draws = np.concatenate(
        [np.reshape(v, v.shape[:2] + (-1,)) for v in samples.values()], -1
    )
    fields = mcmc.get_extra_fields(group_by_chain=True)
    its = np.asarray(fields["newton_iterations"])[:, :1]
    fronts = np.asarray(fields["block.info.front"])[:, :1]
    return out, draws, its, fronts, kernel


def _row(case, variant, make_kernel, chains, T, run_kwargs, reference, repeats=1):
    import _counts
    import numpy as np

    times, draws, its, fronts, kernel = _run(
        make_kernel, chains, T, run_kwargs, repeats
    )
    dim = draws.shape[-1]
    counts = _counts.deer_kernel_blocks(kernel, its, fronts, dim)
    method = _counts.kernel_method(kernel)
    row = {
        "case": case,
        "variant": variant,
        "chains": chains,
        "T": T,
        **times,
        "compile_s": times["first_s"] - times["second_s"],
        "newton_iterations": int(its.max()) if method != "sequential" else None,
        "converged": bool(np.all(fronts >= T)) if method != "sequential" else None,
        **counts.as_dict(),
        "finite": bool(np.all(np.isfinite(draws))),
    }
    if reference is not None:
        row["max_abs_diff"] = float(np.max(np.abs(draws - reference)))
    else:
        row["mean"] = draws.mean((0, 1)).tolist()
        row["second_moment"] = (draws**2).mean((0, 1)).tolist()
    return row, draws


VARIANTS = {"deer": "stochastic", "deer_full": "full"}
"""The DEER rows: their Jacobian strategy."""


def _case_rows(
    case, kernel, chains, T, run_kwargs, solver_options, variants, sweeps, repeats
) -> list[dict]:
    """The sequential row of ``case``, then DEER with Hutchinson's diagonal
    (``deer``) and with the full Jacobian (``deer_full``) on the same tape,
    each with ``DEERSolver(sweep=k)`` for each ``k`` in ``sweeps`` (``None``:
    the default); ``kernel(method, solver)`` makes the kernel's factory."""
    from numpyro_deer import DEERSolver

    seq, ref = _row(
        case, "sequential", kernel("sequential", DEERSolver()), chains, T,
        run_kwargs, None, repeats,
    )  # fmt: skip
    rows = [seq]
    for variant in variants:
        for sweep in sweeps:
            options = (
                solver_options if sweep is None else {**solver_options, "sweep": sweep}
            )
            solver = DEERSolver(jacobian=VARIANTS[variant], **options)
            row = _row(
                case, variant, kernel("deer", solver), chains, T, run_kwargs, ref,
                repeats,
            )[0]  # fmt: skip
            rows.append({**row, "sweep": "default" if sweep is None else sweep})
    return rows


def looped(kernel):
    """``kernel`` (a ``DEERHMC``) with its leapfrog loop kept where
    ``DEERHMC`` writes the steps out (short fixed counts on an accelerator):
    the comparison for ``numpyro_deer.infer.hmc.unrolls``."""
    from dataclasses import replace

    transition = replace(kernel.transition, unroll=False)
    kernel._settings = replace(kernel._settings, transition=transition)
    return kernel


def banana_rows(
    T: int, solver_options: dict, variants, sweeps, repeats: int = 1, loop=False
) -> list[dict]:
    import jax
    import jax.numpy as jnp

    import numpyro_deer

    x0 = 10.0 * jax.random.normal(jax.random.PRNGKey(1), (2,))
    run_kwargs = {"init_params": x0.astype(jnp.result_type(float))}

    def kernel(method, solver):
        def make():
            k = numpyro_deer.DEERHMC(
                potential_fn=banana_potential, step_size=0.5, num_steps=8,
                jitter=0.0, adapt_step_size=False, adapt_mass_matrix=False,
                block_size=T, method=method, solver=solver,
            )  # fmt: skip
            return looped(k) if loop else k

        return make

    return _case_rows(
        "banana", kernel, 1, T, run_kwargs, solver_options, variants, sweeps, repeats
    )


def mala_rows(
    T: int, solver_options: dict, variants, sweeps, repeats: int = 1
) -> list[dict]:
    import numpyro_deer

    X, y = german_credit_shape()
    run_kwargs = {"X": X, "y": y}

    def kernel(method, solver):
        return lambda: numpyro_deer.DEERMALA(
            logistic_model, step_size=0.0015, adapt_step_size=False,
            adapt_mass_matrix=False, block_size=T, method=method, solver=solver,
        )  # fmt: skip

    return _case_rows(
        "mala", kernel, 2, T, run_kwargs, solver_options, variants, sweeps, repeats
    )


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", choices=("cpu", "gpu"), default=None)
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--cases", nargs="+", choices=("banana", "mala"),
                        default=["banana", "mala"])  # fmt: skip
    parser.add_argument("--x64", action="store_true", help="float64 throughout")
    parser.add_argument(
        "--max-iter", type=int, default=None, help="DEERSolver(max_iter=...)"
    )
    parser.add_argument(
        "--max-solves", type=int, default=None, help="DEERSolver(max_solves=...)"
    )
    parser.add_argument(
        "--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS),
        help="the DEER rows (the sequential row always runs: the reference)",
    )  # fmt: skip
    parser.add_argument(
        "--sweeps", nargs="+", type=int, default=None,
        help="DEERSolver(sweep=k) for each k (default: the default solver's)",
    )  # fmt: skip
    parser.add_argument(
        "--sweep-after", type=int, default=None, help="DEERSolver(sweep_after=...)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="timed runs after the first (second s: their median)",
    )  # fmt: skip
    parser.add_argument(
        "--looped-leapfrog", action="store_true",
        help="the banana's leapfrog loop kept (DEERHMC writes 8 steps out on an "
        "accelerator): the comparison",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="default results/paper_SIZE.json")
    ns = parser.parse_args(argv)

    import jax

    if ns.platform:
        jax.config.update("jax_platforms", "cuda" if ns.platform == "gpu" else "cpu")
    if ns.x64:
        jax.config.update("jax_enable_x64", True)
    import common

    solver_options = {
        k: v
        for k, v in (
            ("max_iter", ns.max_iter),
            ("max_solves", ns.max_solves),
            ("sweep_after", ns.sweep_after),
        )
        if v is not None
    }
    size = SIZES[ns.size]
    sweeps = ns.sweeps or [None]
    out = Path(ns.json) if ns.json else common.default_json_path(f"paper_{ns.size}")
    rows: list[dict] = []

    def save():
        common.write_json(
            out,
            {"machine": common.machine_info(), "args": vars(ns), "rows": rows},
        )

    if "banana" in ns.cases:
        rows += banana_rows(
            size["banana"], solver_options, ns.variants, sweeps, ns.repeats,
            loop=ns.looped_leapfrog,
        )  # fmt: skip
        save()
    if "mala" in ns.cases:
        for T in size["mala"]:
            rows += mala_rows(T, solver_options, ns.variants, sweeps, ns.repeats)
            save()
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            rows,
            [
                ("case", "case"),
                ("variant", "variant"),
                ("chains", "chains"),
                ("T", "T"),
                ("sweep", "sweep"),
                ("first_s", "first s", ".3g"),
                ("second_s", "second s", ".3g"),
                ("compile_s", "compile s", ".3g"),
                ("newton_iterations", "Newton its"),
                ("converged", "converged"),
                ("critical_path_gradients", "crit. path", ".3g"),
                ("gradients", "grads", ".3g"),
                ("max_abs_diff", "max |diff|", ".2g"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
