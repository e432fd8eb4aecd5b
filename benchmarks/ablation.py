"""Ablation of the DEER solver settings on the benchmark models.

For each model: one warmup with ``DEERMALA`` (sequential MALA with NumPyro's
adaptation), then consecutive blocks from the post-warmup state under each
variant, changing one setting at a time from the baseline. Reports Newton
iterations per block, how many blocks converged, time per block and the speed-up
over the sequential scan of the same tape (``method="sequential"``).

Run from the repository root::

    PYTHONPATH=. python benchmarks/ablation.py                      # small, CPU
    PYTHONPATH=. python benchmarks/ablation.py --block-size 16384 \\
        --blocks 3 --json benchmarks/results/ablation_h200.json      # H200

The table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import _setup  # noqa: F401  (puts the repository root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from _setup import attach, warmup_steps
from numpyro.diagnostics import effective_sample_size

from benchmarks.models import BENCHMARK_MODELS
from numpyro_deer import (
    DEERMALA,
    MCMC,
    DEERSolver,
    FullJacobian,
    SigmoidGate,
    StochasticDiagonalJacobian,
)

# one factor at a time, from the baseline (the package's defaults); the keys of
# each variant are DEERSolver fields, except "mass", "target" (warmup) and
# "block" (a multiple of --block-size)
VARIANTS: dict[str, dict] = {
    "baseline": {},
    "gate=sigmoid(1)": {"gate": "sigmoid"},
    "gate=sigmoid(0.25)": {"gate": SigmoidGate(temperature=0.25)},
    "probes=2": {"jacobian": StochasticDiagonalJacobian(num_probes=2)},
    "probes=4": {"jacobian": StochasticDiagonalJacobian(num_probes=4)},
    "clip=none": {"jacobian": StochasticDiagonalJacobian(clip=None)},
    "clip=0.5": {"jacobian": StochasticDiagonalJacobian(clip=0.5)},
    "tol=loose": {"atol": 1e-4, "rtol": 1e-3},
    "jacobian=diag": {"jacobian": "diag"},
    "jacobian=full": {"jacobian": "full"},
    "basis=whitened": {"solve_basis": "whitened"},
    "mass=identity": {"mass": "identity"},
    "mass=diag": {"mass": "diag"},
    "sequential+mass=diag": {"mass": "diag"},
    "sweep=0": {"sweep": 0},
    "sweep=8+after=0": {"sweep": 8, "sweep_after": 0},
    "sweep=16+after=20": {"sweep": 16, "sweep_after": 20},
    "sweep=32+after=20": {"sweep": 32, "sweep_after": 20},
}


def _kernel(model, block_size, options):
    options = dict(options)
    method = options.pop("method", "deer")
    for name in ("mass", "block", "target"):
        options.pop(name, None)
    return DEERMALA(
        model, block_size=block_size, method=method, solver=DEERSolver(**options)
    )


def _warmup(model, args, kwargs, num_warmup, mass, target, seed):
    # target None: the kernel's own default
    options = {} if target is None else {"target_accept_prob": target}
    adapt = {"auto": "auto", "hessian": "hessian", "identity": False}
    kernel = DEERMALA(
        model,
        block_size=16,
        dense_mass=mass == "dense",
        adapt_mass_matrix=adapt.get(mass, True),
        **options,
    )
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=16, progress_bar=False)
    mcmc.warmup(jax.random.PRNGKey(seed), *args, **kwargs)
    return mcmc.post_warmup_state


def _blocks_fn(kernel, args, kwargs, num_blocks, data_as_constants=False):
    """Jitted: ``num_blocks`` consecutive refills; returns per-block infos.

    The model's data are arguments of the jitted function, as in
    ``MCMC.run(key, *args)``; ``data_as_constants`` closes over them instead,
    which lets XLA fold them into the program (it changed the sequential
    chain's time per draw on the H200, see benchmarks/results/LOG.md).
    """

    def run(state, args, kwargs):
        def body(state, _):
            block = state.block
            size = jnp.asarray(block.z.shape[0], jnp.int32)
            state = state._replace(block=block._replace(index=size))
            program = kernel.program
            state = program.refill(state, args, kwargs, kernel.method_chosen)
            state = program.emit(state, state.block.z.shape[0] - 1)
            info = state.block.info
            return state, (
                info.iterations,
                info.converged,
                state.block.accept_prob.mean(),
                state.block.z,
                state.block.potential_energy,
            )

        return jax.lax.scan(body, state, None, length=num_blocks)

    if data_as_constants:
        return jax.jit(lambda state: run(state, args, kwargs))
    jitted = jax.jit(run)
    return lambda state: jitted(state, args, kwargs)


def _time(fn, state, repeats):
    t0 = time.perf_counter()
    out = fn(state)  # compile
    jax.block_until_ready(out)
    _time.first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(state)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def _ess_per_draw(z, potential_energy) -> dict:
    """Effective sample size per draw of the blocks' draws (one chain): the
    smallest over the unconstrained coordinates, and the potential energy's."""
    z = np.asarray(z, np.float64).reshape(-1, np.shape(z)[-1])
    pe = np.asarray(potential_energy, np.float64).reshape(1, -1)
    ess = np.asarray(effective_sample_size(z[None]))
    return {
        "ess_min_per_draw": float(ess.min() / len(z)),
        "ess_median_per_draw": float(np.median(ess) / len(z)),
        "ess_pe_per_draw": float(effective_sample_size(pe) / len(z)),
    }


START = time.perf_counter()


WARM: dict = {}
SEQUENTIAL_US: dict = {}


def run_variant(name, variant, args_ns):
    """One (model, variant) row: consecutive blocks from the post-warmup state."""
    spec = BENCHMARK_MODELS[name]
    args, kwargs = spec.make_data(0)
    base_b = args_ns.block_size
    options = {} if variant == "sequential" else dict(VARIANTS[variant])
    if variant.startswith("sequential"):
        options["method"] = "sequential"
    too_big = {"diag": args_ns.max_diag_dim, "full": args_ns.max_full_dim}
    jacobian = options.get("jacobian")
    if isinstance(jacobian, FullJacobian):
        jacobian = "full"
    elif not isinstance(jacobian, str | None):
        jacobian = "stochastic"
    if spec.latent_dim > too_big.get(jacobian, spec.latent_dim):
        return None
    block_size = int(base_b * options.get("block", 1))
    setting = (name, options.get("mass", "auto"), options.get("target"))
    if setting not in WARM:
        num_warmup = warmup_steps(spec, args_ns.warmup)
        WARM[setting] = _warmup(spec.model, args, kwargs, num_warmup, *setting[1:], 0)
    state = WARM[setting]
    kernel = _kernel(spec.model, block_size, options)
    state = attach(kernel, state, args, kwargs, 0)
    num_blocks = max(1, int(args_ns.blocks * base_b // block_size))
    fn = _blocks_fn(kernel, args, kwargs, num_blocks, args_ns.data_as_constants)
    try:
        seconds, (_, (iters, conv, acc, z, pe)) = _time(fn, state, args_ns.repeats)
    except Exception as err:  # noqa: BLE001 - report, e.g. out of memory
        print(f"{name:28s} {variant:20s} ERROR {repr(err)[:160]}", flush=True)
        return {"model": name, "variant": variant, "error": repr(err)[:300]}
    per_draw = seconds / (num_blocks * block_size)
    if variant == "sequential":
        SEQUENTIAL_US[name] = per_draw
    seq = SEQUENTIAL_US.get(name)
    row = {
        "model": name,
        "variant": variant,
        "dim": spec.latent_dim,
        "block_size": block_size,
        "num_blocks": num_blocks,
        "iterations": np.asarray(iters).tolist(),
        "converged": np.asarray(conv).tolist(),
        "accept": float(np.mean(acc)),
        **_ess_per_draw(z, pe),
        "step_size": float(state.adapt_state.step_size),
        "seconds": seconds,
        "first_call_seconds": _time.first,
        "us_per_draw": per_draw * 1e6,
        "speedup_vs_sequential": (seq / per_draw) if seq else None,
    }
    print(
        f"{name:28s} {variant:20s} B={block_size:7d} its={row['iterations']} "
        f"conv={sum(row['converged'])}/{num_blocks} {per_draw * 1e6:9.2f} us/draw "
        f"x{row['speedup_vs_sequential'] or 0:.2f} acc={row['accept']:.2f} "
        f"ess/draw min={row['ess_min_per_draw']:.4f} pe={row['ess_pe_per_draw']:.4f} "
        f"first={_time.first:.1f}s",
        flush=True,
    )
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(BENCHMARK_MODELS))
    parser.add_argument("--variants", nargs="*", default=None)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warmup steps (default: each model's num_warmup in BENCHMARK_MODELS)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-diag-dim", type=int, default=64)
    parser.add_argument("--max-full-dim", type=int, default=256)
    parser.add_argument("--time-budget", type=float, default=1e9, help="seconds")
    parser.add_argument(
        "--data-as-constants",
        action="store_true",
        help="close the jitted blocks over the model's data instead of passing "
        "them as arguments",
    )
    parser.add_argument("--json", default="benchmarks/results/ablation.json")
    ns = parser.parse_args(argv)
    info = {
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "python": platform.python_version(),
        "device": str(jax.devices()[0].device_kind),
        "argv": sys.argv,
    }
    os.makedirs(os.path.dirname(ns.json) or ".", exist_ok=True)

    def write(rows):
        with open(ns.json, "w") as f:
            json.dump({"machine": info, "rows": rows}, f, indent=1)

    rows = []
    # variants outermost: when the time budget runs out, the least important
    # variants are the ones left out, on every model alike
    for variant in ["sequential"] + (ns.variants or list(VARIANTS)):
        for name in ns.models:
            if time.perf_counter() - START > ns.time_budget:
                print(f"time budget spent: skipping {name} {variant}", flush=True)
                continue
            row = run_variant(name, variant, ns)
            if row is not None:
                rows.append(row)
                write(rows)  # after every row, so a run cut short keeps it
    write(rows)
    print(
        "\n| model | variant | B | median its | converged | us/draw | vs seq "
        "| ESS/draw min, pe |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['variant']} | | error | | | | |")
            continue
        sp = r["speedup_vs_sequential"]
        print(
            f"| {r['model']} | {r['variant']} | {r['block_size']} | "
            f"{int(np.median(r['iterations']))} | "
            f"{sum(r['converged'])}/{r['num_blocks']} | {r['us_per_draw']:.2f} | "
            f"{'' if sp is None else f'{sp:.2f}x'} | "
            f"{r['ess_min_per_draw']:.4f}, {r['ess_pe_per_draw']:.4f} |"
        )


if __name__ == "__main__":
    main()
