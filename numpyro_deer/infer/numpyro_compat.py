"""Every reliance on NumPyro internals, in one place.

The block driver reuses private pieces of ``numpyro.infer.mcmc``: the collection
parameters of an ``MCMC`` object and the field-collecting transform. They are
stable across NumPyro 0.21 and 0.22 (the versions this package is tested
with). :func:`check_mcmc_internals` verifies
them once and fails with a clear error if a NumPyro release changes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import jax
import numpy as np
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
        for name in (
            "_collection_params",
            "_warmup_state",
            "_states",
            "_states_flat",
            "_get_states_flat",
        )
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


def set_flat_states(mcmc: _mcmc.MCMC, states: dict) -> None:
    """``states`` as the run's flat collected fields (what
    ``get_samples()`` returns), where NumPyro would otherwise take them from
    its chain-grouped copy by an eager reshape per field."""
    mcmc._states_flat = states


def has_post_warmup_state(mcmc: _mcmc.MCMC) -> bool:
    return mcmc._warmup_state is not None


@contextmanager
def chains_first_on_the_host(mcmc: _mcmc.MCMC, block_kernel: bool) -> Iterator[None]:
    """Within it, ``mcmc.run`` of vectorized chains of a block kernel
    (``block_kernel``) puts the chain axis of the collected draws first by a
    transpose on the host, not by NumPyro's eager ``jnp.swapaxes`` of each
    field, an XLA compile per field and shape the first time (0.15 to 0.38 s
    each on an H100, about 0.1 s on a CPU). It passes NumPyro a callable
    ``chain_method`` (its documented form, a transform like ``jax.vmap``)
    that runs the batched run function as ``"vectorized"`` does and returns
    the draws chains first; the draws come back to the device they were on.
    Elsewhere (one chain, other chain methods, arrays over several devices)
    it changes nothing.
    """
    if not block_kernel or mcmc.chain_method != "vectorized" or mcmc.num_chains < 2:
        yield
        return
    mcmc.chain_method = _vectorized_chains_first
    try:
        yield
    finally:
        mcmc.chain_method = "vectorized"


def _vectorized_chains_first(run_chains):
    def run(map_args):
        states, last_state = run_chains(map_args)
        return jax.tree.map(_chains_first, states), last_state

    return run


def _chains_first(x):
    """``x`` (draws, chains, ...) as (chains, draws, ...), on its device."""
    return _on_the_host(
        x,
        lambda a: np.ascontiguousarray(np.swapaxes(a, 0, 1)),
        lambda a: jax.numpy.swapaxes(a, 0, 1),
    )


def flat_states_on_the_host(mcmc: _mcmc.MCMC) -> None:
    """Set NumPyro's flat draws (what ``get_samples()`` returns) from its
    chain-grouped ones by a reshape on the host, where NumPyro would reshape
    each field eagerly on its device, an XLA compile per field and shape the
    first time (about 0.04 s each on an H100, 0.1 s of a first call with three
    sites). Nothing to do once set or before a run."""
    if mcmc._states_flat is not None or mcmc._states is None:
        return

    def merge(x):
        shape = (x.shape[0] * x.shape[1],) + x.shape[2:]

        def reshape(a):  # numpy's and jax's alike
            return a.reshape(shape)

        return _on_the_host(x, reshape, reshape)

    set_flat_states(mcmc, jax.tree.map(merge, mcmc._states))


def _on_the_host(x, host_fn, device_fn):
    """``host_fn`` of ``x`` in numpy, the result back on ``x``'s device;
    ``device_fn`` for what numpy cannot hold (tracers, key arrays, arrays
    over several devices)."""
    on_one_device = (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and len(x.devices()) == 1
    )
    if not on_one_device or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return device_fn(x)
    return jax.device_put(host_fn(np.asarray(x)), next(iter(x.devices())))
