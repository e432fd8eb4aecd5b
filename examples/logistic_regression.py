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

from _common import (
    add_tuning_options,
    configure_jax,
    sample_and_report,
    sampler_parser,
)

from numpyro_deer import DEERMALA
from numpyro_deer.models import (
    logistic_regression,
    make_logistic_regression_data,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = sampler_parser(__doc__.split("\n\n")[0], num_warmup=500)
    add_tuning_options(parser)
    parser.add_argument("--num-obs", type=int, default=500)
    parser.add_argument("--num-features", type=int, default=8)
    parser.add_argument("--data-seed", type=int, default=0)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    configure_jax(args)

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
    sample_and_report(kernel, args, X, y=data["y"])


if __name__ == "__main__":
    main(parse_args())
