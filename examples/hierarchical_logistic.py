"""Hierarchical logistic regression with DEER-MALA.

Non-centred varying intercepts per group with a group-level predictor (the
shape of Gelman and Hill's radon model), on synthetic, unbalanced data. Sampled with
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


def hierarchical_logistic_regression(X, group, group_covariate, y=None):
    """``a = mu_a + gamma * group_covariate + sigma_a * a_raw`` per group,
    ``y[n] ~ Bernoulli(logits=a[group[n]] + X[n] @ beta)``."""
    num_obs, num_features = jnp.shape(X)
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 1.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    gamma = numpyro.sample("gamma", dist.Normal(0.0, 1.0))
    beta = numpyro.sample(
        "beta", dist.Normal(0.0, 1.0).expand([num_features]).to_event(1)
    )
    with numpyro.plate("groups", jnp.shape(group_covariate)[0]):
        a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
        a = numpyro.deterministic("a", mu_a + gamma * group_covariate + sigma_a * a_raw)
    with numpyro.plate("data", num_obs):
        logits = a[group] + X @ beta
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def make_data(seed, num_obs, num_groups, num_features):
    """Unbalanced groups (log-normal sizes, each at least one observation)."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 1.0, num_groups)
    extra = rng.choice(num_groups, size=num_obs - num_groups, p=weights / weights.sum())
    group = rng.permutation(np.concatenate([np.arange(num_groups), extra]))
    X = rng.standard_normal((num_obs, num_features))
    group_covariate = rng.standard_normal(num_groups)
    a = -0.5 + 0.7 * group_covariate + 0.8 * rng.standard_normal(num_groups)
    logits = a[group] + X @ (0.5 * rng.standard_normal(num_features))
    y = rng.random(num_obs) < 1.0 / (1.0 + np.exp(-logits))
    model_args = (jnp.asarray(X), jnp.asarray(group), jnp.asarray(group_covariate))
    return model_args, jnp.asarray(y.astype(np.int32))


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

    if args.num_obs < args.num_groups:
        raise SystemExit("--num-obs must be at least --num-groups")
    model_args, y = make_data(
        args.data_seed, args.num_obs, args.num_groups, args.num_features
    )
    # the kernel's defaults but for the options of the command line, shown on
    # purpose: blocks of 256 (the default 4096 suits a GPU), --method (default
    # "auto"), --dense-mass and --gate (defaults: off and "hard")
    kernel = DEERMALA(
        hierarchical_logistic_regression,
        block_size=args.block_size,
        dense_mass=args.dense_mass,
        method=args.method,
        solver=DEERSolver(gate=args.gate),
    )
    sample_and_report(kernel, args, *model_args, y=y)


if __name__ == "__main__":
    main(parse_args())
