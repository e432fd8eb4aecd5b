"""HMC(L) against MALA at the transition level: ESS per draw and Newton iterations.

For each model, ``DEERMALA``'s sequential warmup gives the mass matrix (the
inverse mean Hessian), the solve basis and MALA's step size (target 0.9).
Then, in those coordinates, for MALA and for HMC with each ``L`` and each
target acceptance (step size from a short sequential dual-averaging run):

* ESS per draw: the smallest over the unconstrained coordinates, from
  ``--chains`` sequential chains of ``--draws`` transitions;
* Newton iterations of ``--blocks`` consecutive DEER blocks of ``--block``
  transitions from the chains' end state, with the kernel's default solver
  (stochastic diagonal Jacobian, hard gate, sweep 8 after 20 iterations), and
  the time per block after compilation.

Rows with ``L = "rule"`` take ``L = ceil(trajectory / eps)`` for the trajectory
length ``--trajectory`` (in the whitened coordinates, where the mean curvature
is 1, ``pi / 2`` is a quarter period) and a step size jitter of ``--jitter``.

    PYTHONPATH=. python benchmarks/hmc_tuning.py \\
        --out benchmarks/results/hmc_tuning_cpu.json
"""

from __future__ import annotations

import argparse
import math
import time

import _hmc_setup
import _setup  # noqa: F401
import common
import jax

import numpyro_deer
from numpyro_deer import core


def _solver():
    return numpyro_deer.DEERSolver()  # the kernel's default solve


def _transition(kind, num_leapfrog, jitter):
    """``(make_tape, make_step(potential, eps), chain(potential, u0, tape, eps),
    sequential(potential, eps))`` of MALA or HMC(L)."""
    t = core.MALA() if kind == "mala" else core.HMC(num_leapfrog, jitter)
    return (
        t.make_tape,
        lambda pot, eps: core.make_step_fn(t, pot, eps),
        lambda pot, u0, tape, eps: core.sequential_chain(t, pot, u0, tape, eps),
        lambda pot, eps: core.make_sequential_step(t, pot, eps),
    )


def _mean(values):
    return sum(values) / len(values) if values else None


def measure(target, kind, num_leapfrog, eps, jitter, args, key):
    make_tape, make_step, chain, seq = _transition(kind, num_leapfrog, jitter)
    pot = target.potential

    def chain_fn(u0, k, n):
        return chain(pot, u0, make_tape(k, n, u0.shape[0], u0.dtype), eps)

    key_ess, key_block = jax.random.split(key)
    t0 = time.perf_counter()
    row = _hmc_setup.ess_per_draw(chain_fn, target, args.draws, args.chains, key_ess)
    ess_seconds = time.perf_counter() - t0
    u = row.pop("end_states")[0]

    @jax.jit
    def solve(u0, k, eps):
        k_tape, k_probe = jax.random.split(k)
        tape = make_tape(k_tape, args.block, u0.shape[0], u0.dtype)
        states, _, info = core.deer_solve(
            make_step(pot, eps), u0, tape, k_probe, _solver(), None, seq(pot, eps)
        )
        return states[-1], info

    iterations, converged, seconds = [], [], []
    keys = jax.random.split(key_block, args.blocks + 1) if args.blocks else []
    for b, k in enumerate(keys):
        t0 = time.perf_counter()
        end, info = jax.block_until_ready(solve(u, k, eps))
        if b == 0:  # compile, and a block from the chain's end state
            continue
        seconds.append(time.perf_counter() - t0)
        iterations.append(int(info.iterations))
        converged.append(bool(info.converged))
        u = end
    grads = 1 if kind == "mala" else num_leapfrog
    row.update(
        model=target.name,
        sampler=kind if kind == "mala" else f"hmc L={num_leapfrog}",
        num_leapfrog=grads,
        step_size=float(eps),
        jitter=jitter if kind != "mala" else 0.0,
        min_ess_per_gradient=row["min_ess_per_draw"] / grads,
        newton_iterations=iterations,
        mean_newton_iterations=_mean(iterations),
        converged=all(converged) if converged else None,
        seconds_per_block=_mean(seconds),
        ess_run_seconds=ess_seconds,
    )
    return row


def run_model(name, args):
    target = _hmc_setup.warmed_up(name, args.warmup)
    key = jax.random.PRNGKey(args.seed)
    rows = [
        dict(
            measure(target, "mala", 1, target.mala_step_size, 0.0, args, key),
            target_accept=0.9,
        )
    ]
    print(common.format_table(rows[-1:], COLUMNS), flush=True)
    settings = [(L, args.jitter) for L in args.num_leapfrog]
    if args.trajectory > 0:
        settings.append(("rule", args.jitter))
    for accept in args.targets:
        for num_leapfrog, jitter in settings:
            lf = 4 if num_leapfrog == "rule" else num_leapfrog
            make_tape, make_step, _, _ = _transition("hmc", lf, jitter)
            eps0 = math.sqrt(2 * target.mala_step_size)
            eps = _hmc_setup.tune_step_size(
                lambda e, lf=lf, make_step=make_step: make_step(target.potential, e),
                make_tape,
                target.u0,
                eps0,
                accept,
                args.tune,
                jax.random.PRNGKey(args.seed + 1),
            )
            if num_leapfrog == "rule":
                # the step size for L=4 fixes L; then tune again at that L
                lf = max(1, math.ceil(args.trajectory / eps))
                make_tape, make_step, _, _ = _transition("hmc", lf, jitter)
                eps = _hmc_setup.tune_step_size(
                    lambda e, make_step=make_step: make_step(target.potential, e),
                    make_tape,
                    target.u0,
                    eps,
                    accept,
                    args.tune,
                    jax.random.PRNGKey(args.seed + 2),
                )
            row = measure(target, "hmc", lf, eps, jitter, args, key)
            row.update(target_accept=accept, rule=num_leapfrog == "rule")
            rows.append(row)
            print(common.format_table(rows[-1:], COLUMNS), flush=True)
    return rows


COLUMNS = (
    ("model", "model", "s"),
    ("sampler", "sampler", "s"),
    ("target_accept", "target", ".2f"),
    ("step_size", "eps", ".3g"),
    ("accept", "acc", ".2f"),
    ("min_ess_per_draw", "ESS/draw", ".3g"),
    ("min_ess_per_gradient", "ESS/grad", ".3g"),
    ("mean_newton_iterations", "Newton its", ".1f"),
    ("converged", "conv", "s"),
    ("seconds_per_block", "s/block", ".2f"),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["hierarchical_logistic_regression", "stochastic_volatility"],
    )
    parser.add_argument("--num-leapfrog", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--targets", type=float, nargs="+", default=[0.8, 0.9])
    parser.add_argument("--trajectory", type=float, default=math.pi / 2)
    parser.add_argument("--jitter", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=300)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument(
        "--blocks", type=int, default=2, help="DEER blocks per row (0: ESS only)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        "--json",
        dest="out",
        default=str(common.default_json_path("hmc_tuning")),
    )
    args = parser.parse_args()
    args.json = args.out
    rows = common.rows_per_model(run_model, args)
    print(common.format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
