"""The notebooks in ``notebooks/`` run, and are committed with their outputs.

``notebooks/execute.py`` makes the stored outputs (at the notebooks' own
sizes). Here each notebook runs again through that script's ``execute``, with
tiny sizes (``NUMPYRO_DEER_NB_SMALL=1``), in a ``python3`` kernel of the Python
running the tests; a cell that raises fails the test. Nothing is written.
"""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _load_execute_script():
    spec = importlib.util.spec_from_file_location(
        "notebooks_execute", ROOT / "notebooks" / "execute.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


execute_script = _load_execute_script()


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"tutorial.ipynb", "gpu.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_with_outputs(path):
    """Every code cell ran, in order, without an error, at the default sizes."""
    notebook = json.loads(path.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    counts = [cell["execution_count"] for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: {counts}"
    for index, cell in enumerate(code):
        types = {output["output_type"] for output in cell["outputs"]}
        assert "error" not in types, f"{path.name}: code cell {index} has an error"
    source = "".join("".join(cell["source"]) for cell in code)
    assert execute_script.SMALL_VARIABLE in source, path.name
    first = "".join("".join(output.get("text", "")) for output in code[0]["outputs"])
    assert "SMALL=False" in first, f"{path.name} was stored at tiny sizes: {first}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    notebook = execute_script.execute(path, small=True, timeout=600)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors
    first = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert "SMALL=True" in "".join(o.get("text", "") for o in first.outputs)
