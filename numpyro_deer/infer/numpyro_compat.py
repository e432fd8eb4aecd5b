"""Every reliance on NumPyro internals, in one place.

The block driver reuses private pieces of ``numpyro.infer.mcmc``: the collection
parameters of an ``MCMC`` object and the field-collecting transform. They are
stable across NumPyro 0.21 and 0.22 (the versions this package is tested
with). :func:`check_mcmc_internals` verifies
them once and fails with a clear error if a NumPyro release changes them.
"""

from __future__ import annotations

import numpyro
from numpyro.infer import mcmc as _mcmc

_MISSING_HELP = (
    "numpyro_deer.MCMC relies on internals of numpyro.infer.MCMC that NumPyro "
    "{version} does not provide ({what}). numpyro_deer is tested with NumPyro "
    "0.21 and 0.22: install one of those, or use numpyro.infer.MCMC with "
    "DEERMALA (same draws, one draw per loop iteration, slower)."
)


def check_mcmc_internals(mcmc: _mcmc.MCMC) -> None:
    """Raise ``RuntimeError`` if the internals the driver uses are missing."""
    missing = [
        name
        for name in ("_collection_params", "_warmup_state")
        if not hasattr(mcmc, name)
    ]
    if not hasattr(_mcmc, "_collect_and_postprocess"):
        missing.append("numpyro.infer.mcmc._collect_and_postprocess")
    params = getattr(mcmc, "_collection_params", {})
    missing += [
        f"_collection_params[{key!r}]"
        for key in ("lower", "upper", "phase", "collection_size")
        if key not in params
    ]
    if missing:
        raise RuntimeError(
            _MISSING_HELP.format(version=numpyro.__version__, what=", ".join(missing))
        )


def collection_params(mcmc: _mcmc.MCMC) -> tuple[int, int, int | None, str | None]:
    """``(lower, upper, collection_size, phase)`` of the current ``run``."""
    params = mcmc._collection_params
    return params["lower"], params["upper"], params["collection_size"], params["phase"]


def run_phase(mcmc: _mcmc.MCMC) -> str | None:
    """``"warmup"`` while ``MCMC.warmup`` runs (it calls ``run``), else the
    phase of the collection parameters (``None`` if NumPyro has none)."""
    return getattr(mcmc, "_collection_params", {}).get("phase")


def collect_transform(postprocess, collect_fields, remove_sites):
    """NumPyro's transform from ``(state, *args)`` to the collected fields."""
    return _mcmc._collect_and_postprocess(postprocess, collect_fields, remove_sites)


def has_post_warmup_state(mcmc: _mcmc.MCMC) -> bool:
    return mcmc._warmup_state is not None
