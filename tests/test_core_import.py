"""The pure-JAX core does not need NumPyro, and the public names say where they live."""

import subprocess
import sys
from pathlib import Path

import numpyro_deer

ROOT = Path(__file__).resolve().parents[1]


def test_core_imports_with_numpyro_blocked():
    code = (
        "import sys; sys.modules['numpyro'] = None\n"
        "import numpyro_deer.core as core\n"
        "from numpyro_deer import DEERSolver\n"
        "assert 'numpyro' not in [m.split('.')[0] for m in sys.modules if "
        "sys.modules[m] is not None]\n"
        "print(core.DEERSolver is DEERSolver)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_public_names_show_the_package_not_a_private_module():
    for name in numpyro_deer.__all__:
        obj = getattr(numpyro_deer, name)
        assert obj.__module__ == "numpyro_deer", (name, obj.__module__)
