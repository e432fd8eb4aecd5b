"""Smoke test of ``benchmarks/end_to_end.py``: one model, tiny sizes, first runs only.

The script starts its own fresh processes; here it must exit with 0, write its
JSON with the first run split into compile and execution (the compile time
measured through ``jax.monitoring``, so it is positive), and print its table.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# tests of benchmarks/, not of the package: a CI job of their own
pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[1]


def test_end_to_end_quick(tmp_path):
    out = tmp_path / "e2e.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "end_to_end.py"),
            "--quick",
            "--models",
            "eight_schools",
            "--methods",
            "sequential",
            "--first-only",
            "--no-cache",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["method"]) for r in rows] == [
        ("eight_schools", "sequential")
    ]
    first = rows[0]["first"]
    assert "error" not in rows[0]
    assert first["compiles"] > 0 and first["compile_s"] > 0
    assert 0 < first["compile_s"] <= first["wall_s"]
    assert first["backend_compile_s"] <= first["compile_s"]
    assert rows[0]["min_ess"] > 0
    assert "min ESS" in proc.stdout
