"""Shared set-up of the benchmark scripts: models, warmup, kernels.

Importing this module puts the repository root on ``sys.path`` so that
``numpyro_deer`` and ``benchmarks.common`` import without ``PYTHONPATH``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import numpyro_deer  # noqa: E402
from benchmarks.models import BENCHMARK_MODELS  # noqa: E402


def add_solver_arguments(parser) -> None:
    """Kernel options shared by the scripts (passed to ``DEERMALA``).

    Every option defaults to "not given": the kernel then uses its own default,
    so the scripts follow the package's defaults as they change.
    """
    group = parser.add_argument_group(
        "DEERMALA options (default: the package's default)"
    )
    group.add_argument("--jacobian", choices=["stochastic", "diag", "full"])
    group.add_argument("--num-probes", type=int)
    group.add_argument(
        "--clip", type=float, help="clip of the diagonal Jacobian; <= 0 for none"
    )
    group.add_argument("--gate", choices=["hard", "sigmoid"])
    group.add_argument("--atol", type=float, help="Newton atol")
    group.add_argument("--rtol", type=float, help="Newton rtol")
    group.add_argument("--max-iter", type=int, help="Newton iterations per solve")
    group.add_argument("--max-solves", type=int, help="solves per block")
    group.add_argument("--sweep", type=int, help="sequential steps per sweep")
    group.add_argument("--sweep-after", type=int, help="iterations before sweeps")
    group.add_argument("--solve-basis", choices=["auto", "whitened", "hessian"])
    group.add_argument(
        "--dense-mass",
        action="store_true",
        default=None,
        help="adapt a dense mass matrix in warmup",
    )
    group.add_argument(
        "--no-adapt-mass",
        action="store_true",
        default=None,
        help="do not adapt the mass matrix in warmup",
    )
    group.add_argument(
        "--hessian-mass",
        action="store_true",
        default=None,
        help="adapt_mass_matrix='hessian': the inverse mean Hessian as mass matrix",
    )
    group.add_argument(
        "--sample-mass",
        action="store_true",
        default=None,
        help="adapt_mass_matrix=True: NumPyro's windowed covariance estimate",
    )
    group.add_argument("--target-accept", type=float)


def kernel_options(args) -> dict:
    """``DEERMALA`` keyword arguments for the options that were given.

    Solver settings go into one ``DEERSolver`` (``solver=``), with the
    package's defaults for those not given.
    """
    jacobian = args.jacobian
    strategy = {}
    if args.num_probes is not None:
        strategy["num_probes"] = args.num_probes
    if args.clip is not None:
        strategy["clip"] = None if args.clip <= 0 else args.clip
    if strategy or jacobian is not None:
        classes = {
            "stochastic": numpyro_deer.StochasticDiagonalJacobian,
            "diag": numpyro_deer.DiagonalJacobian,
            "full": numpyro_deer.FullJacobian,
        }
        jacobian = classes[jacobian or "stochastic"](**strategy)
    solver = {
        "jacobian": jacobian,
        "gate": args.gate,
        "atol": args.atol,
        "rtol": args.rtol,
        "max_iter": args.max_iter,
        "max_solves": args.max_solves,
        "sweep": args.sweep,
        "sweep_after": args.sweep_after,
        "solve_basis": args.solve_basis,
    }
    solver = {k: v for k, v in solver.items() if v is not None}
    options = {
        "dense_mass": args.dense_mass,
        "target_accept_prob": args.target_accept,
    }
    options = {k: v for k, v in options.items() if v is not None}
    if solver:
        options["solver"] = numpyro_deer.DEERSolver(**solver)
    mass = {
        False: args.no_adapt_mass,
        True: args.sample_mass,
        "hessian": args.hessian_mass,
    }
    chosen = [value for value, given in mass.items() if given]
    if len(chosen) > 1:
        raise SystemExit(
            "--no-adapt-mass, --hessian-mass and --sample-mass exclude each other"
        )
    if chosen:
        options["adapt_mass_matrix"] = chosen[0]
    return options


def get_model(name: str):
    """``(BenchmarkModel, args, kwargs)`` of a registry model."""
    if name not in BENCHMARK_MODELS:
        raise SystemExit(
            f"unknown model {name!r}; choose from {', '.join(BENCHMARK_MODELS)}"
        )
    bench = BENCHMARK_MODELS[name]
    model_args, model_kwargs = bench.make_data()
    return bench, tuple(model_args), dict(model_kwargs)


def warmup_steps(bench, override: int | None) -> int:
    """``--warmup`` if given, else the model's ``num_warmup`` (long enough for
    its MALA chain to be stationary)."""
    return bench.num_warmup if override is None else override


def warmup(bench, model_args, model_kwargs, num_warmup, rng_key, options):
    """One DEERMALA warmup through ``numpyro_deer.MCMC``.

    Warmup is a sequential MALA with adaptation whatever the method, so it is
    run with ``method="sequential"`` and ``block_size=1``: ``numpyro_deer.MCMC``
    compiles its block loop already in ``warmup``, and this keeps the DEER solve
    out of that compilation. The returned state is handed to kernels of any
    block size and method with :func:`attach`.

    Returns:
        ``(post_warmup_state, seconds)``; the seconds include compilation.
    """
    kernel = numpyro_deer.DEERMALA(
        bench.model, block_size=1, method="sequential", **options
    )
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=num_warmup, num_samples=1, progress_bar=False
    )
    t0 = time.perf_counter()
    mcmc.warmup(rng_key, *model_args, **model_kwargs)
    state = jax.block_until_ready(mcmc.post_warmup_state)
    return state, time.perf_counter() - t0


def make_kernel(bench, block_size, method, options):
    return numpyro_deer.DEERMALA(
        bench.model, block_size=block_size, method=method, **options
    )


def describe_kernel(kernel) -> dict:
    """The kernel's effective settings (public attributes), for the JSON."""
    return {
        "block_size": kernel.block_size,
        "run_block_size": None if kernel.program is None else kernel.program.block_size,
        "solver": repr(kernel.solver),
    }


