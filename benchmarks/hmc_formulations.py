r"""A block of HMC transitions by DEER: per transition, or per leapfrog step.

*Per transition* (the package's :class:`numpyro_deer.core.HMC`): the state is the
position ``x``, one step of the recursion is a whole transition (``L``
leapfrog steps and the accept test), a block of ``T`` transitions is a
recursion of ``T`` steps in ``D`` dimensions.

*Per leapfrog step* (prototyped here): every leapfrog step is a step of the
recursion, ``T L`` steps, with the state ``(x, r, x_start, H_start)`` of size
``3 D + 1``. The first leapfrog step of a transition reads only ``x`` (it
draws the momentum from the tape and records the start and its energy); the
last one makes the accept test and returns ``x`` or ``x_start``. Each step
evaluates two gradients (at its start and its end), since under ``vmap`` the
first step's extra gradient is paid by all.

Both run on the same tape with the same step size, so they compute the same
chain (the script checks it); the comparison is Newton iterations and time per
block, side by side in one process, after compilation.

    PYTHONPATH=. python benchmarks/hmc_formulations.py \\
        --out benchmarks/results/hmc_formulations_cpu.json
"""

from __future__ import annotations

import argparse
import math
import time
from typing import NamedTuple

import _hmc_setup
import _setup  # noqa: F401
import common
import jax
import jax.numpy as jnp

import numpyro_deer
from numpyro_deer import core
from numpyro_deer.core import HardGate, StepInfo, gated_select

HARD = HardGate()


class SubstepTape(NamedTuple):
    noise: jax.Array  # the transition's momentum, repeated over its L steps
    log_u: jax.Array
    step_scale: jax.Array
    k: jax.Array  # position of the leapfrog step in its transition, 0 .. L-1


def substep_tape(tape: core.HMCTape, num_leapfrog: int) -> SubstepTape:
    repeat = jax.tree.map(lambda a: jnp.repeat(a, num_leapfrog, axis=0), tape)
    num = tape.log_u.shape[0]
    return SubstepTape(*repeat, jnp.tile(jnp.arange(num_leapfrog), num))


def make_substep_fn(potential_fn, step_size, num_leapfrog, gate=HARD):
    """One leapfrog step on ``s = (x, r, x_start, H_start)``; accept at the end."""

    def step(s, tape_j):
        dim = (s.shape[0] - 1) // 3
        x, r, x_start, h_start = s[:dim], s[dim : 2 * dim], s[2 * dim : 3 * dim], s[-1]
        first = tape_j.k == 0
        last = tape_j.k == num_leapfrog - 1
        eps = step_size * tape_j.step_scale
        potential_x, grad_x = jax.value_and_grad(potential_fn)(x)
        x_start = jnp.where(first, x, x_start)
        r = jnp.where(first, tape_j.noise, r)
        h_start = jnp.where(
            first, potential_x + 0.5 * jnp.sum(tape_j.noise**2), h_start
        )
        r = r - 0.5 * eps * grad_x
        y = x + eps * r
        potential_y, grad_y = jax.value_and_grad(potential_fn)(y)
        r = r - 0.5 * eps * grad_y
        log_ratio = h_start - potential_y - 0.5 * jnp.sum(r**2)
        diverging = ~jnp.isfinite(log_ratio)
        log_ratio = jnp.where(diverging, -jnp.inf, log_ratio)
        margin = log_ratio - tape_j.log_u
        x_new = jnp.where(last, gated_select(gate, margin, y, x_start), y)
        accepted = last & (margin > 0)
        info = StepInfo(
            jnp.where(
                accepted | ~last, potential_y, h_start - 0.5 * jnp.sum(tape_j.noise**2)
            ),
            jnp.exp(jnp.minimum(log_ratio, 0.0)),
            accepted,
            last & diverging,
        )
        return jnp.concatenate([x_new, r, x_start, h_start[None]]), info

    return step


def _solver(strategy, cap):
    return numpyro_deer.DEERSolver(strategy, max_iter=cap, max_solves=1)


STRATEGIES = {
    "stochastic": numpyro_deer.StochasticDiagonalJacobian,
    "diag": numpyro_deer.DiagonalJacobian,
    "full": lambda: numpyro_deer.FullJacobian(clip=1.0),
}


