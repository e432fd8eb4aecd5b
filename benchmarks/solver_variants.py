"""Newton iterations of one block under several solver settings (CPU is fine).

For each model: one warmup with the package defaults (``--target``: another
``target_accept_prob``), the first block after it (as in
``front_progress.py``), then that block solved by :func:`deer_solve` with the
kernel's solver changed one setting at a time: the iterations it took, whether
it converged, its front, the step size. Iterations are a property of the
posterior, the block and the settings, not of the device; time per iteration
is not reported (a CPU says nothing about a GPU there). Run from the
repository root::

    PYTHONPATH=. python3 benchmarks/solver_variants.py \\
        --models stochastic_volatility --block-size 16384 \\
        --variants baseline damping=0.3 clip=0.5 probes=4 gate=sigmoid

A variant is ``baseline`` or ``key=value`` pairs joined by ``+``: ``probes``
and ``clip`` (of the stochastic diagonal Jacobian), ``gate`` (``hard`` or
``sigmoid``) and any integer or float field of ``DEERSolver`` (``damping``,
``sweep``, ``sweep_after``, ``max_iter``, ``coupled_segments``, ...). For
``coupled_segments`` the rows also give the passes of the segments and the
sequential steps they took (passes times ``B / coupled_segments``). The
table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
from common import machine_info, write_json
from front_progress import first_block

from numpyro_deer import HardGate, SigmoidGate, StochasticDiagonalJacobian
from numpyro_deer._mala import make_sequential_step, make_step_fn
from numpyro_deer._newton import deer_solve


def parse_variant(variant: str) -> tuple[dict, dict]:
    """``(jacobian and gate options, DEERSolver fields)`` of a variant name."""
    if variant == "baseline":
        return {}, {}
    pairs = dict(item.split("=", 1) for item in variant.split("+"))
    local = {k: pairs.pop(k) for k in ("probes", "clip", "gate") if k in pairs}
    fields = {k: float(v) if "." in v else int(v) for k, v in pairs.items()}
    return local, fields


def solve_variant(block, variant: str) -> dict:
    local, fields = parse_variant(variant)
    gate = SigmoidGate() if local.get("gate") == "sigmoid" else HardGate()
    jacobian = StochasticDiagonalJacobian(
        num_probes=int(local.get("probes", 1)), clip=float(local.get("clip", 1.0))
    )
    solver = dataclasses.replace(block.kernel.solver, jacobian=jacobian, **fields)
    step_fn = make_step_fn(block.potential, block.step_size, None, gate)
    sequential = make_sequential_step(block.potential, block.step_size, None, gate)

    @jax.jit
    def solve(u0, tape):
        key = jax.random.PRNGKey(3)
        return deer_solve(step_fn, u0, tape, key, solver, None, sequential)[2]

    start = time.perf_counter()
    info = jax.block_until_ready(solve(block.u0, block.tape))
    num_steps = jax.tree.leaves(block.tape)[0].shape[0]
    segments = min(solver.coupled_segments, num_steps)
    segment_length = -(-num_steps // segments) if segments else 0
    return {
        "variant": variant,
        "iterations": int(info.iterations),
        "converged": bool(info.converged),
        "front": int(info.front),
        # coupled segments: passes, and the sequential steps they took
        "segment_passes": int(info.segment_passes),
        "segment_steps": int(info.segment_passes) * segment_length,
        "seconds_with_compile": time.perf_counter() - start,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["stochastic_volatility"])
    parser.add_argument("--block-size", type=int, default=16384)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--variants", nargs="+", default=["baseline"])
    parser.add_argument("--json", default="benchmarks/results/solver_variants.json")
    ns = parser.parse_args(argv)
    rows = []
    for name in ns.models:
        block = first_block(name, ns.block_size, ns.warmup, ns.target)
        for variant in ns.variants:
            row = {
                "model": name,
                "block_size": ns.block_size,
                "target": ns.target,
                "step_size": float(block.step_size),
                **solve_variant(block, variant),
            }
            print(row, flush=True)
            rows.append(row)
            result = {"machine": machine_info(), "args": vars(ns), "rows": rows}
            write_json(ns.json, result)
    print(f"\nB = {ns.block_size}, the first block after warmup")
    print(
        "| model | target | step size | variant | its | converged | front "
        "| coupled passes (sequential steps) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['target'] or 'default'} | {r['step_size']:.4f} | "
            f"{r['variant']} | {r['iterations']} | {r['converged']} | {r['front']} "
            f"| {r['segment_passes']} ({r['segment_steps']}) |"
        )


if __name__ == "__main__":
    main()
