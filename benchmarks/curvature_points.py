"""Where should the Hessian solve basis take its curvature points?

For each model: one warmup (as in ``ablation.py``), one tape, then the first
block after warmup solved by DEER in the Hessian eigenbasis averaged over 16
points taken from

* ``warmup``: the later warmup draws (what ``DEERMALA`` uses for this block),
* ``previous``: a previous block's draws (what ``DEERMALA`` uses for every
  block after the first): the solved block is then the second one after
  warmup, its predecessor computed sequentially,
* ``oracle``: the block's own chain (computed sequentially first; not
  available to a sampler, it bounds what a better choice of points can give),
* ``refresh``: the warmup points for ``--refresh-after`` iterations, then the
  current (unconverged) Newton iterate's points for the rest of the solve.

Newton iterations are a property of the posterior, the block and the
settings, not of the device, so this diagnostic runs on a CPU.

    PYTHONPATH=. python benchmarks/curvature_points.py \\
        --models hierarchical_logistic_regression --block-size 2048 --warmup 800

Without ``--warmup``, each model warms up for its ``num_warmup``
(``BENCHMARK_MODELS``): long enough for the chain to be stationary.

The table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
from _setup import warmup_steps
from ablation import _warmup
from common import machine_info, write_json
from jax.flatten_util import ravel_pytree

from numpyro_deer import DEERMALA, HardGate
from numpyro_deer import _block as blk
from numpyro_deer._mala import make_step_fn, make_tape, sequential_chain
from numpyro_deer._newton import deer_solve
from numpyro_deer.models import BENCHMARK_MODELS


def _solve(potential_w, w0, tape, step_size, solver, points, guess=None, seed=7):
    """DEER in the Hessian eigenbasis of ``points``; returns ``(w, info)``."""
    basis = blk.curvature_basis(potential_w, points)
    potential_u, tape_u = blk._rotate(potential_w, tape, basis)
    step_fn = make_step_fn(potential_u, step_size, None, HardGate())
    u_guess = None if guess is None else guess @ basis
    u, _, info = deer_solve(
        step_fn, basis.T @ w0, tape_u, jax.random.PRNGKey(seed), solver, u_guess
    )
    return u @ basis.T, info


def run_model(
    name: str, block_size: int, refresh_after: int, warmup: int | None
) -> list[dict]:
    spec = BENCHMARK_MODELS[name]
    args, kwargs = spec.make_data(0)
    warmup = warmup_steps(spec, warmup)
    state = _warmup(spec.model, args, kwargs, warmup, "diag", None, 0)
    kernel = DEERMALA(spec.model, block_size=block_size)
    kernel.init(jax.random.PRNGKey(1), 0, state.z, args, kwargs)
    potential = kernel._potential_flat(args, kwargs)
    step_size = state.adapt_state.step_size
    mass_sqrt = blk.mass_matrix_sqrt(state.adapt_state.inverse_mass_matrix)
    potential_w, _ = blk._whiten(potential, mass_sqrt)
    w0 = blk._to_w(mass_sqrt, ravel_pytree(state.z)[0])
    tape = make_tape(jax.random.PRNGKey(5), block_size, w0.shape[0], w0.dtype)
    solver = kernel._solver
    num_points = state.curvature_points.shape[0]

    chain_fn = jax.jit(lambda w, t: sequential_chain(potential_w, w, t, step_size)[0])
    chain = chain_fn(w0, tape)
    points = {
        "warmup": jax.vmap(lambda x: blk._to_w(mass_sqrt, x))(state.curvature_points),
        "oracle": blk.block_points(chain, num_points),
    }
    solve = jax.jit(lambda p: _solve(potential_w, w0, tape, step_size, solver, p))
    first = dataclasses.replace(solver, max_iter=refresh_after, max_solves=1)

    @jax.jit
    def refreshed(p):
        w, info1 = _solve(potential_w, w0, tape, step_size, first, p)
        new_points = blk.block_points(w, num_points)
        w, info2 = _solve(potential_w, w0, tape, step_size, solver, new_points, w, 8)
        return w, info1, info2

    rows = []
    for label, p in points.items():
        w, info = solve(p)
        rows.append(_row(name, label, info.iterations, info, w, chain))
    # the next block (another tape), its basis from this block's draws
    tape_next = make_tape(jax.random.PRNGKey(6), block_size, w0.shape[0], w0.dtype)
    chain_next = chain_fn(chain[-1], tape_next)
    solve_next = jax.jit(
        lambda p: _solve(potential_w, chain[-1], tape_next, step_size, solver, p)
    )
    w, info = solve_next(blk.block_points(chain, num_points))
    rows.append(_row(name, "previous", info.iterations, info, w, chain_next))
    w, info1, info2 = refreshed(points["warmup"])
    rows.append(
        _row(name, "refresh", info1.iterations + info2.iterations, info2, w, chain)
    )
    return rows


def _row(name, label, iterations, info, w, chain) -> dict:
    row = {
        "model": name,
        "points": label,
        "iterations": int(iterations),
        "converged": bool(info.converged),
        "max_abs_diff_vs_sequential": float(jnp.max(jnp.abs(w - chain))),
    }
    print(row, flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["hierarchical_logistic_regression"]
    )
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warmup steps (default: each model's num_warmup)",
    )
    parser.add_argument("--refresh-after", type=int, default=30)
    parser.add_argument("--json", default="benchmarks/results/curvature_points.json")
    ns = parser.parse_args(argv)
    rows = []
    for name in ns.models:
        rows += run_model(name, ns.block_size, ns.refresh_after, ns.warmup)
    write_json(ns.json, {"machine": machine_info(), "args": vars(ns), "rows": rows})
    warmup = ns.warmup or "each model's num_warmup"
    print(
        f"\nB = {ns.block_size}; warmup {warmup}; "
        f"refresh after {ns.refresh_after} iterations"
    )
    print("| model | curvature points | Newton its | converged |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['points']} | {r['iterations']} | {r['converged']} |"
        )


if __name__ == "__main__":
    main()
