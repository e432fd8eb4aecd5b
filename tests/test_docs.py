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

import yaml

import numpyro_deer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Run names, run ordinals and dates of past measurements belong in
# benchmarks/results/LOG.md, not in the manual.
LOG_PATTERNS = [
    re.compile(r"\brun\d+\b", re.I),
    re.compile(
        r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)"
        r" (ablation )?run\b",
        re.I,
    ),
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),
]
# The changelog page includes CHANGELOG.md, whose older entries are history.
HISTORY_PAGES = {"changelog.md"}


def _nav_pages(nav):
    """The markdown files named anywhere in mkdocs.yml's ``nav``."""
    if isinstance(nav, str):
        return [nav] if nav.endswith(".md") else []
    items = nav.values() if isinstance(nav, dict) else nav
    return [page for item in items for page in _nav_pages(item)]


def test_manual_pages_hold_no_run_log():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = [p for p in _nav_pages(config["nav"]) if p not in HISTORY_PAGES]
    assert "performance.md" in pages
    hits = []
    for path in [ROOT / "README.md"] + [DOCS / p for p in pages]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pattern in LOG_PATTERNS:
                match = pattern.search(line)
                if match:
                    where = f"{path.relative_to(ROOT)}:{number}"
                    hits.append(f"{where}: {match.group(0)!r} in {line.strip()!r}")
    assert not hits, "move run history to benchmarks/results/LOG.md:\n" + "\n".join(
        hits
    )


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


def test_generated_outputs_are_what_the_code_above_prints():
    """``docs/generate_outputs.py`` replaces each marked block, and only those."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "generate_outputs", DOCS / "generate_outputs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    MARKER, generate = module.MARKER, module.generate
    page = (
        "```python\nx = 2\nprint(x)\n```\n\n"
        f"{MARKER}\n```text\nstale\n```\n\n"
        "```text\nuntouched\n```\n\n"
        "```python\nprint(x + 1)\n```\n\n"
        f"{MARKER}\n```text\n```\n\n"
        "```python\nraise AssertionError('after the last marker: not run')\n```\n"
    )
    new = generate(page, "page.md")
    assert f"{MARKER}\n```text\n2\n```" in new
    assert f"{MARKER}\n```text\n3\n```" in new
    assert "untouched" in new and "stale" not in new
