"""The step test every solver applies, the front it gives, and selection.

Step ``t`` of a block passes when ``|s_t - F_t| <= atol + rtol |F_t|`` in
every coordinate, with ``F_t = f_t(s_{t-1})`` evaluated at the current
iterate. The *front* is the number of leading steps that pass: those states
are the chain (each was checked against its passing predecessor), which is
what the solvers certify (:mod:`numpyro_deer.core.newton`) and what the
sharded solver finds across devices (:mod:`numpyro_deer.core.sharded`).
Selection between two pytrees, by row (:func:`where_rows`) or whole
(:func:`tree_where`), is here too: the solvers, the warmup and the Hessian
mass matrix all use it.
"""

from __future__ import annotations

from typing import Any

import jax
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


def where_rows(mask: Array, new: Any, old: Any) -> Any:
    """Per leading-axis row: ``new`` where ``mask`` (shape ``(T,)``), else ``old``.

    ``new`` and ``old`` are pytrees of arrays with leading axis ``T`` and any
    trailing shape.
    """

    def select(a, b):
        return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(select, new, old)


def tree_where(pred: Array | bool, new: Any, old: Any) -> Any:
    """``new`` where ``pred``, else ``old``, leaf by leaf (``jnp.where``).

    ``pred`` broadcasts against every leaf (a scalar selects whole trees);
    selection by a ``(T,)`` row mask is :func:`where_rows`.
    """
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def finite_or_fixed_point(new: Array, values: Array, cur: Array) -> Array:
    """Rows of the Newton update ``new`` that are not finite take ``F_t``.

    A Newton step can overflow beyond the front (a dense Jacobian with huge
    entries in a funnel, say). Such rows take the plain fixed-point update
    ``values = F_t`` instead (or keep ``cur`` if ``F_t`` is not finite either),
    so the solve goes on; the front logic is unaffected.
    """
    row_ok = jnp.all(jnp.isfinite(new), axis=-1)
    values_ok = jnp.all(jnp.isfinite(values), axis=-1)
    return where_rows(row_ok, new, where_rows(values_ok, values, cur))
