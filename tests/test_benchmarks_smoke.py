"""Smoke tests of the scripts in ``benchmarks/``: each runs at a tiny size.

Every script runs as a subprocess on the CPU (a few dozen draws on eight
schools, blocks of 16) and must exit with 0 and write its JSON, so that a
change of the package cannot leave a benchmark broken until the next GPU run.
Compilation dominates their run time.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# tests of benchmarks/, not of the package: a CI job of their own
pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
TINY_MODEL = ["--models", "eight_schools", "--warmup", "20"]

CASES = {
    "trajectory_length.py": [
        "--targets",
        "ill_conditioned_gaussian",
        "--chains",
        "2",
        "--warmup",
        "30",
        "--draws",
        "40",
    ],
    "suite.py": [
        *TINY_MODEL,
        "--draws",
        "32",
        "--block-size",
        "16",
        "--nuts-draws",
        "20",
        "--nuts-warmup",
        "20",
        "--skip-blackjax",
        "--repeats",
        "1",
    ],
    "ablation.py": [
        *TINY_MODEL,
        "--block-size",
        "16",
        "--blocks",
        "1",
        "--variants",
        "baseline",
    ],
    "iteration_cost.py": [
        *TINY_MODEL,
        "--block-size",
        "16",
        "--repeats",
        "1",
        "--precisions",
        "highest",
    ],
    "driver_overhead.py": [
        "--model",
        "eight_schools",
        "--draws",
        "32",
        "--block-size",
        "16",
        "--warmup",
        "20",
        "--repeats",
        "1",
    ],
    "vectorized_chains.py": [
        *TINY_MODEL,
        "--chains",
        "2",
        "--block-size",
        "16",
        "--blocks",
        "1",
        "--sweeps",
        "0",
        "--repeats",
        "1",
    ],
    "scaling.py": [  # the eight host devices of conftest's XLA_FLAGS
        "--devices",
        "8",
        "--block-sizes",
        "64",
        "--per-device",
        "--repeats",
        "1",
        "--kernel-warmup",
        "20",
    ],
    "method_auto.py": [
        "--models",
        "eight_schools",
        "--block-size",
        "16",
        "--blocks",
        "2",
        "--num-warmup",
        "20",
        "--repeats",
        "1",
    ],
    "make_references.py": [
        "--models",
        "eight_schools",
        "--chains",
        "1",
        "--draws",
        "20",
        "--warmup",
        "20",
    ],
    "compile_profile.py": ["--variants", "sequential", "--block-size", "16"],
    "warmup_cost.py": [
        "--dims",
        "11",
        "--num-warmup",
        "20",
        "--masses",
        "hessian",
        "--layouts",
        "1:sequential",
    ],
    "hmc_tuning.py": [
        *TINY_MODEL,
        "--num-leapfrog",
        "2",
        "--targets",
        "0.8",
        "--trajectory",
        "0",
        "--tune",
        "10",
        "--draws",
        "20",
        "--chains",
        "1",
        "--block",
        "16",
        "--blocks",
        "1",
    ],
    "hmc_formulations.py": [
        *TINY_MODEL,
        "--num-leapfrog",
        "2",
        "--strategies",
        "stochastic",
        "--tune",
        "10",
        "--block",
        "16",
        "--cap",
        "50",
    ],
    "compile_options.py": [
        "--models",
        "eight_schools",
        "--options",
        "default",
        "autotune=0",
        "--block-size",
        "16",
        "--num-warmup",
        "20",
    ],
    "hmc_vs_mala.py": [
        "--models",
        "eight_schools",
        "--methods",
        "deer_hmc",
        "--num-warmup",
        "20",
        "--num-samples",
        "32",
        "--block-size",
        "16",
    ],
    "paper.py": ["--size", "tiny", "--repeats", "2", "--looped-leapfrog"],
    "dense_products.py": [
        "--dims",
        "2",
        "12",
        "--elements",
        "2000",
        "--banana-steps",
        "64",
    ],
    "parallel_warmup.py": [
        "--models",
        "eight_schools",
        "--chains",
        "4",
        "--windows",
        "8",
        "8",
        "--num-warmup",
        "16",
        "--draws",
        "16",
        "--sweep",
        "0",
    ],
    "first_run_phases.py": [
        "--chains",
        "2",
        "--num-warmup",
        "20",
        "--block-size",
        "16",
    ],
    "convergence_check.py": ["--shapes", "16x64x3", "--repeats", "1"],
    "window_end.py": [
        "--models",
        "eight_schools",
        "--chains",
        "1",
        "2",
        "--warmup",
        "20",
        "--repeats",
        "1",
    ],
    "many_chains.py": [
        "--models",
        "eight_schools",
        "--chains",
        "1",
        "2",
        "--block-sizes",
        "16",
        "--warmup",
        "20",
    ],
    "jacobian_dim.py": [
        "--cases",
        "banana",
        "gaussian",
        "--dims",
        "2",
        "--kernels",
        "mala",
        "--T",
        "32",
        "--banana-T",
        "64",
        "--num-warmup",
        "20",
        "--keys",
        "1",
    ],
}
# scripts that write a folder of JSON files (``--out DIR``) instead of one file
WRITES_FOLDER = {"make_references.py"}
# scripts that are not benchmarks run on their own
HELPERS = {
    "_counts.py",
    "_setup.py",
    "_hmc_setup.py",
    "_scaling_kernel.py",
    "common.py",
    "models.py",
    "plot.py",
    "__init__.py",
}
# the race and its modules: tests/test_race_smoke.py runs them;
# end_to_end.py: tests/test_benchmarks_e2e_smoke.py
TESTED_ELSEWHERE = {"race.py", "race_samplers.py", "gym_models.py", "end_to_end.py"}


# the default run keeps the scripts of the headline tables (suite.py here;
# end_to_end.py, race.py and scaling.py) and make_references.py; the other
# studies, each a minute or two of compilation on two cores, run with
# `-m bench`
BENCH_ONLY = {
    "ablation.py",
    "compile_options.py",
    "compile_profile.py",
    "dense_products.py",
    "driver_overhead.py",
    "first_run_phases.py",
    "hmc_formulations.py",
    "hmc_tuning.py",
    "hmc_vs_mala.py",
    "iteration_cost.py",
    "jacobian_dim.py",
    "many_chains.py",
    "method_auto.py",
    "paper.py",
    "parallel_warmup.py",
    "trajectory_length.py",
    "vectorized_chains.py",
    "warmup_cost.py",
    "window_end.py",
}


def test_paper_looped_leapfrog_keeps_the_loop_deerhmc_writes_out(monkeypatch):
    """``paper.py --looped-leapfrog`` compares against the loop: its kernel
    keeps it where ``DEERHMC`` writes the banana's 8 steps out."""
    import numpyro_deer.infer.hmc as hmc_module
    from benchmarks.paper import banana_potential, looped
    from numpyro_deer import DEERHMC

    monkeypatch.setattr(hmc_module, "on_cpu", lambda: False)
    kernel = DEERHMC(potential_fn=banana_potential, num_steps=8)
    assert kernel.transition.unroll
    assert not looped(kernel).transition.unroll
    assert kernel.transition.num_steps == 8


