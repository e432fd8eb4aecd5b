"""Bayesian logistic regression with DEER-MALA.

An intercept and a ``N(0, I)`` weight vector, Bernoulli likelihood, on
synthetic data: ``--num-obs`` standard normal feature rows with
``--num-features`` features. Sampled with
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

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from _common import (
    add_tuning_options,
    configure_jax,
    sample_and_report,
    sampler_parser,
)

from numpyro_deer import DEERMALA, DEERSolver


def logistic_regression(X, y=None):
    """``y[n] ~ Bernoulli(logits=intercept + X[n] @ weights)``."""
    num_obs, num_features = jnp.shape(X)
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 1.0))
    weights = numpyro.sample(
        "weights", dist.Normal(0.0, 1.0).expand([num_features]).to_event(1)
    )
    with numpyro.plate("data", num_obs):
        numpyro.sample("y", dist.Bernoulli(logits=intercept + X @ weights), obs=y)


def make_data(seed, num_obs, num_features):
    """Standard normal features, true logits with a standard deviation of ~2."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((num_obs, num_features))
    weights = rng.standard_normal(num_features) * 2.0 / np.sqrt(num_features)
    logits = 0.5 + X @ weights
    y = rng.random(num_obs) < 1.0 / (1.0 + np.exp(-logits))
    return jnp.asarray(X), jnp.asarray(y.astype(np.int32))


def parse_args(argv=None) -> argparse.Namespace:
    parser = sampler_parser(__doc__.split("\n\n")[0], num_warmup=500)
    add_tuning_options(parser)
    parser.add_argument("--num-obs", type=int, default=500)
    parser.add_argument("--num-features", type=int, default=8)
    parser.add_argument("--data-seed", type=int, default=0)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    configure_jax(args)

    X, y = make_data(args.data_seed, args.num_obs, args.num_features)
    # the kernel's defaults but for the options of the command line, shown on
    # purpose: blocks of 256 (the default 4096 suits a GPU), --method (default
    # "auto"), --dense-mass and --gate (defaults: off and "hard")
    kernel = DEERMALA(
        logistic_regression,
        block_size=args.block_size,
        dense_mass=args.dense_mass,
        method=args.method,
        solver=DEERSolver(gate=args.gate),
    )
    sample_and_report(kernel, args, X, y=y)


if __name__ == "__main__":
    main(parse_args())
