"""Hierarchical logistic regression with DEER-MALA.

``numpyro_deer.models.hierarchical_logistic_regression``: non-centred varying
intercepts per group with a group-level predictor (the shape of Gelman and
Hill's radon model), on synthetic, unbalanced data from
``make_hierarchical_logistic_data``. Sampled with
``numpyro_deer.MCMC(DEERMALA(model))``; prints NumPyro's summary (deterministic
sites left out) and what the Newton solver did. The defaults are a small
problem that runs in about a minute on a 2-core CPU; the benchmark size is
``--num-obs 2000 --num-groups 85 --num-features 3`` (latent dimension 91).
MALA mixes slowly per draw on this posterior (watch ``n_eff`` of ``gamma`` and
``mu_a``): ask for tens of thousands of draws where they are cheap, on a GPU.
At the benchmark size MALA also needs a longer warmup than NUTS: after 800
steps its chain is still on the way to the posterior, and DEER's first blocks
stall; 3,000 steps suffice (``docs/limitations.md``). On an H200, after that
warmup, blocks of 16,384 ran 3.4x the sequential chain (``docs/performance.md``).

For example::

    python examples/hierarchical_logistic.py
    python examples/hierarchical_logistic.py --num-obs 2000 --num-groups 85 \\
        --num-warmup 3000 --num-samples 131072 --block-size 4096 --device gpu
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
    hierarchical_logistic_regression,
    make_hierarchical_logistic_data,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = sampler_parser(__doc__.split("\n\n")[0], num_warmup=1000)
    add_tuning_options(parser)
    parser.add_argument("--num-obs", type=int, default=500)
    parser.add_argument("--num-groups", type=int, default=20)
    parser.add_argument("--num-features", type=int, default=3)
    parser.add_argument("--data-seed", type=int, default=0)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    configure_jax(args)

    model_args, data = make_hierarchical_logistic_data(
        seed=args.data_seed,
        num_obs=args.num_obs,
        num_groups=args.num_groups,
        num_features=args.num_features,
    )
    kernel = DEERMALA(
        hierarchical_logistic_regression,
        block_size=args.block_size,
        gate=args.gate,
        dense_mass=args.dense_mass,
        method=args.method,
    )
    sample_and_report(kernel, args, *model_args, y=data["y"])


if __name__ == "__main__":
    main(parse_args())
