"""The Jacobian strategies by dimension: Newton iterations, run and compile time.

For each setting, one DEER block of ``T`` transitions per run key with each of
``--jacobians`` (default ``stochastic`` and ``full``) on the same tape:

* ``banana``: the Zoltowski et al. (2025) banana HMC chain of
  ``benchmarks/paper.py`` (D = 2, 8 leapfrog steps of 0.5, no jitter, no
  adaptation, started at ``10 * N(0, I)`` drawn from the run key), ``T`` from
  ``--banana-T``.
* ``gaussian`` and ``logistic`` at each of ``--dims``: a correlated Gaussian
  (``benchmarks/models.py``'s ill-conditioned one, condition number 100) and a
  logistic regression of ``D - 1`` features (200 rows), with ``DEERMALA``
  and ``DEERHMC`` (``--kernels``), after ``--num-warmup`` sequential warmup
  draws (step size and diagonal mass matrix adapted), so the block runs at a
  typical state and step size; ``T`` from ``--T``.
* ``paper_mala``: the paper's MALA on a logistic regression of German
  credit's shape (D = 25, step size 0.0015, no adaptation, 2 chains), ``T``
  from ``--mala-T``.

A row is one setting and strategy: ``its`` the block's Newton iterations
(mean over the run keys, and each key's), ``second_s`` the median over the
keys of a compiled run's seconds (each key's fastest of ``--repeats``; the
strategies' runs alternate), ``time_ratio`` that over the first strategy's,
``compile_s`` the first run's seconds minus the same key's compiled run,
``converged`` whether every block certified every step, and ``max_diff`` the
largest ``|x_t - x'_t|`` against the first strategy's draws (the same tape:
both are the sequential chain up to the tolerance). Float32 unless
``--x64``.

    PYTHONPATH=. python3 benchmarks/jacobian_dim.py --json OUT.json
    PYTHONPATH=. python3 benchmarks/jacobian_dim.py --cases banana \\
        --banana-T 2000 20000 --keys 4 --json OUT.json
"""

from __future__ import annotations

import argparse
import time
import warnings
from functools import partial
from statistics import median

import _setup  # noqa: F401  (the repository root on sys.path)
import common
import jax
import numpy as np
import paper

import numpyro_deer
from benchmarks.models import (
    ill_conditioned_gaussian,
    logistic_regression,
    make_ill_conditioned_gaussian_data,
    make_logistic_regression_data,
)

CASES = ("banana", "gaussian", "logistic", "paper_mala")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", choices=("cpu", "gpu"), default=None)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--jacobians", nargs="+", default=["stochastic", "full"])
    parser.add_argument("--dims", nargs="+", type=int, default=[2, 4, 8, 16])
    parser.add_argument("--kernels", nargs="+", choices=("mala", "hmc"),
                        default=["mala", "hmc"])  # fmt: skip
    parser.add_argument("--T", type=int, default=2000, help="gaussian, logistic")
    parser.add_argument("--banana-T", nargs="+", type=int, default=[2000])
    parser.add_argument("--mala-T", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=3, help="run keys per setting")
    parser.add_argument(
        "--repeats", type=int, default=2, help="compiled runs per key; the fastest"
    )
    parser.add_argument("--num-warmup", type=int, default=200)
    parser.add_argument("--x64", action="store_true", help="float64 throughout")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def _one_run(make_kernel, T, chains, key, run_kwargs, start):
    """``(seconds, draws (C, T, D), iterations, converged)`` of one ``MCMC``."""
    mcmc = numpyro_deer.MCMC(
        make_kernel(), num_warmup=0, num_samples=T, num_chains=chains,
        chain_method="vectorized" if chains > 1 else "sequential",
        progress_bar=False,
    )  # fmt: skip
    if start is not None:
        mcmc.post_warmup_state = start
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", numpyro_deer.DEERConvergenceWarning)
        warnings.simplefilter("ignore", numpyro_deer.ConvergenceDiagnosticWarning)
        mcmc.run(
            key, extra_fields=("newton_iterations", "block.info.front"), **run_kwargs
        )
        samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    seconds = time.perf_counter() - tic
    if not isinstance(samples, dict):  # a potential_fn on one array
        samples = {"x": samples}
    draws = np.concatenate(
        [np.reshape(v, v.shape[:2] + (-1,)) for v in samples.values()], -1
    )
    fields = mcmc.get_extra_fields(group_by_chain=True)
    its = int(np.max(fields["newton_iterations"]))
    converged = bool(np.all(np.asarray(fields["block.info.front"])[:, :1] >= T))
    return seconds, draws, its, converged


