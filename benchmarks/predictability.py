"""How far does a difference travel along each model's MALA chain?

DEER's Newton iterations are governed by how *predictable* the chain is
(Gonzalez, Kozachkov, Zoltowski, Clarkson and Linderman, "Predictability
enables parallelization of nonlinear state space models", NeurIPS 2025,
arXiv 2508.16817): how far a difference between the Newton iterate and the
chain travels before it dies out. For MALA a difference travels two ways, and
this script measures both on the first block after warmup, in the solve basis
the kernel uses (``front_progress.first_block``):

* **Through the smooth step.** The largest Lyapunov exponent (LLE)
  ``lambda = lim (1/T) log |J_T ... J_1 v|`` of the Jacobians DEER linearises
  (``dy/dx`` for an accepted step, ``I`` for a rejected one, the hard gate),
  from one tangent vector carried along the sequential chain and renormalised
  every step. ``1 / |lambda|`` steps shrink an infinitesimal difference by
  ``e``. Also: the share of 32-step windows over which the tangent *grows*, and
  the smallest eigenvalue of the Hessian of the potential at 512 states of the
  chain (below zero the posterior is not log-concave there, and an accepted
  step ``I - step_size * H`` expands).
* **Through the accept decisions.** At each of ``--flips`` steps of the chain
  the decision is reversed (an accepted proposal rejected, a rejected one
  accepted), and the chain is run on from there with the same tape for
  ``--horizon`` steps: how many later decisions then differ from the chain's
  (a *cascade*: each is a jump the Newton iterate gets wrong until its
  predecessors are right), and after how many steps the two paths meet again
  (distance below 1e-3).

Newton iterations are a property of the posterior, the block and the settings,
not of the device, and both measurements are sequential, so this runs on a
CPU::

    PYTHONPATH=. python benchmarks/predictability.py            # all six, ~10 min
    PYTHONPATH=. python benchmarks/predictability.py \\
        --models stochastic_volatility --step-scale 0.5 1 1.5

``--step-scale`` multiplies the adapted step size (the chain changes, the
posterior does not). The table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import rows_per_model
from front_progress import first_block

from numpyro_deer import HardGate
from numpyro_deer._mala import make_step_fn, sequential_chain
from numpyro_deer.models import BENCHMARK_MODELS


def tangent_log_growth(step_fn, x0, v0, tape):
    """Per step ``log |J_t v_{t-1}|``, ``v`` renormalised after each step.

    Returns ``(log_growth, states, accepted)`` of the sequential chain; the
    mean of ``log_growth`` after a burn-in estimates the LLE.
    """

    def body(carry, tape_t):
        x, v = carry
        (x_new, info), (v_new, _) = jax.jvp(lambda x: step_fn(x, tape_t), (x,), (v,))
        norm = jnp.linalg.norm(v_new)
        return (x_new, v_new / norm), (jnp.log(norm), x_new, info.accepted)

    v0 = v0 / jnp.linalg.norm(v0)
    _, out = jax.lax.scan(body, (x0, v0), tape)
    return out


def smallest_curvature(potential_fn, states, batch=64):
    """Smallest eigenvalue of the Hessian of ``potential_fn`` at each state."""
    eigmin = jax.jit(
        jax.vmap(lambda x: jnp.linalg.eigvalsh(jax.hessian(potential_fn)(x))[0])
    )
    return np.concatenate(
        [
            np.asarray(eigmin(states[i : i + batch]))
            for i in range(0, len(states), batch)
        ]
    )


def flip_cascades(potential_fn, step_size, chain, accepted, tape, starts, horizon):
    """Reverse the decision at each step of ``starts``; follow ``horizon`` steps.

    Returns ``(differing, meet)``: per start, how many later accept decisions
    differ from the chain's, and the first step at which the two paths are
    within 1e-3 of each other (``horizon`` if never).
    """

    def one(t):
        x = chain[t - 1]
        grad = jax.grad(potential_fn)(x)
        proposal = x - step_size * grad + jnp.sqrt(2 * step_size) * tape.noise[t]
        other = jnp.where(accepted[t], x, proposal)
        rest = jax.tree.map(
            lambda a: jax.lax.dynamic_slice_in_dim(a, t + 1, horizon), tape
        )
        path, info = sequential_chain(potential_fn, other, rest, step_size)
        same = jax.lax.dynamic_slice_in_dim(chain, t + 1, horizon)
        decisions = jax.lax.dynamic_slice_in_dim(accepted, t + 1, horizon)
        met = jnp.linalg.norm(path - same, axis=1) < 1e-3
        meet = jnp.where(met.any(), jnp.argmax(met), horizon)
        return jnp.sum(info.accepted != decisions), meet

    return jax.jit(jax.vmap(one))(jnp.asarray(starts))


def run_model(name, ns) -> list[dict]:
    t0 = time.perf_counter()
    kernel, potential, u0, tape, adapted = first_block(name, ns.steps)
    warmup_s = time.perf_counter() - t0
    dim = u0.shape[0]
    v0 = jax.random.normal(jax.random.PRNGKey(6), (dim,), u0.dtype)
    burn = ns.steps // 8
    starts = np.linspace(burn, ns.steps - ns.horizon - 1, ns.flips).astype(int)
    rows = []
    for scale in ns.step_scale:
        step_size = adapted * scale
        t0 = time.perf_counter()
        step_fn = make_step_fn(potential, step_size, None, HardGate())
        log_growth, states, accepted = jax.jit(tangent_log_growth, static_argnums=0)(
            step_fn, u0, v0, tape
        )
        differing, meet = flip_cascades(
            potential, step_size, states, accepted, tape, starts, ns.horizon
        )
        curvature = smallest_curvature(potential, states[burn :: ns.steps // 512])
        growth = np.asarray(log_growth, np.float64)[burn:]
        windows = growth[: growth.size // 32 * 32].reshape(-1, 32).mean(axis=1)
        differing, meet = np.asarray(differing), np.asarray(meet)
        lle = float(growth.mean())
        row = {
            "model": name,
            "dim": dim,
            "step_scale": scale,
            "step_size": float(step_size),
            "accept_rate": float(np.mean(np.asarray(accepted)[burn:])),
            "lle": lle,
            "memory_steps": -1.0 / lle if lle < 0 else float("inf"),
            "windows_32_growing": float(np.mean(windows > 0)),
            "window_32_max": float(windows.max()),
            "hessian_min_eig": {
                q: float(np.quantile(curvature, q)) for q in (0.0, 0.01, 0.1, 0.5)
            },
            "cascade_mean": float(differing.mean()),
            "cascade_median": float(np.median(differing)),
            "cascade_max": int(differing.max()),
            "meet_median": float(np.median(meet)),
            "never_met": float(np.mean(meet >= ns.horizon)),
            "warmup_s": warmup_s,
            "measure_s": time.perf_counter() - t0,
        }
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(BENCHMARK_MODELS))
    parser.add_argument("--steps", type=int, default=16384, help="chain length")
    parser.add_argument("--flips", type=int, default=128, help="decisions reversed")
    parser.add_argument("--horizon", type=int, default=1024)
    parser.add_argument("--step-scale", nargs="+", type=float, default=[1.0])
    parser.add_argument("--json", default="benchmarks/results/predictability_cpu.json")
    ns = parser.parse_args(argv)
    rows = rows_per_model(run_model, ns)
    print(
        f"\nFirst {ns.steps} steps after each model's warmup; {ns.flips} decisions "
        f"reversed, each followed for {ns.horizon} steps"
    )
    print(
        "| model | D | step (scale) | accept | LLE | 1/abs(LLE) | 32-step windows "
        "growing | min eig of H (1 %, median) | decisions changed by one flip "
        "(mean, max) | paths meet after (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["hessian_min_eig"]
        meet = f"{r['meet_median']:.0f}"
        if r["never_met"]:
            meet += f" ({r['never_met']:.0%} not in {ns.horizon})"
        print(
            f"| {r['model']} | {r['dim']} | {r['step_size']:.3g} ({r['step_scale']:g}) "
            f"| {r['accept_rate']:.2f} | {r['lle']:.3g} | {r['memory_steps']:.0f} "
            f"| {r['windows_32_growing']:.1%} | {q[0.01]:.3g}, {q[0.5]:.3g} "
            f"| {r['cascade_mean']:.1f}, {r['cascade_max']} | {meet} |"
        )


if __name__ == "__main__":
    main()
