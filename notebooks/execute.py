"""Execute the notebooks and store their outputs in place.

    python notebooks/execute.py                  # both notebooks, their own sizes
    python notebooks/execute.py --small          # tiny sizes (what the tests run)
    python notebooks/execute.py notebooks/gpu.ipynb --check   # run, write nothing

The notebooks are committed with their outputs, so that they can be read on a
repository page; this script is how those outputs are made. Each notebook runs
with nbclient in a ``python3`` kernel of the interpreter running this script,
with the repository root on ``PYTHONPATH`` (the working tree's package, whether
or not it is installed) and the notebook's folder as working directory. With
``--small`` (or ``NUMPYRO_DEER_NB_SMALL=1`` in the environment) the notebooks
pick tiny sizes. A cell that raises stops the run with a non-zero exit status,
and the notebook is not written.

Needs the ``docs`` or ``test`` extra (nbclient, nbformat, ipykernel).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))
SMALL_VARIABLE = "NUMPYRO_DEER_NB_SMALL"


@contextmanager
def kernel_environment(small: bool) -> Iterator[None]:
    """Point the ``python3`` kernel at this interpreter and the working tree.

    A kernelspec on ``JUPYTER_PATH`` takes precedence over any ``python3``
    kernel installed for the user or the system. The kernel inherits this
    process's environment, so the variables are set here and restored after.
    """
    with tempfile.TemporaryDirectory() as jupyter:
        spec_dir = Path(jupyter) / "kernels" / "python3"
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [
                sys.executable,
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
            ],
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        pythonpath = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
        )
        update = {
            "JUPYTER_PATH": jupyter,
            "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONPATH": pythonpath,
        }
        if small:
            update[SMALL_VARIABLE] = "1"
        saved = {name: os.environ.get(name) for name in update}
        os.environ.update(update)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def execute(path: Path, *, small: bool, timeout: int = 1800):
    """Run every cell of the notebook at ``path``; return the executed notebook.

    Raises ``nbclient.exceptions.CellExecutionError`` on the first cell that
    raises.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    with kernel_environment(small):
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()
    # the stored notebook names a generic kernel, not this script's temporary one
    notebook.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=NOTEBOOKS)
    parser.add_argument(
        "--small",
        action="store_true",
        default=os.environ.get(SMALL_VARIABLE, "0") == "1",
        help=f"tiny sizes (also set by {SMALL_VARIABLE}=1)",
    )
    parser.add_argument(
        "--check", action="store_true", help="run the notebooks, write nothing"
    )
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)

    import nbformat

    for path in args.notebooks:
        start = time.perf_counter()
        notebook = execute(path.resolve(), small=args.small, timeout=args.timeout)
        elapsed = time.perf_counter() - start
        if not args.check:
            nbformat.write(notebook, path)
        action = "checked" if args.check else "written"
        size = "small" if args.small else "default"
        print(f"{path}: {action} ({size} sizes, {elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