def setting_rows(info, make_kernel, T, chains, run_kwargs, ns, start=None):
    """One row per strategy of ``ns.jacobians`` for a setting; ``make_kernel(
    solver)`` builds its kernel, ``run_kwargs(i)`` the run's arguments for
    key ``i`` (``init_params`` and data). The strategies' compiled runs
    alternate (key by key, ``ns.repeats`` rounds), so a change of the
    machine's load falls on all of them; a key's time is its fastest run."""
    kernels = {
        j: partial(make_kernel, numpyro_deer.DEERSolver(jacobian=j))
        for j in ns.jacobians
    }
    keys = [jax.random.PRNGKey(i) for i in range(ns.keys)]
    first = {
        j: _one_run(kernels[j], T, chains, keys[0], run_kwargs(0), start)[0]
        for j in ns.jacobians
    }
    runs: dict = {j: [None] * ns.keys for j in ns.jacobians}
    for _ in range(ns.repeats):
        for i, key in enumerate(keys):
            for j in ns.jacobians:
                run = _one_run(kernels[j], T, chains, key, run_kwargs(i), start)
                best = runs[j][i]
                runs[j][i] = run if best is None or run[0] < best[0] else best
    rows, reference = [], runs[ns.jacobians[0]][0][1]
    for j in ns.jacobians:
        its = [r[2] for r in runs[j]]
        second = median(r[0] for r in runs[j])
        rows.append(
            {
                **info,
                "T": T,
                "chains": chains,
                "jacobian": j,
                "its": float(np.mean(its)),
                "its_by_key": its,
                "second_s": second,
                "time_ratio": second / rows[0]["second_s"] if rows else 1.0,
                "first_s": first[j],
                "compile_s": first[j] - runs[j][0][0],
                "converged": all(r[3] for r in runs[j]),
                "max_diff": float(np.max(np.abs(runs[j][0][1] - reference))),
                "finite": bool(np.all(np.isfinite(runs[j][0][1]))),
            }
        )
        print(
            f"{info['case']} {info['kernel']} D={info['D']} T={T} {j}: its {its}, "
            f"{second:.3g} s, compile {rows[-1]['compile_s']:.3g} s",
            flush=True,
        )
    return rows


def banana_rows(ns) -> list[dict]:
    def make_kernel(T):
        return lambda solver: numpyro_deer.DEERHMC(
            potential_fn=paper.banana_potential, step_size=0.5, num_steps=8,
            jitter=0.0, adapt_step_size=False, adapt_mass_matrix=False,
            block_size=T, method="deer", solver=solver,
        )  # fmt: skip

    def run_kwargs(i):
        x0 = 10.0 * jax.random.normal(jax.random.PRNGKey(1000 + i), (2,))
        return {"init_params": x0.astype(jax.numpy.result_type(float))}

    info = {"case": "banana", "kernel": "hmc", "D": 2}
    rows = []
    for T in ns.banana_T:
        rows += setting_rows(info, make_kernel(T), T, 1, run_kwargs, ns)
    return rows


def dim_rows(case, dim, kernel_name, ns) -> list[dict]:
    if case == "gaussian":
        model = ill_conditioned_gaussian
        args, kwargs = make_ill_conditioned_gaussian_data(0, dim, 100.0)
    else:
        model = logistic_regression
        args, kwargs = make_logistic_regression_data(0, 200, dim - 1)
    cls = numpyro_deer.DEERMALA if kernel_name == "mala" else numpyro_deer.DEERHMC

    def make_kernel(solver, method="deer"):
        return cls(model, block_size=ns.T, method=method, solver=solver)

    warm = numpyro_deer.MCMC(
        make_kernel(numpyro_deer.DEERSolver(), "sequential"),
        num_warmup=ns.num_warmup, num_samples=ns.T, progress_bar=False,
    )  # fmt: skip
    warm.warmup(jax.random.PRNGKey(99), *args, **kwargs)
    start = jax.block_until_ready(warm.post_warmup_state)
    data = {"scale_tril": args[0]} if case == "gaussian" else {"X": args[0], **kwargs}
    info = {"case": case, "kernel": kernel_name, "D": dim}
    return setting_rows(info, make_kernel, ns.T, 1, lambda i: data, ns, start)


def paper_mala_rows(ns) -> list[dict]:
    X, y = paper.german_credit_shape()

    def make_kernel(solver):
        return numpyro_deer.DEERMALA(
            paper.logistic_model, step_size=0.0015, adapt_step_size=False,
            adapt_mass_matrix=False, block_size=ns.mala_T, method="deer",
            solver=solver,
        )  # fmt: skip

    info = {"case": "paper_mala", "kernel": "mala", "D": X.shape[1]}
    return setting_rows(info, make_kernel, ns.mala_T, 2, lambda i: {"X": X, "y": y}, ns)


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    if ns.platform:
        jax.config.update("jax_platforms", "cuda" if ns.platform == "gpu" else "cpu")
    if ns.x64:
        jax.config.update("jax_enable_x64", True)
    out = ns.json or common.default_json_path("jacobian_dim")
    rows: list[dict] = []

    def save():
        common.write_json(
            out, {"machine": common.machine_info(), "args": vars(ns), "rows": rows}
        )

    for case in ns.cases:
        if case == "banana":
            rows += banana_rows(ns)
        elif case == "paper_mala":
            rows += paper_mala_rows(ns)
        else:
            for dim in ns.dims:
                for kernel_name in ns.kernels:
                    rows += dim_rows(case, dim, kernel_name, ns)
                    save()
        save()
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            rows,
            [
                ("case", "case"),
                ("kernel", "kernel"),
                ("D", "D"),
                ("T", "T"),
                ("jacobian", "jacobian"),
                ("its", "Newton its", ".4g"),
                ("its_by_key", "its by key"),
                ("second_s", "second s", ".3g"),
                ("time_ratio", "/ first", ".2f"),
                ("compile_s", "compile s", ".3g"),
                ("converged", "converged"),
                ("max_diff", "max |diff|", ".2g"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
