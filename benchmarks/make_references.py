"""Long NUTS references for the race's benchmark models (``benchmarks/race.py``).

For each model of ``BENCHMARK_MODELS`` this runs NumPyro's NUTS (dense metric
where ``--dense`` names the model, target acceptance 0.9) in float64 for
``--chains`` chains of ``--draws`` draws after ``--warmup`` warmup steps, and
stores per latent site the posterior mean and standard deviation of every
component, together with the smallest bulk ESS (``numpyro.diagnostics``) and
the largest split R-hat over the components, in
``benchmarks/results/references/<model>.json``. The ill-conditioned Gaussian is
its own closed form (``ill_conditioned_gaussian_posterior``) and gets no run.

A reference with effective sample size ``n`` estimates a mean with a
standardized squared error of about ``1/n``; the race's thresholds must stay
well above that (``benchmarks/race.py`` prints each reference's ``1/ESS``).
Run from the repository root::

    PYTHONPATH=. python3 benchmarks/make_references.py --models eight_schools \\
        --chains 4 --draws 20000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # a script, not a library: float64 references

import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.models import (  # noqa: E402
    BENCHMARK_MODELS,
    ill_conditioned_gaussian_posterior,
)

REFERENCE_DIR = Path(__file__).resolve().parent / "results" / "references"


def reference(
    name: str,
    chains: int,
    draws: int,
    warmup: int,
    dense: bool,
    seed: int,
    target_accept: float = 0.9,
):
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    if name == "ill_conditioned_gaussian":
        post = ill_conditioned_gaussian_posterior(*args, **kwargs)
        sites = {
            k: {
                "mean": v.mean.tolist(),
                "sd": v.std.tolist(),
                "shape": list(v.mean.shape),
            }
            for k, v in post.items()
        }
        return {"model": name, "method": "closed form", "sites": sites, "min_ess": None}
    kernel = numpyro.infer.NUTS(
        bench.model, dense_mass=dense, target_accept_prob=target_accept
    )
    mcmc = numpyro.infer.MCMC(
        kernel,
        num_warmup=warmup,
        num_samples=draws,
        num_chains=chains,
        chain_method="sequential",
        progress_bar=False,
    )
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=("diverging",), **kwargs)
    seconds = time.perf_counter() - t0
    samples = mcmc.get_samples(group_by_chain=True)
    sites, min_ess, max_rhat = {}, np.inf, 0.0
    for k, v in samples.items():
        v = np.asarray(v, dtype=np.float64)
        flat = v.reshape(v.shape[0], v.shape[1], -1)
        ess = np.atleast_1d(effective_sample_size(flat))
        rhat = np.atleast_1d(split_gelman_rubin(flat))
        min_ess, max_rhat = (
            min(min_ess, float(ess.min())),
            max(max_rhat, float(rhat.max())),
        )
        sites[k] = {
            "mean": flat.mean(axis=(0, 1)).tolist(),
            "sd": flat.std(axis=(0, 1)).tolist(),
            "shape": list(v.shape[2:]),
            "min_ess": float(ess.min()),
        }
    divergences = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    return {
        "model": name,
        "method": f"NumPyro NUTS float64, {'dense' if dense else 'diagonal'} metric, "
        f"target_accept_prob={target_accept}, {chains} chains x {draws} draws "
        f"after {warmup} warmup",
        "sites": sites,
        "min_ess": min_ess,
        "max_rhat": max_rhat,
        "divergences": divergences,
        "seconds": seconds,
        "versions": {"jax": jax.__version__, "numpyro": numpyro.__version__},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(BENCHMARK_MODELS))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument(
        "--dense", nargs="*", default=["eight_schools", "logistic_regression"]
    )
    parser.add_argument("--seed", type=int, default=0)
    # models whose NUTS diverges at 0.9 (stochastic volatility) need smaller steps
    parser.add_argument("--target-accept", type=float, default=0.9)
    parser.add_argument("--out", default=str(REFERENCE_DIR))
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ns.models:
        ref = reference(
            name,
            ns.chains,
            ns.draws,
            ns.warmup,
            name in ns.dense,
            ns.seed,
            ns.target_accept,
        )
        (out / f"{name}.json").write_text(json.dumps(ref, indent=1) + "\n")
        print(
            f"{name}: min ESS {ref['min_ess']}, max R-hat {ref.get('max_rhat')}, "
            f"divergences {ref.get('divergences')}, {ref.get('seconds', 0):.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
