"""Parallel warmup against NumPyro-style sequential warmup, in gradient counts.

For each model, ``C`` chains start from NumPyro's default initialisation
(uniform in ``[-2, 2]`` on the unconstrained scale) and are warmed up twice
with the same transition (MALA, or HMC with ``--num-leapfrog``):

* parallel (:func:`numpyro_deer.core.parallel_warmup.parallel_warmup`): a few
  windows, each one DEER solve of all chains at a fixed kernel, adapted in
  between from pooled statistics (one step size and diagonal metric for all
  chains);
* sequential: NumPyro's ``warmup_adapter`` (dual averaging, Stan's windows,
  diagonal metric) per chain, one transition per warmup iteration, as the
  kernels' own warmup runs it; its critical path is ``num_warmup`` x the
  transition's gradients (step size searches left out).

After each warmup every chain draws ``--draws`` transitions with the sequential
scan at its adapted kernel; the table gives the smallest and median ESS per
draw over the unconstrained coordinates (``numpyro.diagnostics``) and the
mean acceptance. Counts are machine-independent; seconds are not (they include
compilation: ``compiles`` and ``compile s`` are the first parallel warmup
call's XLA compilations and their time; ``--second-call`` times a second,
compiled call). ::

    PYTHONPATH=. python benchmarks/parallel_warmup.py --chains 64 --draws 1000
"""

from __future__ import annotations

import argparse
import time

import _setup  # noqa: F401  (puts the repository root on sys.path)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from numpyro.diagnostics import effective_sample_size  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks.models import BENCHMARK_MODELS  # noqa: E402
from numpyro_deer.core import HMC, MALA, DEERSolver, sequential_chain  # noqa: E402
from numpyro_deer.core.metric import mass_matrix_sqrt  # noqa: E402
from numpyro_deer.core.parallel_warmup import (  # noqa: E402
    STALL_FRACTION,
    WarmupSchedule,
    parallel_warmup,
)
from numpyro_deer.core.transition import make_step_fn  # noqa: E402
from numpyro_deer.core.warmup_cost import gradients_per_transition  # noqa: E402
from numpyro_deer.infer.warmup import build_adapter, restart_step_size  # noqa: E402


def flat_potential(name: str):
    """The model's potential on flat unconstrained vectors, and its dimension."""
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    info = initialize_model(
        jax.random.PRNGKey(0), bench.model, model_args=args, model_kwargs=kwargs
    )
    x, unravel = ravel_pytree(info.param_info.z)

    def potential(x):
        return info.potential_fn(unravel(x))

    return potential, x.shape[0]


def sequential_warmup(transition, potential, x0, key, num_warmup, target):
    """NumPyro's adapter per chain (vmap), one transition per iteration."""
    adapter = build_adapter(
        potential,
        num_warmup,
        mass_adaptation=True,
        dense_mass=False,
        adapt_step_size=True,
        target_accept_prob=target,
        transition=transition,
    )
    dim = x0.shape[1]

    def one(x, key):
        key_adapt, key_tape = jax.random.split(key)
        adapt = adapter.init(x, key_adapt, 1.0)
        adapt = restart_step_size(adapt, x, adapter.find_step_size)
        tape = transition.make_tape(key_tape, num_warmup, dim, x.dtype)

        def body(carry, t_and_tape):
            x, adapt = carry
            t, tape_t = t_and_tape
            step = make_step_fn(
                transition,
                potential,
                adapt.step_size,
                mass_matrix_sqrt(adapt.inverse_mass_matrix),
            )
            x, info = step(x, tape_t)
            adapt = adapter.update(t, info.accept_prob, x, adapt)
            return (x, adapt), info.accept_prob

        (x, adapt), _ = jax.lax.scan(body, (x, adapt), (jnp.arange(num_warmup), tape))
        return x, adapt.step_size, adapt.inverse_mass_matrix

    keys = jax.random.split(key, x0.shape[0])
    return jax.jit(jax.vmap(one))(x0, keys)


def sample(transition, potential, x, step_size, inverse_mass, key, num_draws):
    """``num_draws`` sequential transitions per chain; per-chain or shared kernel."""
    num_chains, dim = x.shape
    step_size = jnp.broadcast_to(step_size, (num_chains,))
    inverse_mass = jnp.broadcast_to(inverse_mass, (num_chains, dim))

    def one(x, eps, inv, key):
        tape = transition.make_tape(key, num_draws, dim, x.dtype)
        return sequential_chain(
            transition, potential, x, tape, eps, mass_matrix_sqrt(inv)
        )

    keys = jax.random.split(key, num_chains)
    states, infos = jax.jit(jax.vmap(one))(x, step_size, inverse_mass, keys)
    ess = effective_sample_size(np.asarray(states, np.float64))
    total = num_chains * num_draws
    return {
        "min_ess_per_draw": float(np.min(ess)) / total,
        "median_ess_per_draw": float(np.median(ess)) / total,
        "sampling_accept": float(jnp.mean(infos.accept_prob)),
    }


