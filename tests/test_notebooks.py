"""The notebooks in ``notebooks/`` run, and are committed without outputs.

Each notebook is executed with nbclient in a ``python3`` kernel of the Python
running the tests, with ``NUMPYRO_DEER_NB_SMALL=1`` so that it picks tiny
sizes. A cell that raises fails the test.
"""

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL_VARIABLE = "NUMPYRO_DEER_NB_SMALL"


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"tutorial.ipynb", "gpu.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    notebook = json.loads(path.read_text())
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell["outputs"] == [], f"{path.name}: cell {index} has outputs"
        assert cell["execution_count"] is None, f"{path.name}: cell {index}"
    source = "".join("".join(cell["source"]) for cell in notebook["cells"])
    assert SMALL_VARIABLE in source, f"{path.name} does not read {SMALL_VARIABLE}"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Environment whose ``python3`` kernel is this interpreter.

    A kernelspec on ``JUPYTER_PATH`` takes precedence over any ``python3``
    kernel installed for the user or the system.
    """
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    pythonpath = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    return {
        "JUPYTER_PATH": str(spec_dir.parent.parent),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONPATH": pythonpath,
        SMALL_VARIABLE: "1",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, kernel_env, monkeypatch):
    for name, value in kernel_env.items():
        monkeypatch.setenv(name, value)
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors
