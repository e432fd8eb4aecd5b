"""Bayesian logistic regression with DEER-MALA.

``numpyro_deer.models.logistic_regression`` (an intercept and a
``N(0, I)`` weight vector, Bernoulli likelihood) on synthetic data from
``make_logistic_regression_data``: ``--num-obs`` standard normal feature rows
with ``--num-features`` features. Sampled with
``numpyro_deer.MCMC(DEERMALA(model))``; prints NumPyro's summary and what the
Newton solver did. The defaults are a small problem that runs in under a minute
on a 2-core CPU; the benchmark size is ``--num-obs 1000 --num-features 24``.

For example::

    python examples/logistic_regression.py
    python examples/logistic_regression.py --num-obs 1000 --num-features 24 \\
        --num-samples 100000 --block-size 4096 --device gpu
    python examples/logistic_regression.py --dense-mass --gate sigmoid
"""

import argparse
import time

import jax
import numpy as np
import numpyro

from numpyro_deer import DEERMALA, MCMC
from numpyro_deer.models import (
    logistic_regression,
    make_logistic_regression_data,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-obs", type=int, default=500)
    parser.add_argument("--num-features", type=int, default=8)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--num-warmup", type=int, default=500)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--num-chains", type=int, default=1)
    parser.add_argument(
        "--chain-method",
        default="sequential",
        choices=["sequential", "vectorized", "parallel"],
    )
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--gate", default="hard", choices=["hard", "sigmoid"])
    parser.add_argument(
        "--dense-mass", action="store_true", help="adapt a dense mass matrix"
    )
    parser.add_argument(
        "--method",
        default="deer",
        choices=["deer", "sequential"],
        help="'deer' (parallel Newton) or 'sequential' (the same chain, lax.scan)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--x64", action="store_true", help="compute in float64 (default float32)"
    )
    parser.add_argument(
        "--device", default=None, choices=["cpu", "gpu"], help="default: JAX's choice"
    )
    parser.add_argument(
        "--progress-bar", action=argparse.BooleanOptionalAction, default=True
    )
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    # JAX settings first: they must come before any array is created.
    if args.device is not None:
        numpyro.set_platform(args.device)
    if args.chain_method == "parallel":
        numpyro.set_host_device_count(args.num_chains)
    numpyro.enable_x64(args.x64)

    (X,), data = make_logistic_regression_data(
        seed=args.data_seed, num_obs=args.num_obs, num_features=args.num_features
    )
    kernel = DEERMALA(
        logistic_regression,
        block_size=args.block_size,
        gate=args.gate,
        dense_mass=args.dense_mass,
        method=args.method,
    )
    mcmc = MCMC(
        kernel,
        num_warmup=args.num_warmup,
        num_samples=args.num_samples,
        num_chains=args.num_chains,
        chain_method=args.chain_method,
        progress_bar=args.progress_bar,
    )
    start = time.perf_counter()
    mcmc.run(
        jax.random.PRNGKey(args.seed),
        X,
        y=data["y"],
        extra_fields=("newton_iterations", "deer_converged"),
    )
    elapsed = time.perf_counter() - start
    mcmc.print_summary()

    fields = mcmc.get_extra_fields(group_by_chain=True)
    # one value per block: the draws of a block share its solve's fields
    per_block = np.asarray(fields["newton_iterations"])[:, :: args.block_size]
    converged = np.asarray(fields["deer_converged"])[:, :: args.block_size]
    print(f"devices: {jax.devices()}")
    print(
        f"{args.num_chains} x {args.num_samples} draws in {elapsed:.1f} s "
        f"(compilation included), method={args.method}, "
        f"block_size={args.block_size}"
    )
    if args.method == "deer":
        print(
            f"Newton iterations per block: mean {per_block.mean():.1f}, "
            f"max {per_block.max()}; blocks solved by DEER: "
            f"{converged.sum()} of {converged.size}"
        )


if __name__ == "__main__":
    main(parse_args())
