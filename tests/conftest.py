"""Session-wide test configuration.

The environment variables below must be set before JAX is first imported, so
this block stays at the very top of the file:

* ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` exposes eight CPU
  devices, so ``chain_method="parallel"`` can be tested without accelerators.
  The flag is appended to any ``XLA_FLAGS`` already set.
* ``JAX_PLATFORMS=cpu`` unless the caller chose a platform; run the ``gpu``
  tests with e.g. ``JAX_PLATFORMS=cuda python -m pytest -m gpu``.
* On the CPU, ``--xla_backend_optimization_level=0``: the suite's time is
  almost all XLA compilation of small programs that run for milliseconds;
  LLVM's optimisation of them roughly halves a run's wall time when skipped,
  and changes no result the tests compare (the float64 draws were identical
  to every digit). Benchmarks and users compile at the default level.
  Likewise ``--xla_cpu_use_fusion_emitters=false`` (jaxlib 0.10; later jaxlibs
  do not know it): XLA's older loop emitters
  for its fusions compile faster (a test file's time falls by 15 to 30 %),
  with the same draws (``test_pinned_draws.py``); a test that needs two
  programs compiled apart to agree bit for bit compiles with the default
  emitters (``compiler_options``), as users run.

Float64 is enabled for the whole test session (never in the package itself):
tests compare DEER against the sequential chain, and in float32 an accept
decision within rounding of its threshold can make two valid chains part ways.
"""

import os
from importlib.metadata import version


def _jaxlib_version() -> tuple[int, ...]:
    """jaxlib's ``(major, minor)``, read before jax initialises XLA."""
    return tuple(int(part) for part in version("jaxlib").split(".")[:2])


_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
_xla_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _xla_flags:
    os.environ["XLA_FLAGS"] = f"{_xla_flags} {_DEVICE_COUNT_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",)
# jaxlib 0.12 no longer knows the emitters' flag (XLA aborts on an unknown
# flag); it was measured with jaxlib 0.10
if _jaxlib_version() < (0, 11):
    _FAST_COMPILE_FLAGS += ("--xla_cpu_use_fusion_emitters=false",)
if os.environ["JAX_PLATFORMS"] == "cpu" and "optimization_level" not in _xla_flags:
    os.environ["XLA_FLAGS"] += " " + " ".join(_FAST_COMPILE_FLAGS)

import jax  # noqa: E402
import pytest  # noqa: E402
from numpyro.util import set_rng_seed  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _seed_global_rngs() -> None:
    """Seed NumPy's and Python's global generators before every test."""
    set_rng_seed(0)


@pytest.fixture(scope="session")
def stock_run():
    """One stock ``numpyro.infer.MCMC`` run of DEERMALA, shared by several modules.

    ``helpers.STOCK_RUN_CONFIG``: thinning 3, extra fields, 150 warmup and 384
    sampling iterations, blocks of 64.
    """
    from numpyro.infer import MCMC as StockMCMC

    from benchmarks.models import gaussian_mean_model
    from numpyro_deer import DEERMALA

    from .helpers import STOCK_RUN_CONFIG, gaussian_data

    args, kwargs = gaussian_data(3.0)
    kernel = DEERMALA(
        gaussian_mean_model, block_size=STOCK_RUN_CONFIG["block_size"], method="deer"
    )
    mcmc = StockMCMC(kernel, **STOCK_RUN_CONFIG["mcmc"], progress_bar=False)
    mcmc.run(
        jax.random.PRNGKey(0), *args, **kwargs, extra_fields=STOCK_RUN_CONFIG["extra"]
    )
    return mcmc, args, kwargs