@pytest.mark.parametrize("backend", ["numpyro", "jax"])
def test_min_ess_of_antithetic_chains_is_bounded_not_negative(backend):
    """The benchmarks' ESS bounds the autocorrelation time as the package's
    check does: an antithetic AR(1) chain (coefficient -0.9) gets ``S log10
    S``, not NumPyro's negative estimate; a positively correlated one keeps
    NumPyro's (coefficient 0.9: about S / 19)."""
    from numpyro.diagnostics import effective_sample_size

    from benchmarks.common import min_ess

    rng = np.random.default_rng(2)
    size = 4000
    x = np.zeros((2, 2, size))
    noise = rng.standard_normal((2, 2, size))
    for t in range(1, size):
        x[:, :, t] = np.array([[-0.9], [0.9]]) * x[:, :, t - 1] + noise[:, :, t]
    anti, slow = x[0][..., None], x[1][..., None]  # (chains, draws, 1)
    got = min_ess({"a": anti}, backend=backend)["min_ess"]
    assert got == pytest.approx(2 * size * np.log10(2 * size), rel=1e-4)
    got = min_ess({"a": slow}, backend=backend)["min_ess"]
    assert got == pytest.approx(float(effective_sample_size(slow)[0]), rel=1e-3)
    assert 200 < got < 2 * size / 10


