"""DEER's linear step: its products and its groups, compile and run.

Full DEER composes ``D x D`` affine maps in an associative scan
(:func:`numpyro_deer.core.scan.scan_dense`). Up to
``numpyro_deer.core.scan.ELEMENTWISE_MAX_DIM`` the products are written as
broadcast multiplications and sums; above, as matrix products
(``--products``). The scan runs over groups of ``numpyro_deer.core.scan.RADIX``
consecutive elements (``--radix``; 1: :func:`jax.lax.associative_scan` over all
``T`` elements). This script times each setting for the dense scan alone
(``T`` steps, ``D`` from 2 to 32, ``T D^2`` held near ``4e5 * 4``), the
diagonal scan (``T D`` near the same), and the banana HMC block of
``benchmarks/paper.py`` (full Jacobian, 8 leapfrog steps of 0.5, one chain):
``compile_s`` (tracing, lowering and compiling one jitted program, XLA's
pipeline time) and ``run_s`` (the median of at least three calls), with the
Newton iterations of the banana block.

    PYTHONPATH=. python3 benchmarks/dense_products.py --banana-steps 2000
    PYTHONPATH=. python3 benchmarks/dense_products.py --platform gpu \\
        --banana-steps 100000 --json $OUT/dense_products.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _time(fn, *args) -> tuple[float | None, float, object]:
    """``(compile s, run s, result)`` of ``jax.jit(fn)(*args)``
    (:func:`common.timed`: XLA's pipeline time of the first call, the median
    of at least three more)."""
    import common
    import jax

    jitted = jax.jit(fn)
    out, timing = common.timed(lambda: jitted(*args), repeats=3)
    return timing["first_compile_s"], timing["median_s"], out


PRODUCTS = ("elementwise", "matrix")


def _settings(dim: int, products, radixes):
    """Set the scan's constants for each ``(products, radix)``; yield them."""
    from numpyro_deer.core import scan

    for way in products:
        for radix in radixes:
            scan.ELEMENTWISE_MAX_DIM = dim if way == "elementwise" else dim - 1
            scan.RADIX = radix
            yield {"products": way, "radix": radix}


def scan_rows(dims, elements: int, products, radixes) -> list[dict]:
    import jax

    from numpyro_deer.core import scan

    rows = []
    for dim in dims:
        T = max(elements // (dim * dim), 2)
        key_a, key_b = jax.random.split(jax.random.PRNGKey(dim))
        A = 0.9 * jax.random.orthogonal(key_a, dim, (T,))
        b = jax.random.normal(key_b, (T, dim))
        for setting in _settings(dim, products, radixes):
            # a new function each time: jit's trace cache would reuse the first
            compile_s, run_s, _ = _time(lambda A, b: scan.scan_dense(A, b), A, b)
            rows.append({"case": "scan", "D": dim, "T": T, **setting,
                         "compile_s": compile_s, "run_s": run_s})  # fmt: skip
        T = max(elements // dim, 2)
        A = jax.random.uniform(key_a, (T, dim), minval=-0.9, maxval=0.9)
        b = jax.random.normal(key_b, (T, dim))
        for setting in _settings(dim, products[:1], radixes):
            compile_s, run_s, _ = _time(lambda A, b: scan.scan_diagonal(A, b), A, b)
            rows.append(
                {"case": "scan_diagonal", "D": dim, "T": T, **setting, "products": "-",
                 "compile_s": compile_s, "run_s": run_s}
            )  # fmt: skip
    return rows


def banana_rows(T: int, products, radixes) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from paper import banana_potential

    from numpyro_deer.core import hmc, transition
    from numpyro_deer.core.newton import DEERSolver, deer_solve

    kernel = hmc.HMC(num_steps=8, jitter=0.0)
    step_fn = transition.make_step_fn(kernel, banana_potential, jnp.asarray(0.5))
    x0 = 10.0 * jax.random.normal(jax.random.PRNGKey(1), (2,))
    tape = kernel.make_tape(jax.random.PRNGKey(0), T, 2, x0.dtype)
    rows = []
    for setting in _settings(2, products, radixes):
        solver = DEERSolver(jacobian="full")

        def solve(x0, tape, key, solver=solver):
            return deer_solve(step_fn, x0, tape, key, solver)

        compile_s, run_s, out = _time(solve, x0, tape, jax.random.PRNGKey(2))
        rows.append({"case": "banana", "D": 2, "T": T, **setting,
                     "compile_s": compile_s, "run_s": run_s,
                     "newton_iterations": int(out[2].iterations)})  # fmt: skip
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", choices=("cpu", "gpu"), default=None)
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--elements", type=int, default=1_600_000)
    parser.add_argument("--banana-steps", type=int, default=2000)
    parser.add_argument("--products", nargs="+", choices=PRODUCTS, default=PRODUCTS)
    parser.add_argument(
        "--radix", type=int, nargs="+", default=None, help="default: the package's"
    )
    parser.add_argument("--json", default=None)
    ns = parser.parse_args(argv)

    import jax

    if ns.platform:
        jax.config.update("jax_platforms", "cuda" if ns.platform == "gpu" else "cpu")
    import common

    from numpyro_deer.core import scan

    default = scan.ELEMENTWISE_MAX_DIM, scan.RADIX
    radixes = ns.radix or [scan.RADIX]
    try:
        rows = scan_rows(ns.dims, ns.elements, ns.products, radixes)
        rows += banana_rows(ns.banana_steps, ns.products, radixes)
    finally:
        scan.ELEMENTWISE_MAX_DIM, scan.RADIX = default
    out = Path(ns.json) if ns.json else common.default_json_path("dense_products")
    common.write_json(out, {"machine": common.machine_info(), "args": vars(ns),
                            "rows": rows})  # fmt: skip
    print(common.describe_machine(common.machine_info()))
    print(common.format_table(rows, [
        ("case", "case"), ("D", "D"), ("T", "T"), ("products", "products"),
        ("radix", "radix"),
        ("compile_s", "compile s", ".3g"), ("run_s", "run s", ".3g"),
        ("newton_iterations", "iterations"),
    ]))  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
