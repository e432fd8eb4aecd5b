"""Smoke tests of the scripts in ``examples/``.

Each script runs as a subprocess with tiny settings (a few dozen draws, blocks
of 16), as NumPyro's ``test/test_examples.py`` does, and must exit with 0 and
print NumPyro's summary table. Compilation dominates their run time.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TINY = [
    "--num-warmup",
    "20",
    "--num-samples",
    "48",
    "--block-size",
    "16",
    "--no-progress-bar",
]

CASES = {
    "eight_schools.py": [],
    "logistic_regression.py": ["--num-obs", "50", "--num-features", "3"],
    "hierarchical_logistic.py": [
        "--num-obs",
        "60",
        "--num-groups",
        "5",
        "--num-features",
        "2",
    ],
}


def test_every_example_is_tested():
    scripts = [p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")]
    assert sorted(scripts) == sorted(CASES)


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_runs(script):
    env = dict(os.environ)
    # the working tree's package, whether or not it is installed
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH")) if p
    )
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *TINY, *CASES[script]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    header = next(
        (line for line in result.stdout.splitlines() if "r_hat" in line), None
    )
    assert header is not None, output
    assert header.split() == [
        "mean",
        "std",
        "median",
        "5.0%",
        "95.0%",
        "n_eff",
        "r_hat",
    ], header
    assert "Number of divergences" in result.stdout, output
    assert "Newton iterations per block" in result.stdout, output
    if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu":
        # the examples keep the kernel's default method="auto": on the CPU,
        # the sequential scan (the README's quick start shows this)
        assert "method=sequential" in result.stdout, output
