"""Eight schools with DEER-MALA.

The non-centred eight schools model (Rubin, 1981; Gelman et al., *Bayesian Data
Analysis*, section 5.5), sampled with ``numpyro_deer.MCMC(DEERMALA(model))``:
sequential MALA warmup adapts the step size and the mass matrix, then
every loop iteration solves a block of ``--block-size`` MALA transitions with
DEER. Prints NumPyro's summary and what the Newton solver did.

The defaults finish in well under a minute on a 2-core CPU, compilation
included (float32). For example::

    python examples/eight_schools.py
    python examples/eight_schools.py --num-samples 100000 --block-size 4096
    python examples/eight_schools.py --num-chains 4 --chain-method vectorized
    python examples/eight_schools.py --method sequential   # same chain, lax.scan
"""

import argparse

from _common import configure_jax, sample_and_report, sampler_parser

from numpyro_deer import DEERMALA
from numpyro_deer.models import eight_schools, make_eight_schools_data


def parse_args(argv=None) -> argparse.Namespace:
    parser = sampler_parser(__doc__.split("\n\n")[0], num_warmup=500)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    configure_jax(args)

    (sigma,), data = make_eight_schools_data()
    kernel = DEERMALA(eight_schools, block_size=args.block_size, method=args.method)
    sample_and_report(kernel, args, sigma, y=data["y"])


if __name__ == "__main__":
    main(parse_args())
