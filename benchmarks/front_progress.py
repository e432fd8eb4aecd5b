"""Where a block's Newton iterations go: the front and the failing steps.

For each model: one warmup with the package defaults (as in ``ablation.py``),
one tape, then the first block after warmup solved by DEER for a fixed number
of iterations (:func:`numpyro_deer._newton.newton_iterates`, the solver's own
iteration body). After every ``--every``-th iteration it reports the front (the
leading steps that pass the solver's test ``|s_t - f_t(s_{t-1})| <= atol +
rtol |f_t|``), how many steps fail, and the largest residual. ``--x64`` casts
the post-warmup problem (state, tape, step size, mass matrix) to float64
before the solve, so float32 and float64 solve the same block: if they need
the same iterations, rounding is not what costs them.

Newton iterations are a property of the posterior, the block and the
settings, not of the device, so this diagnostic runs on a CPU::

    PYTHONPATH=. python benchmarks/front_progress.py --models eight_schools \\
        --block-size 16384 --iterations 90
    PYTHONPATH=. python benchmarks/front_progress.py --models eight_schools \\
        --block-size 16384 --iterations 90 --x64

``--sweeps`` solves the same block with other sweep settings (``K`` or
``KxM``: ``K`` sequential steps per segment, ``M`` segments; ``0``: none, the
default, whatever the kernel's default), e.g.::

    PYTHONPATH=. python benchmarks/front_progress.py --models eight_schools \
        --block-size 16384 --iterations 90 --every 1 --stop \
        --sweeps 0 16x64 16x256 16 16x16384 4 8 32

Each row also counts the *stretches* of failing steps (runs separated by more
than 50 passing steps). The table is printed last (iterations until every step
passes, per setting); full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from _setup import warmup_steps
from ablation import _warmup
from common import rows_per_model
from jax.flatten_util import ravel_pytree

from numpyro_deer import DEERMALA, HardGate
from numpyro_deer import _block as blk
from numpyro_deer._mala import make_step_fn, make_tape
from numpyro_deer._newton import newton_iterates
from numpyro_deer.models import BENCHMARK_MODELS


def _as64(tree):
    def cast(x):
        x = jnp.asarray(x)
        return x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree.map(cast, tree)


class FirstBlock(NamedTuple):
    """The first block after warmup, in the solve basis the kernel uses."""

    kernel: DEERMALA
    potential: Callable  # in the rotated (Hessian-basis) coordinates
    u0: jax.Array
    tape: Any
    step_size: jax.Array


def first_block(
    name: str,
    block_size: int,
    num_warmup: int | None = None,
    target: float | None = None,
    x64: bool = False,
) -> FirstBlock:
    """Warm ``name`` up with the package defaults (``target``: another
    ``target_accept_prob``), draw one tape of ``block_size`` steps and rotate
    the problem to the Hessian solve basis, as ``refill_block`` does."""
    spec = BENCHMARK_MODELS[name]
    args, kwargs = spec.make_data(0)
    state = _warmup(
        spec.model, args, kwargs, warmup_steps(spec, num_warmup), "auto", target, 0
    )
    kernel = DEERMALA(spec.model, block_size=block_size)
    kernel.init(jax.random.PRNGKey(1), 0, state.z, args, kwargs)
    dim = ravel_pytree(state.z)[0].shape[0]
    tape = make_tape(jax.random.PRNGKey(5), block_size, dim, jnp.float32)
    if x64:
        jax.config.update("jax_enable_x64", True)
        state, tape = _as64(state), _as64(tape)
    potential = kernel._potential_flat(args, kwargs)
    mass_sqrt = blk.mass_matrix_sqrt(state.adapt_state.inverse_mass_matrix)
    potential_w, _ = blk._whiten(potential, mass_sqrt)
    w0 = blk._to_w(mass_sqrt, ravel_pytree(state.z)[0])
    points = jax.vmap(lambda x: blk._to_w(mass_sqrt, x))(state.curvature_points)
    basis = blk.curvature_basis(potential_w, points)
    potential_u, tape_u = blk._rotate(potential_w, tape, basis)
    return FirstBlock(
        kernel, potential_u, basis.T @ w0, tape_u, state.adapt_state.step_size
    )


def run_model(name: str, ns) -> list[dict]:
    kernel, potential_u, u0, tape_u, step_size = first_block(
        name, ns.block_size, ns.warmup, x64=ns.x64
    )
    step_fn = make_step_fn(potential_u, step_size, None, HardGate())
    # float32's tolerances in both cases, for the test and for the freezing
    atol, rtol = kernel.solver.tolerances(jnp.float32)
    rows = []
    for setting in ns.sweeps:
        sweep, _, segments = setting.partition("x")
        solver = dataclasses.replace(
            kernel.solver,
            atol=atol,
            rtol=rtol,
            sweep=int(sweep),
            segments=int(segments) if segments else None,
            sweep_after=ns.sweep_after,
        )
        rows += _report(name, ns, step_fn, u0, tape_u, solver)
    return rows


def _report(name, ns, step_fn, u0, tape_u, solver) -> list[dict]:
    atol, rtol = solver.atol, solver.rtol  # float32's, set by run_model
    iterates = jax.jit(
        lambda u, t: newton_iterates(
            step_fn, u, t, jax.random.PRNGKey(7), ns.iterations, solver
        )
    )(u0, tape_u)

    @jax.jit
    def test(states):
        prev = jnp.concatenate([u0[None], states[:-1]])
        values, _ = jax.vmap(step_fn)(prev, tape_u)
        error = jnp.abs(states - values)
        return jnp.all(error <= atol + rtol * jnp.abs(values), -1), error.max(-1)

    rows = []
    for k in range(ns.every - 1, ns.iterations, ns.every):
        passed, error = (np.asarray(a) for a in test(iterates[k]))
        failing = np.flatnonzero(~passed)
        row = {
            "model": name,
            "dtype": str(u0.dtype),
            "sweep": solver.sweep,
            "segments": solver.num_segments(ns.block_size) if solver.sweep else 0,
            "sweep_after": solver.sweep_after,
            "iteration": k + 1,
            "front": int(failing[0]) if failing.size else ns.block_size,
            "failing": int(failing.size),
            # stretches of failing steps: runs separated by more than 50 passing
            "stretches": int(1 + np.sum(np.diff(failing) > 50)) if failing.size else 0,
            "max_residual": float(error.max()),
        }
        print(row, flush=True)
        rows.append(row)
        if ns.stop and not failing.size:
            break
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["eight_schools"])
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument(
        "--warmup", type=int, default=None, help="default: each model's num_warmup"
    )
    parser.add_argument(
        "--x64", action="store_true", help="solve in float64 after a float32 warmup"
    )
    parser.add_argument(
        "--sweeps",
        nargs="+",
        default=["0"],
        help="sweep settings to solve the block with, each K (K sequential steps "
        "per segment, block_size // K segments) or KxM (M segments); 0: none",
    )
    parser.add_argument("--sweep-after", type=int, default=0)
    parser.add_argument(
        "--stop",
        action="store_true",
        help="stop reporting after the first iteration at which every step passes",
    )
    parser.add_argument("--json", default="benchmarks/results/front_progress.json")
    ns = parser.parse_args(argv)
    rows = rows_per_model(run_model, ns)
    print(f"\nB = {ns.block_size}, {'float64' if ns.x64 else 'float32'} solve")
    print("| model | sweep x segments (after) | iterations until every step passes |")
    print("|---|---|---|")
    settings = {}
    for r in rows:
        key = (r["model"], r["sweep"], r["segments"], r["sweep_after"])
        settings.setdefault(key, None)
        if r["failing"] == 0 and settings[key] is None:
            settings[key] = r["iteration"]
    for (model, sweep, segments, after), done in settings.items():
        its = done if done is not None else f"> {ns.iterations}"
        print(f"| {model} | {sweep} x {segments} ({after}) | {its} |")


if __name__ == "__main__":
    main()
