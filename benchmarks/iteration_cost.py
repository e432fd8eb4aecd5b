"""What one Newton iteration costs, against its floor.

A DEER iteration on a block of ``B`` steps must at least evaluate the step
``f_t`` and one Jacobian-vector product at every state of the block: ``B``
batched evaluations of the step with its JVP (``floor``). Everything else in
the iteration (the residual test, the front, the associative scan, the
bookkeeping of the step infos) is overhead on top of that floor. This script
times, per model and block size, on the post-warmup state of a short warmup:

=============  ==============================================================
``grad``       ``B`` batched gradients of the (whitened) potential
``step``       ``B`` batched MALA steps (two gradients: the proposal's and the
               accept test's; the current point's is recomputed)
``floor``      ``B`` batched steps with one JVP each (``jax.jvp`` of the step)
``scan``       the diagonal associative scan of ``B`` elements alone
``iteration``  one Newton iteration of the solver on the whole block
               (``newton_iterates`` with one iteration; the default
               stochastic diagonal Jacobian, no sweep)
``full iter``  the same with the dense Jacobian (``jacobian="full"``: ``D``
               JVPs per step and a dense scan), for ``D <= --max-full-dim``
``seq step``   ``B`` steps of the sequential chain (``sequential_chain``:
               a ``lax.scan`` that carries the gradient, one per step)
=============  ==============================================================

``iteration / floor`` says how close an iteration is to the floor.
``break-even its`` is the time of ``B`` sequential steps over the time of one
iteration: a block solved in fewer Newton iterations than that beats the
sequential chain (``full b-e its`` likewise for the dense Jacobian). Each is
timed under the kernel's matrix-product precision (``"highest"``) and JAX's
default (TF32 on an H200).

Run from the repository root::

    PYTHONPATH=. python benchmarks/iteration_cost.py                 # CPU, small
    PYTHONPATH=. python benchmarks/iteration_cost.py --block-size 16384  # H200

The table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import sys

import _setup  # noqa: F401  (puts the repository root on sys.path)
import jax
import jax.numpy as jnp
from common import describe_machine, format_table, machine_info, timed, write_json
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import initialize_model

from benchmarks.models import BENCHMARK_MODELS
from numpyro_deer import DEERSolver, FullJacobian
from numpyro_deer.core import (
    MALA,
    make_step_fn,
    make_tape,
    mass_matrix_sqrt,
    newton_iterates,
    scan_diagonal,
    sequential_chain,
    solve_sqrt,
    whiten,
)


def _functions(step_fn, potential, step_size, w0, tape, solvers, num_steps):
    """The jitted functions timed, all of the same batch of ``num_steps``."""
    states = jax.vmap(lambda t: w0 + 0.1 * t.noise)(tape)  # B distinct states
    probes = jnp.where(tape.noise > 0, 1.0, -1.0).astype(w0.dtype)

    grad = jax.jit(lambda s: jax.vmap(jax.grad(potential))(s))
    step = jax.jit(lambda s: jax.vmap(step_fn)(s, tape))

    def push(s, t, z):
        return jax.jvp(lambda x: step_fn(x, t), (s,), (z,))

    floor = jax.jit(lambda s: jax.vmap(push)(s, tape, probes))
    scan = jax.jit(lambda a, b: scan_diagonal(a, b))

    key = jax.random.PRNGKey(3)

    def iteration(solver):
        fn = jax.jit(lambda s: newton_iterates(step_fn, w0, tape, key, 1, solver))
        return lambda: fn(states)

    sequential = jax.jit(
        lambda x0: sequential_chain(MALA(), potential, x0, tape, step_size)
    )

    return {
        "grad": lambda: grad(states),
        "step": lambda: step(states),
        "floor": lambda: floor(states),
        "scan": lambda: scan(0.5 * probes, states),
        **{what: iteration(solver) for what, solver in solvers.items()},
        "seq step": lambda: sequential(w0),
    }


def _potential_flat(model, z, args, kwargs):
    """The model's potential energy on flat unconstrained values (NumPyro's)."""
    _, potential_fn, _, _ = initialize_model(
        jax.random.PRNGKey(0), model, model_args=args, model_kwargs=kwargs
    )
    _, unravel = ravel_pytree(z)
    return lambda x: potential_fn(unravel(x))


def measure(name, block_size, num_warmup, precisions, repeats, max_full_dim):
    bench, args, kwargs = _setup.get_model(name)
    state, _ = _setup.warmup(bench, args, kwargs, num_warmup, jax.random.PRNGKey(1), {})
    adapt = state.adapt_state
    mass_sqrt = mass_matrix_sqrt(adapt.inverse_mass_matrix)
    potential = whiten(_potential_flat(bench.model, state.z, args, kwargs), mass_sqrt)
    w0 = solve_sqrt(mass_sqrt, _setup.flat_z(state))
    step_fn = make_step_fn(MALA(), potential, adapt.step_size)
    tape = make_tape(jax.random.PRNGKey(2), block_size, w0.shape[0], w0.dtype)
    rows = []
    for precision in precisions:
        with jax.default_matmul_precision(precision):
            solvers = {"iteration": DEERSolver(sweep=0)}
            if bench.latent_dim <= max_full_dim:
                solvers["full iter"] = DEERSolver(jacobian=FullJacobian(), sweep=0)
            fns = _functions(
                step_fn, potential, adapt.step_size, w0, tape, solvers, block_size
            )
            times = {}
            for what, fn in fns.items():
                _, timing = timed(fn, repeats=repeats)
                times[what] = timing["median_s"]
        row = {
            "model": name,
            "dim": bench.latent_dim,
            "B": block_size,
            "precision": precision or "jax default",
            **{f"{k} ms": v * 1e3 for k, v in times.items()},
            "iteration/floor": times["iteration"] / times["floor"],
            "floor/step": times["floor"] / times["step"],
            "iteration/seq step": times["iteration"] / (times["seq step"] / block_size),
            "break-even its": times["seq step"] / times["iteration"],
        }
        if "full iter" in times:
            row["full b-e its"] = times["seq step"] / times["full iter"]
        rows.append(row)
        print(
            f"{name:34s} {row['precision']:12s}"
            f" iteration {times['iteration'] * 1e3:8.3f}"
            f" ms floor {times['floor'] * 1e3:8.3f} ms"
            f" ratio {row['iteration/floor']:.2f}"
            f" break-even {row['break-even its']:.1f} its",
            flush=True,
        )
    return rows


COLUMNS = [
    ("model", "model"),
    ("dim", "D"),
    ("B", "B"),
    ("precision", "precision"),
    ("grad ms", "grad ms", ".3g"),
    ("step ms", "step ms", ".3g"),
    ("floor ms", "floor ms", ".3g"),
    ("scan ms", "scan ms", ".3g"),
    ("iteration ms", "iter ms", ".3g"),
    ("iteration/floor", "iter/floor", ".2f"),
    ("seq step ms", "seq B steps ms", ".3g"),
    ("break-even its", "break-even its", ".1f"),
    ("full iter ms", "full iter ms", ".3g"),
    ("full b-e its", "full b-e its", ".1f"),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(BENCHMARK_MODELS))
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--precisions",
        nargs="*",
        default=["highest", "default"],
        help="jax.default_matmul_precision values",
    )
    parser.add_argument("--max-full-dim", type=int, default=128)
    parser.add_argument("--json", default="benchmarks/results/iteration_cost.json")
    ns = parser.parse_args(argv)
    machine = machine_info()
    rows = []
    for name in ns.models:
        rows += measure(
            name, ns.block_size, ns.warmup, ns.precisions, ns.repeats, ns.max_full_dim
        )
        write_json(ns.json, {"machine": machine, "argv": sys.argv, "rows": rows})
    print()
    print(describe_machine(machine))
    print(
        "floor = B batched step+JVP evaluations; break-even its = Newton iterations "
        "per block at which DEER costs as much as the sequential chain"
    )
    print(format_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
