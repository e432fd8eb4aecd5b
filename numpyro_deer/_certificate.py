"""The step test every solver applies, and the front it gives.

Step ``t`` of a block passes when ``|s_t - F_t| <= atol + rtol |F_t|`` in
every coordinate, with ``F_t = f_t(s_{t-1})`` evaluated at the current
iterate. The *front* is the number of leading steps that pass: those states
are the chain (each was checked against its passing predecessor), which is
what the solvers certify (:mod:`numpyro_deer._newton`), what the sharded
solver finds across devices (:mod:`numpyro_deer._sharded`) and where the
coupled segments' repair passes restart (:mod:`numpyro_deer._sweep`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def step_passes(cur: Array, values: Array, atol: float, rtol: float) -> Array:
    """Which rows of ``cur`` (``(T, D)``) pass against ``values = F_t``.

    Returns:
        ``(passed, error)``: a ``(T,)`` bool array and ``|cur - values|``.
    """
    error = jnp.abs(cur - values)
    return jnp.all(error <= atol + rtol * jnp.abs(values), axis=-1), error


def leading_passed(passed: Array) -> Array:
    """The number of leading ``True`` entries of ``passed`` (the front)."""
    return jnp.sum(jnp.cumprod(passed.astype(jnp.int32)), dtype=jnp.int32)
