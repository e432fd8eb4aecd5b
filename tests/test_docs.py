"""The documentation site builds with ``mkdocs build --strict``.

Strict mode turns every warning into an error: a broken link, a page missing
from the nav, a docstring that mkdocstrings cannot render, a missing snippet
(``CHANGELOG.md``). Needs the ``test`` extra (mkdocs-material, mkdocstrings).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpyro_deer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_api_page_documents_every_public_name():
    documented = set(
        re.findall(r"^::: numpyro_deer\.(\w+)\s*$", (DOCS / "api.md").read_text(), re.M)
    )
    assert set(numpyro_deer.__all__) <= documented


def test_newton_figure_is_committed_and_used():
    assert (DOCS / "figures" / "newton_iterates.png").is_file()
    assert "figures/newton_iterates.png" in (DOCS / "how-deer-works.md").read_text()


def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    site = tmp_path / "site"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    api = (site / "api" / "index.html").read_text()
    assert 'id="numpyro_deer.DEERMALA"' in api
    changelog = (site / "changelog" / "index.html").read_text()
    assert "Unreleased" in changelog
