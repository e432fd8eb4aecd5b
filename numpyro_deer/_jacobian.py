"""Jacobian strategies: how each Newton iteration linearises the step ``f_t``.

Every strategy evaluates, for all steps of a window in parallel, the step value
``f_t(s_{t-1})`` together with an approximation ``J_t`` of its Jacobian, and
names the structure of ``J_t`` that the associative scan uses:

* :class:`FullJacobian` -- dense ``J_t`` by ``D`` forward-mode products
  (``jax.jvp`` on the basis vectors); DEER proper (Lim et al., 2024).
  ``O(D^2)`` memory and ``O(D^3)`` scan work per step: small ``D`` only.
* :class:`DiagonalJacobian` -- the exact diagonal of ``J_t`` (also ``D``
  products); quasi-DEER (Gonzalez et al., 2024).
* :class:`StochasticDiagonalJacobian` -- Hutchinson's estimate
  ``diag(J) ~ mean_p z_p * (J z_p)`` with Rademacher probes ``z_p``
  (Zoltowski et al., 2025): one ``jax.jvp`` per probe returns ``f_t`` and
  ``J_t z_p`` together, so the cost does not grow with ``D``.

The step value comes from the same ``jax.jvp`` call as the tangents, so no
strategy evaluates ``f_t`` twice. Whatever ``J_t`` is, the Newton solver stays
exact (it only changes how fast it converges).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from ._scan import scan_dense, scan_diagonal

StepFn = Callable[[Array, Any], tuple[Array, Any]]


class Linearization(NamedTuple):
    """The step evaluated and linearised at every state of a window.

    Attributes:
        values: ``f_t(s_{t-1})``, shape ``(W, D)``.
        aux: the step's info for each ``t`` (leading axis ``W``).
        jacobian: ``J_t``, shape ``(W, D)`` (diagonal) or ``(W, D, D)``.
    """

    values: Array
    aux: Any
    jacobian: Array


def _jvp_columns(step_fn: StepFn, x: Array, tape_t: Any, directions: Array):
    """``f(x)`` once and ``J v`` for each row ``v`` of ``directions``."""

    def push(v):
        return jax.jvp(lambda s: step_fn(s, tape_t), (x,), (v,))

    (value, aux), (tangents, _) = jax.vmap(push, out_axes=((None, None), (0, 0)))(
        directions
    )
    return value, aux, tangents


def _on_basis(
    step_fn: StepFn, prev: Array, tape: Any, reduce: Callable[[Array], Array]
) -> Linearization:
    """Every step's value and ``reduce`` of its ``D`` basis-vector JVPs."""
    eye = jnp.eye(prev.shape[-1], dtype=prev.dtype)

    def one(x, tape_t):
        value, aux, columns = _jvp_columns(step_fn, x, tape_t, eye)
        return value, aux, reduce(columns)

    return Linearization(*jax.vmap(one)(prev, tape))


def _clip(diag: Array, clip: float | None) -> Array:
    return diag if clip is None else jnp.clip(diag, -clip, clip)


def _check_clip(name: str, clip: float | None) -> None:
    if clip is not None and not clip > 0:
        raise ValueError(f"{name}(clip={clip!r}): clip must be None or positive.")


def _spectral_norm(matrix: Array, num_iter: int = 20) -> Array:
    """Largest singular value of a small square matrix by power iteration."""
    dim = matrix.shape[-1]
    v = jnp.ones((dim,), matrix.dtype) / jnp.sqrt(jnp.asarray(dim, matrix.dtype))

    def body(_, v):
        w = matrix.T @ (matrix @ v)
        return w / jnp.maximum(jnp.linalg.norm(w), 1e-30)

    v = jax.lax.fori_loop(0, num_iter, body, v)
    return jnp.linalg.norm(matrix @ v)


def _clip_norm(jacobian: Array, clip: float | None) -> Array:
    """Scale a dense ``J`` so that its spectral norm is at most ``clip``."""
    if clip is None:
        return jacobian
    norm = _spectral_norm(jacobian)
    return jacobian * jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-30))


