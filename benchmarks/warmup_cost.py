"""What warmup costs as the dimension grows, and what in it grows.

A synthetic item response theory model (``S`` students' abilities, ``Q``
questions' difficulties and a mean ability, ``D = S + Q + 1`` with
``S = 4 Q``; each student answers 20 questions drawn at random) is warmed up
by ``DEERMALA`` through ``numpyro_deer.MCMC.warmup`` for each ``D``, mass
adaptation and chain layout, and the warmup's execution time (wall time less
JAX's tracing, lowering and compiling, measured through ``jax.monitoring``)
reported per warmup step. Apart from that, one window end of the Hessian mass
matrix (``hessian_inverse_mass`` on the ``K = 16`` curvature points) is timed
on its own, so the share of the window ends in the warmup is known.

    PYTHONPATH=. python3 benchmarks/warmup_cost.py --dims 101 251 501 \\
        --out benchmarks/results/warmup_cost_cpu.json
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
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer.hmc_util import build_adaptation_schedule  # noqa: E402

import numpyro_deer  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.end_to_end import CompileSpans  # noqa: E402

ANSWERS_PER_STUDENT = 20


def irt(student, question, correct=None, num_students=None, num_questions=None):
    """1PL item response model: ``logit P(correct) = delta + alpha_s - beta_q``."""
    delta = numpyro.sample("delta", dist.Normal(0.75, 1.0))
    with numpyro.plate("students", num_students.shape[0]):
        alpha = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
    with numpyro.plate("questions", num_questions.shape[0]):
        beta = numpyro.sample("beta", dist.Normal(0.0, 1.0))
    logits = delta + alpha[student] - beta[question]
    with numpyro.plate("answers", student.shape[0]):
        numpyro.sample("correct", dist.Bernoulli(logits=logits), obs=correct)


def irt_data(dim: int, seed: int = 0):
    num_questions = max(1, (dim - 1) // 5)
    num_students = dim - 1 - num_questions
    rng = np.random.default_rng(seed)
    student = np.repeat(np.arange(num_students), ANSWERS_PER_STUDENT)
    question = rng.integers(0, num_questions, student.size)
    alpha = rng.standard_normal(num_students)
    beta = rng.standard_normal(num_questions)
    p = 1.0 / (1.0 + np.exp(-(0.75 + alpha[student] - beta[question])))
    correct = (rng.random(student.size) < p).astype(np.int32)
    kwargs = {
        "correct": jnp.asarray(correct),
        # sizes as array shapes, so the data may be passed as arguments
        "num_students": jnp.zeros(num_students),
        "num_questions": jnp.zeros(num_questions),
    }
    return (jnp.asarray(student), jnp.asarray(question)), kwargs


def time_window_end(dim: int, potential, x, repeats: int = 3) -> float:
    """Seconds of one Hessian window end (16 points) at dimension ``dim``."""
    from numpyro_deer.infer.block import NUM_CURVATURE_POINTS
    from numpyro_deer.infer.hessian_mass import hessian_inverse_mass

    points = x + 0.01 * jax.random.normal(
        jax.random.PRNGKey(1), (NUM_CURVATURE_POINTS, dim), x.dtype
    )
    fn = jax.jit(lambda p: hessian_inverse_mass(potential, p)[0])
    jax.block_until_ready(fn(points))
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(points))
    return (time.perf_counter() - t0) / repeats


def run_one(dim, mass, num_chains, chain_method, ns, spans) -> dict:
    args, kwargs = irt_data(dim)
    kernel = numpyro_deer.DEERMALA(irt, adapt_mass_matrix=mass, method="sequential")
    mcmc = numpyro_deer.MCMC(
        kernel,
        num_warmup=ns.num_warmup,
        num_samples=1,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
    )
    mark = spans.mark()
    t0 = time.perf_counter()
    mcmc.warmup(jax.random.PRNGKey(0), *args, **kwargs)
    jax.block_until_ready(mcmc.post_warmup_state)
    wall = time.perf_counter() - t0
    compile_info = spans.summary(mark)
    execute = wall - compile_info["compile_s"]
    row = {
        "dim": dim,
        "mass": str(mass),
        "resolved_mass": str(kernel.mass_adaptation),
        "num_chains": num_chains,
        "chain_method": chain_method,
        "num_warmup": ns.num_warmup,
        "wall_s": wall,
        "compile_s": compile_info["compile_s"],
        "execute_s": execute,
        "ms_per_step": 1e3 * execute / ns.num_warmup,
        "window_ends": max(0, len(build_adaptation_schedule(ns.num_warmup)) - 2),
    }
    print(
        f"D={dim} mass={mass} chains={num_chains} {chain_method}: "
        f"{execute:.2f} s execute, {row['compile_s']:.2f} s compile",
        file=sys.stderr,
        flush=True,
    )
    return row


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[101, 251, 501])
    parser.add_argument("--num-warmup", type=int, default=300)
    parser.add_argument("--masses", nargs="+", default=["hessian", "True"])
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=["1:sequential", "4:vectorized"],
        help="num_chains:chain_method",
    )
    parser.add_argument("--out", "--json", dest="out", default=None)
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    spans = CompileSpans()
    spans.install()
    out = ns.out or common.default_json_path("warmup_cost")
    rows = []
    for dim in ns.dims:
        args, kwargs = irt_data(dim)
        kernel = numpyro_deer.DEERMALA(irt)
        state = kernel.init(jax.random.PRNGKey(0), 10, None, args, kwargs)
        potential = kernel.program.potential_flat(args, kwargs)
        x = jax.flatten_util.ravel_pytree(state.z)[0]
        window_end_s = time_window_end(dim, potential, x)
        for mass in ns.masses:
            mass = {"True": True, "False": False}.get(mass, mass)
            for layout in ns.layouts:
                chains, method = layout.split(":")
                row = run_one(dim, mass, int(chains), method, ns, spans)
                row["hessian_window_end_s"] = window_end_s
                rows.append(row)
                common.write_json(
                    out,
                    {"machine": common.machine_info(), "args": vars(ns), "rows": rows},
                )
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            rows,
            [
                ("dim", "D"),
                ("mass", "mass"),
                ("num_chains", "chains"),
                ("chain_method", "layout"),
                ("execute_s", "warmup s", ".3g"),
                ("ms_per_step", "ms/step", ".3g"),
                ("compile_s", "compile s", ".3g"),
                ("window_ends", "window ends"),
                ("hessian_window_end_s", "1 window end s", ".3g"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
