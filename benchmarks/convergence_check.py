"""The convergence check after every ``mcmc.run``: its cost and its accuracy.

``numpyro_deer.MCMC.run`` ends with ``numpyro_deer.infer.diagnostics.diagnose``
on the run's draws (bulk ESS and R-hat on rank-normalised draws, on the
host). With many vectorized chains that is on every user's clock: a first
accurate answer of 1,024 chains on a GPU waits for it. This script times the
check on stationary AR(1) chains (unit variance, coefficient ``--rho``) of
each shape ``chains x draws x components``, and beside it the same
computation without its bound on the values looked at (``max_values`` the
array's size: every chain, every draw up to ``MAX_DRAWS`` per chain), whose
smallest ESS and largest R-hat the check estimates, and the check's
thinning with every chain (``every chain s``: the check before it spaced the
chains). Each time is ``benchmarks.common.timed``'s median of ``--repeats``
calls or more after a first (fast calls repeated to half a second), or the
first call alone where it took over a second.

    PYTHONPATH=. python benchmarks/convergence_check.py \\
        --shapes 1x100000x2 4x4096x25 256x1024x10 1024x1024x10 1024x512x50 \\
        1024x512x100 --json benchmarks/results/convergence_check_cpu.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["256x1024x10", "1024x512x50"])
    parser.add_argument("--rho", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def ar1(rng, shape: tuple[int, ...], rho: float) -> np.ndarray:
    """Stationary AR(1) chains along axis 1, unit variance, float32."""
    x = np.empty(shape, np.float32)
    x[:, 0] = rng.normal(size=(shape[0],) + shape[2:])
    scale = np.sqrt(1.0 - rho**2)
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + scale * rng.normal(size=(shape[0],) + shape[2:])
    return x


def main(argv=None) -> list[dict]:
    ns = parse_args(argv)
    from benchmarks import common
    from numpyro_deer.infer import diagnostics as dg
    from numpyro_deer.infer.diagnostics import diagnose

    rng = np.random.default_rng(ns.seed)
    rows = []
    for text in ns.shapes:
        shape = tuple(int(n) for n in text.split("x"))  # chains, draws, components
        draws = {"x": ar1(rng, shape, ns.rho)}
        size = draws["x"].size
        # the same thinning with every chain: the bound raised to their values
        chains, length, dim = shape
        keep = min(
            length, dg.MAX_DRAWS, max(dg.MIN_DRAWS, dg.MAX_VALUES // (chains * dim))
        )
        every = max(dg.MAX_VALUES, chains * keep * dim)

        def seconds(max_values, d=draws):
            # a call of over a second once (nothing compiles: it is the time)
            result, timing = common.timed(
                lambda: diagnose(d, max_values), ns.repeats, single_run_above_s=1.0
            )
            return result, timing["median_s"]

        check, check_s = seconds(dg.MAX_VALUES)
        _, chains_s = seconds(every)
        full, full_s = seconds(size)
        rows.append({
            "shape": text, "values": size, "check_s": check_s,
            "check_min_ess": check.min_ess, "check_max_rhat": check.max_rhat,
            "every_chain_s": chains_s,
            "full_s": full_s, "full_min_ess": full.min_ess,
            "full_max_rhat": full.max_rhat, "rhat_kind": check.rhat_kind,
        })  # fmt: skip
        print(f"{text}: check {check_s:.3f} s, every draw {full_s:.3f} s", flush=True)
    columns = [
        ("shape", "chains x draws x components", "s"),
        ("check_s", "check s", ".3f"),
        ("check_min_ess", "min ESS", ".0f"),
        ("check_max_rhat", "max R-hat", ".4f"),
        ("every_chain_s", "every chain s", ".3f"),
        ("full_s", "every draw s", ".3f"),
        ("full_min_ess", "min ESS", ".0f"),
        ("full_max_rhat", "max R-hat", ".4f"),
        ("rhat_kind", "R-hat", "s"),
    ]
    print(common.format_table(rows, columns))
    path = ns.json or common.default_json_path("convergence_check")
    common.write_json(
        path, {"machine": common.machine_info(), "rho": ns.rho, "rows": rows}
    )
    return rows


if __name__ == "__main__":
    main()