@dataclass(frozen=True)
class FullJacobian:
    """The dense Jacobian of every step (full DEER).

    Attributes:
        clip: if set, each ``J_t`` whose spectral norm (largest singular
            value, by 20 power iterations on ``J^T J``) exceeds ``clip`` is
            scaled down to norm ``clip``. Where the posterior is not
            log-concave, an accepted MALA step can expand
            (``||I - eps M H|| > 1``) and a product of thousands of such
            Jacobians overflows the linear recursion; with ``clip=1`` every
            product stays bounded, at the price of a Jacobian that is no longer
            exact on those steps. A contracting step (the log-concave case at a
            stable step size) is left exact. ``None`` (the default) keeps every
            ``J_t`` exact.
        precision: precision of the ``D x D`` products in the associative scan
            (a :class:`jax.lax.Precision` name such as ``"default"`` or
            ``"highest"``); ``None`` (the default) follows
            ``jax.default_matmul_precision``, which ``DEERMALA`` sets to
            ``"highest"``. The scan only solves the Newton step's linear
            system, so a cheaper product (TF32 on a GPU with ``"default"``)
            changes how fast the iterations converge, never the converged
            chain, whose residual is the step evaluated at full precision.
    """

    clip: float | None = None
    precision: str | None = None
    structure: ClassVar[str] = "dense"

    def __post_init__(self):
        _check_clip("FullJacobian", self.clip)
        if self.precision is not None:
            try:
                jax.lax.Precision(self.precision)
            except ValueError:
                raise ValueError(
                    f"FullJacobian(precision={self.precision!r}): use None or a "
                    "jax.lax.Precision name: 'default', 'high' or 'highest'."
                ) from None

    def linearize(self, step_fn: StepFn, prev: Array, tape: Any, key: Array):
        del key
        # row i of `columns` is J e_i
        return _on_basis(
            step_fn, prev, tape, lambda columns: _clip_norm(columns.T, self.clip)
        )

    def scan(self, A: Array, b: Array) -> Array:
        return scan_dense(A, b, self.precision)


@dataclass(frozen=True)
class DiagonalJacobian:
    """The exact diagonal of every step's Jacobian (quasi-DEER).

    Attributes:
        clip: if set, the diagonal is clipped to ``[-clip, clip]``.
    """

    clip: float | None = None
    structure: ClassVar[str] = "diagonal"

    def __post_init__(self):
        _check_clip("DiagonalJacobian", self.clip)

    def linearize(self, step_fn: StepFn, prev: Array, tape: Any, key: Array):
        del key
        return _on_basis(
            step_fn, prev, tape, lambda columns: _clip(jnp.diagonal(columns), self.clip)
        )

    @staticmethod
    def scan(A: Array, b: Array) -> Array:
        return scan_diagonal(A, b)


@dataclass(frozen=True)
class StochasticDiagonalJacobian:
    """Hutchinson's estimate of the diagonal with Rademacher probes.

    Attributes:
        num_probes: probes per step and iteration; the estimate's variance falls
            as ``1 / num_probes``.
        clip: if set, the estimate is clipped to ``[-clip, clip]``; a MALA
            step's exact diagonal lies in ``[-1, 1]`` far from its accept
            threshold, and the clip removes the estimator's outliers.
    """

    num_probes: int = 1
    clip: float | None = 1.0
    structure: ClassVar[str] = "diagonal"

    def __post_init__(self):
        if not (isinstance(self.num_probes, int) and self.num_probes >= 1):
            raise ValueError(
                f"StochasticDiagonalJacobian(num_probes={self.num_probes!r}): "
                "num_probes must be a positive integer."
            )
        _check_clip("StochasticDiagonalJacobian", self.clip)

    def linearize(self, step_fn: StepFn, prev: Array, tape: Any, key: Array):
        num_steps, dim = prev.shape
        # Rademacher signs from raw bits: one threefry call, cheap to compile
        bits = jax.random.bits(key, (num_steps, self.num_probes, dim), jnp.uint8)
        probes = jnp.where(bits & 1, 1.0, -1.0).astype(prev.dtype)

        def one(x, tape_t, z):
            value, aux, jz = _jvp_columns(step_fn, x, tape_t, z)
            return value, aux, _clip(jnp.mean(z * jz, axis=0), self.clip)

        return Linearization(*jax.vmap(one)(prev, tape, probes))

    @staticmethod
    def scan(A: Array, b: Array) -> Array:
        return scan_diagonal(A, b)


JacobianStrategy = FullJacobian | DiagonalJacobian | StochasticDiagonalJacobian


def jacobian_from_name(name: str | JacobianStrategy, **options) -> JacobianStrategy:
    """Turn ``"full"``, ``"diag"`` or ``"stochastic"`` into a strategy object."""
    if not isinstance(name, str):
        return name
    strategies = {
        "full": FullJacobian,
        "diag": DiagonalJacobian,
        "stochastic": StochasticDiagonalJacobian,
    }
    if name not in strategies:
        raise ValueError(
            f"jacobian={name!r} is not a Jacobian strategy: use one of "
            f"{sorted(strategies)} or a strategy object such as "
            "StochasticDiagonalJacobian(num_probes=2)."
        )
    return strategies[name](**options)