def attach(kernel, state, model_args, model_kwargs, num_warmup):
    """Initialise ``kernel`` and give it the post-warmup ``state``.

    ``kernel.init`` sets up the kernel (potential, postprocessing, sample
    function); its fresh empty block buffer (of the kernel's block size)
    replaces the one in ``state``, so the first sampling step solves a block
    from ``state.z``. Step size, mass matrix and ``i`` stay those of warmup.
    """
    fresh = kernel.init(
        jax.random.PRNGKey(0), num_warmup, None, model_args, model_kwargs
    )
    return state._replace(block=fresh.block)


def flat_z(state) -> jnp.ndarray:
    """The state's unconstrained position as one flat vector."""
    from jax.flatten_util import ravel_pytree

    return ravel_pytree(state.z)[0]


def jitted_run(mcmc, model_args, model_kwargs, extra_fields=()):
    """``mcmc.run`` inside :func:`jax.jit`, compiled once and reused.

    Stock ``numpyro.infer.MCMC.run`` (NumPyro 0.21 and 0.22, progress bar off)
    recompiles its sampling loop on every call: ``fori_collect`` wraps its
    cached body in a new ``jax.jit`` object each time, and the jit cache misses.
    Running it under an outer ``jax.jit`` traces it once, so a second call
    measures the loop itself. The model's data are closed over (compile-time
    constants), as ``MCMC`` does with its default ``jit_model_args=False``.
    Returns ``run(key) -> (samples grouped by chain, extra fields grouped by
    chain, last_state)``.
    """

    @jax.jit
    def run(rng_key):
        mcmc.run(rng_key, *model_args, extra_fields=extra_fields, **model_kwargs)
        return (
            mcmc.get_samples(group_by_chain=True),
            mcmc.get_extra_fields(group_by_chain=True),
            mcmc.last_state,
        )

    return run
