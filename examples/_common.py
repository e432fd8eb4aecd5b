"""What the example scripts share: the sampler's command-line options and the
sample-and-report step. Each example adds its model's own options and data."""

import argparse
import time

import jax
import numpy as np
import numpyro

from numpyro_deer import MCMC


def sampler_parser(
    description: str, num_warmup: int = 500, num_samples: int = 2000
) -> argparse.ArgumentParser:
    """A parser with the options every example takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--num-warmup", type=int, default=num_warmup)
    parser.add_argument("--num-samples", type=int, default=num_samples)
    parser.add_argument("--num-chains", type=int, default=1)
    parser.add_argument(
        "--chain-method",
        default="sequential",
        choices=["sequential", "vectorized", "parallel"],
    )
    parser.add_argument("--block-size", type=int, default=256)
    # the kernel's default unless asked for: "auto" takes the sequential scan
    # on a CPU and the faster of the two, measured, on an accelerator
    parser.add_argument(
        "--method",
        default="auto",
        choices=["auto", "deer", "sequential"],
        help="'auto' (the default: sequential on a CPU, the faster of the two "
        "on an accelerator), 'deer' (parallel Newton) or 'sequential' (the "
        "same chain, lax.scan)",
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
    return parser


def add_tuning_options(parser: argparse.ArgumentParser) -> None:
    """Options of the kernel that the larger examples expose."""
    parser.add_argument("--gate", default="hard", choices=["hard", "sigmoid"])
    parser.add_argument(
        "--dense-mass",
        action="store_true",
        help="a dense sample covariance as mass matrix instead of the default "
        "(the inverse mean Hessian)",
    )


def configure_jax(args: argparse.Namespace) -> None:
    """JAX settings; they must come before any array is created."""
    if args.device is not None:
        numpyro.set_platform(args.device)
    if args.chain_method == "parallel":
        numpyro.set_host_device_count(args.num_chains)
    numpyro.enable_x64(args.x64)


def sample_and_report(kernel, args: argparse.Namespace, *model_args, **model_kwargs):
    """Run ``numpyro_deer.MCMC`` with ``kernel``; print the summary and the solver."""
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
        *model_args,
        **model_kwargs,
        extra_fields=("newton_iterations", "deer_converged"),
    )
    elapsed = time.perf_counter() - start
    mcmc.print_summary()

    fields = mcmc.get_extra_fields(group_by_chain=True)
    # one value per block: the draws of a block share its solve's fields (the
    # run's blocks: block_size fitted to num_samples)
    size = kernel.program.block_size
    per_block = np.asarray(fields["newton_iterations"])[:, ::size]
    converged = np.asarray(fields["deer_converged"])[:, ::size]
    method = kernel.method_chosen  # what method="auto" chose, or the method
    print(f"devices: {jax.devices()}")
    print(
        f"{args.num_chains} x {args.num_samples} draws in {elapsed:.1f} s "
        f"(compilation included), method={method}, "
        f"blocks of {size}"
    )
    if method == "deer":
        print(
            f"Newton iterations per block: mean {per_block.mean():.1f}, "
            f"max {per_block.max()}; blocks solved by DEER: "
            f"{converged.sum()} of {converged.size}"
        )
    else:
        print(
            "Newton iterations per block: none, the blocks were computed by "
            "the sequential scan (--method deer solves them with DEER)"
        )
    return mcmc