def run_model(name, ns):
    transition = HMC(num_steps=ns.num_leapfrog) if ns.num_leapfrog else MALA()
    target = 0.8 if ns.num_leapfrog else 0.9
    potential, dim = flat_potential(name)
    key = jax.random.PRNGKey(ns.seed)
    k_init, k_par, k_seq, k_s1, k_s2 = jax.random.split(key, 5)
    x0 = jax.random.uniform(k_init, (ns.chains, dim), minval=-2.0, maxval=2.0)
    schedule = WarmupSchedule(
        windows=tuple(ns.windows), num_sequential=ns.num_sequential
    )
    g = gradients_per_transition(transition)

    def warmup():
        return jax.block_until_ready(
            parallel_warmup(
                transition,
                potential,
                x0,
                k_par,
                schedule=schedule,
                solver=DEERSolver() if ns.sweep is None else DEERSolver(sweep=ns.sweep),
                target_accept_prob=target,
                cap_iterations=not ns.no_cap,
                stall_fraction=ns.stall,
                num_steps_choices=tuple(ns.num_steps_choices) or None,
            )
        )

    t0 = time.perf_counter()
    with common.CompileCounter() as compiles:
        result = warmup()
    par_seconds = time.perf_counter() - t0
    again = None
    if ns.second_call:  # compiled: the run time alone
        t0 = time.perf_counter()
        warmup()
        again = time.perf_counter() - t0
    windows = result.info.windows
    par = {
        "model": name,
        "warmup": "parallel",
        "dim": dim,
        "transitions": int(sum(ns.windows)),
        "windows": len(ns.windows),
        "window_lengths": list(ns.windows),
        "num_sequential": ns.num_sequential,
        "stall": ns.stall,
        "newton_iterations": [int(v) for v in windows.newton_iterations],
        "num_converged": [int(v) for v in windows.num_converged],
        "fallback_steps": [int(v) for v in windows.fallback_steps],
        "window_accept": [round(float(v), 3) for v in windows.mean_accept_prob],
        "window_step_size": [float(v) for v in windows.step_size],
        "window_restarted": [int(v) for v in windows.num_restarted],
        "window_critical_path": [int(v) for v in windows.critical_path_gradients],
        "critical_path_gradients": int(result.info.critical_path_gradients),
        "total_gradients": float(result.info.total_gradients),
        "step_size": float(result.step_size),
        "window_num_steps": [int(v) for v in result.info.num_steps],
        "seconds": par_seconds,
        "compiles": compiles.count,
        "compile_seconds": compiles.seconds,
        "second_call_seconds": again,
    }
    chosen = transition  # sample with the chosen trajectory length
    if ns.num_steps_choices:
        chosen = HMC(num_steps=result.info.final_num_steps)
    par.update(
        sample(
            chosen,
            potential,
            result.positions,
            result.step_size,
            result.inverse_mass_matrix,
            k_s1,
            ns.draws,
        )
    )

    if ns.no_sequential:
        return [par]
    t0 = time.perf_counter()
    x_seq, eps_seq, inv_seq = jax.block_until_ready(
        sequential_warmup(transition, potential, x0, k_seq, ns.num_warmup, target)
    )
    seq = {
        "model": name,
        "warmup": "sequential",
        "dim": dim,
        "transitions": ns.num_warmup,
        "windows": "-",
        "critical_path_gradients": ns.num_warmup * g,
        "total_gradients": float(ns.chains * ns.num_warmup * g),
        "step_size": float(jnp.median(eps_seq)),
        "seconds": time.perf_counter() - t0,
    }
    seq.update(sample(transition, potential, x_seq, eps_seq, inv_seq, k_s2, ns.draws))
    return [par, seq]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["eight_schools", "logistic_regression"]
    )
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument(
        "--windows", type=int, nargs="+", default=list(WarmupSchedule().windows)
    )
    parser.add_argument(
        "--num-sequential", type=int, default=WarmupSchedule().num_sequential
    )
    parser.add_argument("--no-cap", action="store_true", help="no iteration cap")
    parser.add_argument(
        "--stall",
        type=int,
        default=STALL_FRACTION,
        help="front-stall stop over this many Newton iterations (0: none)",
    )
    parser.add_argument(
        "--sweep", type=int, help="the solver's sweep (default: its own)"
    )
    parser.add_argument(
        "--no-sequential",
        action="store_true",
        help="the parallel warmup only (no sequential baseline rows)",
    )
    parser.add_argument(
        "--second-call",
        action="store_true",
        help="time a second, compiled call of the parallel warmup too",
    )
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--num-leapfrog", type=int, default=0, help="0: MALA")
    parser.add_argument(
        "--num-steps-choices",
        type=int,
        nargs="*",
        default=[],
        help="HMC: leapfrog step counts to choose from by ChEES",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    ns = parser.parse_args(argv)
    kind = f"hmc{ns.num_leapfrog}" if ns.num_leapfrog else "mala"
    ns.json = str(ns.json or common.default_json_path(f"parallel_warmup_{kind}_cpu"))
    rows = common.rows_per_model(run_model, ns)
    columns = [
        ("model", "model"),
        ("warmup", "warmup"),
        ("transitions", "trans/chain"),
        ("windows", "windows"),
        ("newton_iterations", "Newton its/window"),
        ("fallback_steps", "fallback/window"),
        ("critical_path_gradients", "crit. grads"),
        ("total_gradients", "total grads", ".3g"),
        ("step_size", "eps", ".3g"),
        ("sampling_accept", "accept", ".3f"),
        ("min_ess_per_draw", "min ESS/draw", ".4f"),
        ("median_ess_per_draw", "med ESS/draw", ".4f"),
        ("seconds", "s", ".1f"),
        ("compiles", "compiles"),
        ("compile_seconds", "compile s", ".1f"),
        ("second_call_seconds", "2nd call s", ".1f"),
    ]
    print(common.format_table(rows, columns))
    print(f"wrote {ns.json}")


if __name__ == "__main__":
    main()
