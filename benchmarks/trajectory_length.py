"""``DEERHMC``'s leapfrog count: ESS per gradient by ``num_steps``, race targets.

For each target and each ``num_steps`` (a count, or ``"auto"``: the count of
``numpyro_deer.core.num_steps_for`` at the end of warmup) one fresh
``numpyro_deer.MCMC`` run of ``DEERHMC(model, num_steps=..., method=
"sequential")``, ``--chains`` vectorized chains, ``--warmup`` steps and
``--draws`` draws per chain, with the race's metric choice
(``adapt_mass_matrix`` ``--mass``; ``"auto"``: the Hessian for these chain
counts below D = 512). The sampling transitions' count is the run's extra
field ``"num_steps"``; per 1,000 gradients of the sampling phase (chains x
draws x count) the table gives the smallest bulk ESS over the latent
components of their values (``ESS/kgrad``) and of their squared deviations
from the pooled mean (``ESS2/kgrad``): the race scores both the mean and the
second moment, and a trajectory of half a period makes the values antithetic
and their squares unchanged. ``err`` is the race's mean error against the
target's truth (``race.Tracker.errors``: the largest over components of
``((mean - m) / s)^2``).

    PYTHONPATH=. python benchmarks/trajectory_length.py --json \\
        benchmarks/results/trajectory_length_cpu.json
    # the Gym's item response theory with the diagonal metric (as 256 chains
    # on a GPU take it):
    PYTHONPATH=. python benchmarks/trajectory_length.py \\
        --targets gym_synthetic_irt --mass true --num-steps 4 auto 8 16
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402
from _counts import run_num_steps  # noqa: E402
from race import Tracker  # noqa: E402
from race_samplers import flatten_sites  # noqa: E402

TARGETS = [
    "gym_eight_schools",
    "gym_brownian_motion_missing_middle",
    "ill_conditioned_gaussian",
    "hierarchical_logistic_regression",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=TARGETS)
    parser.add_argument(
        "--num-steps", nargs="+", type=common.num_steps_word, default=[4, "auto"]
    )
    parser.add_argument(
        "--mass", default="auto", choices=common.MASS_WORDS, help="adapt_mass_matrix"
    )
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def _min_ess(x: np.ndarray) -> float:
    return common.min_ess({"x": x}, backend="numpyro")["min_ess"]


def run_row(target, num_steps, ns) -> dict:
    import jax

    import numpyro_deer

    mass = common.adapt_mass_matrix(ns.mass)
    kernel = numpyro_deer.DEERHMC(
        target.model, num_steps=num_steps, method="sequential",
        adapt_mass_matrix=mass, block_size=ns.draws,
    )  # fmt: skip
    mcmc = numpyro_deer.MCMC(
        kernel, num_warmup=ns.warmup, num_samples=ns.draws, num_chains=ns.chains,
        chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(
            jax.random.PRNGKey(ns.seed), *target.args,
            extra_fields=("num_steps",), **target.kwargs,
        )  # fmt: skip
    samples = mcmc.get_samples(group_by_chain=True)
    wall = time.perf_counter() - t0
    x = np.asarray(flatten_sites(samples, list(target.truth), 2), np.float64)
    count = run_num_steps(mcmc)
    kgrad = ns.chains * ns.draws * count / 1000
    deviation = (x - x.mean((0, 1))) ** 2
    tracker = Tracker(target.truth, 0.0, 0.0)
    err, _ = tracker.errors(x.sum((0, 1)), (x**2).sum((0, 1)), ns.chains * ns.draws)
    eps = np.asarray(mcmc.last_state.adapt_state.step_size)
    return {
        "target": target.name,
        "num_steps": num_steps,
        "chosen": count,
        "step_size": float(np.median(eps)),
        "ess_per_kgrad": _min_ess(x) / kgrad,
        "ess2_per_kgrad": _min_ess(deviation) / kgrad,
        "err_mean": err,
        "wall_s": wall,
    }


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    from gym_models import get_target

    rows = []
    for name in ns.targets:
        target = get_target(name)
        for num_steps in ns.num_steps:
            rows.append(run_row(target, num_steps, ns))
            print(rows[-1], flush=True)
    if ns.json:
        info = {"machine": common.machine_info(), "args": vars(ns), "rows": rows}
        common.write_json(ns.json, info)
    print(common.describe_machine(common.machine_info()))
    print(
        common.format_table(
            rows,
            [
                ("target", "target"),
                ("num_steps", "num_steps"),
                ("chosen", "steps"),
                ("step_size", "eps", ".3f"),
                ("ess_per_kgrad", "ESS/kgrad", ".3g"),
                ("ess2_per_kgrad", "ESS2/kgrad", ".3g"),
                ("err_mean", "err", ".2g"),
                ("wall_s", "wall s", ".1f"),
            ],
        )
    )
    return rows


if __name__ == "__main__":
    main()