def test_every_benchmark_script_is_tested():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")} - HELPERS - TESTED_ELSEWHERE
    assert scripts == set(CASES)
    assert BENCH_ONLY <= set(CASES)


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(s, marks=pytest.mark.bench) if s in BENCH_ONLY else s
        for s in sorted(CASES)
    ],
)
def test_benchmark_runs_at_a_tiny_size(script, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH")) if p
    )
    out = tmp_path / "out.json"
    output = ["--json", str(out)]
    if script in WRITES_FOLDER:
        output = ["--out", str(tmp_path)]
        out = tmp_path / "eight_schools.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *CASES[script], *output],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result_json = json.loads(out.read_text())
    assert result_json
    if script == "paper.py":  # DEER gives the sequential chain (float32)
        rows = result_json["rows"]
        deer = [r for r in rows if r["variant"].startswith("deer")]
        # banana and two MALA lengths, each with the default and the full Jacobian
        assert len(deer) == 6 and all(r["finite"] for r in rows)
        assert all(r["max_abs_diff"] < 0.05 for r in deer), deer
        # two timed runs after the first, the median their mean
        for r in rows:
            assert len(r["second_s_all"]) == 2
            assert r["second_s"] == pytest.approx(np.mean(r["second_s_all"]))
    if script == "jacobian_dim.py":  # each strategy on the same tape
        rows = result_json["rows"]
        assert [(r["case"], r["jacobian"]) for r in rows] == [
            (case, jacobian)
            for case in ("banana", "gaussian")
            for jacobian in ("stochastic", "full")
        ]
        assert all(r["finite"] and r["its"] >= 1 for r in rows)
        assert all(r["max_diff"] < 0.05 for r in rows), rows
    if script == "dense_products.py":  # both ways of the products, each case
        rows = result_json["rows"]
        ways = [(r["case"], r["D"], r["products"]) for r in rows]
        scans = [
            [("scan", dim, "elementwise"), ("scan", dim, "matrix")]
            + [("scan_diagonal", dim, "-")]
            for dim in (2, 12)
        ]
        banana = [("banana", 2, "elementwise"), ("banana", 2, "matrix")]
        assert ways == scans[0] + scans[1] + banana
        assert all(r["run_s"] > 0 and r["compile_s"] > 0 for r in rows)
    if script == "first_run_phases.py":  # one row, its phases timed
        (row,) = result_json["rows"]
        assert 0 < row["warmup_compile_s"] <= row["warmup_s"]
        assert 0 < row["block_again_s"] and row["warmup_compiles"]
    if script == "many_chains.py":
        rows = result_json["rows"]
        assert [r["status"] for r in rows] == ["ok"] * 4, rows
        # (min_ess of 16 draws per chain can be None: not finite)
        assert all(r["draws_per_s"] > 0 for r in rows)
        assert all(0 < r["critical_path_gradients"] <= r["gradients"] for r in rows), (
            rows
        )
    if script == "suite.py":  # plot.py draws the suite's JSON
        png = tmp_path / "speedup.png"
        plot = subprocess.run(
            [sys.executable, str(BENCHMARKS / "plot.py"), str(out), "-o", str(png)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert plot.returncode == 0, plot.stdout[-3000:] + plot.stderr[-3000:]
        assert png.stat().st_size > 0
