"""Eight schools with DEER-MALA.

The non-centred eight schools model (Rubin, 1981; Gelman et al., *Bayesian Data
Analysis*, section 5.5), sampled with ``numpyro_deer.MCMC(DEERMALA(model))``:
sequential MALA warmup adapts the step size and the mass matrix, then
every loop iteration computes a block of ``--block-size`` MALA transitions,
with the kernel's default ``method="auto"``: the sequential scan on a CPU, on
an accelerator DEER if it is faster. Prints NumPyro's summary and what the
Newton solver did.

The defaults finish in well under a minute on a 2-core CPU, compilation
included (float32). For example::

    python examples/eight_schools.py
    python examples/eight_schools.py --num-samples 200000 --block-size 4096
    python examples/eight_schools.py --num-chains 4 --chain-method vectorized
    python examples/eight_schools.py --method deer   # DEER, also on a CPU
"""

import argparse

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from _common import configure_jax, sample_and_report, sampler_parser

from numpyro_deer import DEERMALA

# estimated treatment effects and their standard errors
Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)


def eight_schools(sigma, y=None):
    """Non-centred: ``theta = mu + tau * theta_tilde``, ``y ~ N(theta, sigma)``."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("schools", jnp.shape(sigma)[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def parse_args(argv=None) -> argparse.Namespace:
    # MALA needs about 50,000 draws for a few hundred effective draws of tau
    # (fewer, and the run's convergence check warns)
    parser = sampler_parser(
        __doc__.split("\n\n")[0], num_warmup=500, num_samples=50_000
    )
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    configure_jax(args)

    # the kernel's defaults but for two options shown on purpose: blocks of
    # 256 (the default 4096 suits a GPU) and --method (default "auto")
    kernel = DEERMALA(eight_schools, block_size=args.block_size, method=args.method)
    sample_and_report(kernel, args, jnp.asarray(SIGMA), y=jnp.asarray(Y))


if __name__ == "__main__":
    main(parse_args())