def run_model(name, args):
    target = _hmc_setup.warmed_up(name, args.warmup)
    dim = target.dim
    rows = []
    for num_leapfrog in args.num_leapfrog:
        hmc = core.HMC(num_leapfrog, args.jitter)
        tape_fn = hmc.make_tape
        eps = _hmc_setup.tune_step_size(
            lambda e, hmc=hmc: core.make_step_fn(hmc, target.potential, e),
            tape_fn,
            target.u0,
            math.sqrt(2 * target.mala_step_size),
            args.target_accept,
            args.tune,
            jax.random.PRNGKey(1),
        )
        key_tape, key_probe = jax.random.split(jax.random.PRNGKey(args.seed))
        tape = tape_fn(key_tape, args.block, dim, target.u0.dtype)
        reference, _ = jax.jit(
            lambda u0, tape, eps=eps, hmc=hmc: core.sequential_chain(
                hmc, target.potential, u0, tape, eps
            )
        )(target.u0, tape)
        for strategy_name in args.strategies:
            for formulation in ("transition", "leapfrog"):
                if (
                    strategy_name in ("full", "diag")
                    and formulation == "leapfrog"
                    and 3 * dim + 1 > args.max_dense_dim
                ):
                    continue
                if strategy_name in ("full", "diag") and dim > args.max_dense_dim:
                    continue
                cap = args.cap * (num_leapfrog if formulation == "leapfrog" else 1)
                solver = _solver(STRATEGIES[strategy_name](), cap)
                if formulation == "transition":
                    step_fn = core.make_step_fn(hmc, target.potential, eps)
                    seq = core.make_sequential_step(hmc, target.potential, eps)
                    s0, tp = target.u0, tape
                else:
                    step_fn = make_substep_fn(target.potential, eps, num_leapfrog)
                    seq = None
                    zeros = jnp.zeros_like(target.u0)
                    s0 = jnp.concatenate([target.u0, zeros, target.u0, zeros[:1]])
                    tp = substep_tape(tape, num_leapfrog)

                @jax.jit
                def solve(s0, tp, key, step_fn=step_fn, solver=solver, seq=seq):
                    states, _, info = core.deer_solve(
                        step_fn, s0, tp, key, solver, None, seq
                    )
                    return states, info

                t0 = time.perf_counter()
                jax.block_until_ready(solve(s0, tp, key_probe))
                compile_seconds = time.perf_counter() - t0
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    states, info = jax.block_until_ready(solve(s0, tp, key_probe))
                    times.append(time.perf_counter() - t0)
                if formulation == "leapfrog":
                    states = states[num_leapfrog - 1 :: num_leapfrog, :dim]
                front = int(info.front)
                done = front // (num_leapfrog if formulation == "leapfrog" else 1)
                diff = float(jnp.max(jnp.abs(states[:done] - reference[:done])))
                rows.append(
                    dict(
                        model=name,
                        dim=dim,
                        num_leapfrog=num_leapfrog,
                        step_size=eps,
                        formulation=formulation,
                        jacobian=strategy_name,
                        newton_iterations=int(info.iterations),
                        converged=bool(info.converged),
                        transitions_done=done,
                        max_diff_to_sequential=diff,
                        seconds_per_block=min(times),
                        seconds_per_iteration=min(times) / max(int(info.iterations), 1),
                        compile_seconds=compile_seconds,
                    )
                )
                print(common.format_table(rows[-1:], COLUMNS), flush=True)
    return rows


COLUMNS = (
    ("model", "model", "s"),
    ("num_leapfrog", "L", "d"),
    ("step_size", "eps", ".3g"),
    ("formulation", "formulation", "s"),
    ("jacobian", "jacobian", "s"),
    ("newton_iterations", "Newton its", "d"),
    ("converged", "conv", "s"),
    ("transitions_done", "done", "d"),
    ("max_diff_to_sequential", "|diff|", ".1e"),
    ("seconds_per_block", "s/block", ".3g"),
    ("seconds_per_iteration", "s/it", ".3g"),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=[
            "eight_schools",
            "logistic_regression",
            "hierarchical_logistic_regression",
        ],
    )
    parser.add_argument("--num-leapfrog", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--strategies", nargs="+", default=["stochastic", "full"])
    parser.add_argument(
        "--max-dense-dim", type=int, default=40, help="largest state for full/diag"
    )
    parser.add_argument("--target-accept", type=float, default=0.8)
    parser.add_argument("--jitter", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=300)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument(
        "--cap",
        type=int,
        default=300,
        help="Newton iterations per block (x L per leapfrog)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        "--json",
        dest="out",
        default=str(common.default_json_path("hmc_formulations")),
    )
    args = parser.parse_args()
    rows = []
    for name in args.models:
        rows += run_model(name, args)
        common.write_json(
            args.out,
            {"machine": common.machine_info(), "args": vars(args), "rows": rows},
        )
    print(common.format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
