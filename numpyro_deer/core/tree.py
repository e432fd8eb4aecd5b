"""Selection between two pytrees of the same structure."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array


def tree_where(pred: Array | bool, new: Any, old: Any) -> Any:
    """``new`` where ``pred``, else ``old``, leaf by leaf (``jnp.where``).

    ``pred`` broadcasts against every leaf (a scalar selects whole trees);
    row-wise selection by a ``(T,)`` mask is
    :func:`~numpyro_deer.core.certificate.where_rows`.
    """
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)
