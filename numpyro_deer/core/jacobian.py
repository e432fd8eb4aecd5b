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
* :class:`AutoJacobian` -- the dense Jacobian up to a dimension, Hutchinson's
  diagonal above (the default of :class:`~numpyro_deer.DEERSolver`), resolved
  to one of them where the state's dimension is known (:func:`resolve_jacobian`).

The step value comes from the same ``jax.jvp`` call as the tangents, so no
strategy evaluates ``f_t`` twice. Whatever ``J_t`` is, the Newton solver stays
exact (it only changes how fast it converges).

Each strategy also owns the structure of its ``J_t`` (diagonal or dense): the
product ``J_t x``, the associative scan of the linear recursion, the product of
a slice's transitions (for the sharded solver), and from these the Newton
step itself (:meth:`newton_step`), shared by the single-device and the sharded
solver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import inf
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from .certificate import finite_or_fixed_point
from .scan import matmul, scan_dense, scan_diagonal
from .transition import StepFn, flat_draw


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


class _Structure:
    """The Newton step of a strategy, from its structure's three primitives.

    Subclasses provide ``matvec(J, x)`` (``J_t x_t`` row by row),
    ``zero_rows(J, rows)`` and ``scan(A, b)``, and ``compose(A)`` (``A_L ...
    A_1``) for the sharded solver.
    """

    def newton_step(
        self,
        lin: Linearization,
        prev: Array,
        cur: Array,
        frozen: Array,
        fixed: Array,
        scan: Callable[[Array, Array], Array] | None = None,
    ) -> Array:
        """The Newton update of ``cur`` from the linearisation at ``prev``.

        Solves ``s_t = J_t s_{t-1} + F_t - J_t prev_t`` for all rows at once.
        ``frozen`` rows (certified) map to their own value (``A = 0``,
        ``b = s_t``); ``fixed`` rows (the frozen ones and the first unfrozen
        one, whose predecessor is frozen) have ``A = 0``, so the first
        unfrozen step is ``F_t`` exactly. Rows whose update is not finite take
        ``F_t`` (:func:`~numpyro_deer.core.certificate.finite_or_fixed_point`).

        Args:
            lin: values ``F_t`` and Jacobians ``J_t`` at ``prev``.
            prev, cur: ``s_{t-1}`` and ``s_t`` of the iterate, shape ``(T, D)``.
            frozen, fixed: ``(T,)`` masks as above (``frozen`` within ``fixed``).
            scan: the scan of the affine recursion; default :meth:`scan` (the
                sharded solver passes its two-level scan).
        """
        values, jacobian = lin.values, lin.jacobian
        offset = values - self.matvec(jacobian, prev)
        b = jnp.where(frozen[:, None], cur, jnp.where(fixed[:, None], values, offset))
        A = self.zero_rows(jacobian, fixed)
        new = (self.scan if scan is None else scan)(A, b)
        return finite_or_fixed_point(new, values, cur)


class _DiagonalStructure(_Structure):
    """``J_t`` is a vector ``(D,)``: elementwise products and scan."""

    structure = "diagonal"

    @staticmethod
    def matvec(jacobian: Array, x: Array) -> Array:
        return jacobian * x

    @staticmethod
    def zero_rows(jacobian: Array, rows: Array) -> Array:
        return jnp.where(rows[:, None], 0.0, jacobian)

    def scan(self, A: Array, b: Array) -> Array:
        return scan_diagonal(A, b)

    @staticmethod
    def compose(A: Array) -> Array:
        """``A_L ... A_1``: the transition of a whole slice."""
        return jnp.prod(A, axis=0)


class _DenseStructure(_Structure):
    """``J_t`` is a matrix ``(D, D)``: matrix products and scan."""

    structure = "dense"

    @staticmethod
    def matvec(jacobian: Array, x: Array) -> Array:
        return matmul(jacobian, x)

    @staticmethod
    def zero_rows(jacobian: Array, rows: Array) -> Array:
        return jnp.where(rows[:, None, None], 0.0, jacobian)

    def scan(self, A: Array, b: Array) -> Array:
        return scan_dense(A, b, self.precision)

    @staticmethod
    def compose(A: Array) -> Array:
        """``A_L ... A_1`` by pairwise batched products, ``log2(L)`` levels."""
        while A.shape[0] > 1:
            if A.shape[0] % 2:
                A = jnp.concatenate([A, jnp.eye(A.shape[-1], dtype=A.dtype)[None]])
            # a later step multiplies on the left
            A = matmul(A[1::2], A[0::2])
        return A[0]


def _jvp_columns(step_fn: StepFn, x: Array, tape_t: Any, directions: Array):
    """``f(x)`` once and ``J v`` for each row ``v`` of ``directions``."""

    def push(v):
        return jax.jvp(lambda s: step_fn(s, tape_t), (x,), (v,))

    # + zeros_like(x), the same values: inside shard_map a constant basis
    # does not vary over the mesh axes as x does, which a loop inside the
    # step (HMC's leapfrog) refuses as a tangent carry
    directions = directions + jnp.zeros_like(x)

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
    if clip is not None and not (isinstance(clip, int | float) and 0 < clip < inf):
        raise ValueError(
            f"{name}(clip={clip!r}): use a finite positive number, or None for no "
            "clipping."
        )


def _spectral_norm(matrix: Array, num_iter: int = 20) -> Array:
    """Largest singular value of a small square matrix by power iteration."""
    dim = matrix.shape[-1]
    # like `matrix` (full_like, not ones): inside shard_map the loop carry must
    # vary over the mesh axes as the matrix does
    v = jnp.full_like(matrix[0], 1.0) / jnp.sqrt(jnp.asarray(dim, matrix.dtype))

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
class FullJacobian(_DenseStructure):
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

    clip: float | None = 1.0
    precision: str | None = None

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


@dataclass(frozen=True)
class DiagonalJacobian(_DiagonalStructure):
    """The exact diagonal of every step's Jacobian (quasi-DEER).

    Attributes:
        clip: if set, the diagonal is clipped to ``[-clip, clip]``.
    """

    clip: float | None = 1.0

    def __post_init__(self):
        _check_clip("DiagonalJacobian", self.clip)

    def linearize(self, step_fn: StepFn, prev: Array, tape: Any, key: Array):
        del key
        return _on_basis(
            step_fn, prev, tape, lambda columns: _clip(jnp.diagonal(columns), self.clip)
        )


@dataclass(frozen=True)
class StochasticDiagonalJacobian(_DiagonalStructure):
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

    def __post_init__(self):
        if not (isinstance(self.num_probes, int) and self.num_probes >= 1):
            raise ValueError(
                f"StochasticDiagonalJacobian(num_probes={self.num_probes!r}): "
                "num_probes must be a positive integer."
            )
        _check_clip("StochasticDiagonalJacobian", self.clip)

    def linearize(self, step_fn: StepFn, prev: Array, tape: Any, key: Array):
        num_steps, dim = prev.shape
        # Rademacher signs from raw bits: one flat threefry call, cheap to compile
        shape = (num_steps, self.num_probes, dim)
        bits = flat_draw(jax.random.bits, key, shape, jnp.uint8)
        probes = jnp.where(bits & 1, 1.0, -1.0).astype(prev.dtype)

        def one(x, tape_t, z):
            value, aux, jz = _jvp_columns(step_fn, x, tape_t, z)
            return value, aux, _clip(jnp.mean(z * jz, axis=0), self.clip)

        return Linearization(*jax.vmap(one)(prev, tape, probes))


JacobianStrategy = FullJacobian | DiagonalJacobian | StochasticDiagonalJacobian

AUTO_MAX_FULL_DIM = 2
"""Largest state dimension ``D`` at which :class:`AutoJacobian` takes the
dense Jacobian."""


@dataclass(frozen=True)
class AutoJacobian:
    """The strategy chosen by the dimension ``D`` of the solved state.

    :class:`FullJacobian` (its defaults) for ``D <= max_full_dim``,
    :class:`StochasticDiagonalJacobian` (its defaults) above. The choice is
    made where the block is solved, from the state's shape (:meth:`resolve`),
    so one solver serves models of any size. Where a step's Jacobian is not
    diagonal in the solve basis (a banana's curvature turning along the
    chain), Newton with the exact Jacobian takes far fewer iterations (about
    half on the banana HMC chain of Zoltowski et al., 2025); where it is
    (a Gaussian), as many, each costing ``D`` forward-mode products instead
    of one and a ``D x D`` scan. Beyond ``D = 2`` the products grow with
    ``D``, and the iterations they saved in the measurements (none on
    Gaussians, up to about a fifth on logistic regressions of ``D = 4`` and
    ``8``) do not pay for them (the "Choosing options" page).

    Attributes:
        max_full_dim: the largest ``D`` solved with the dense Jacobian
            (``0``: always Hutchinson's diagonal).
    """

    max_full_dim: int = AUTO_MAX_FULL_DIM

    def __post_init__(self):
        value = self.max_full_dim
        if isinstance(value, bool) or not (isinstance(value, int) and value >= 0):
            raise ValueError(
                f"AutoJacobian(max_full_dim={value!r}): use an integer >= 0, the "
                "largest dimension solved with the full Jacobian."
            )

    def resolve(self, dim: int) -> FullJacobian | StochasticDiagonalJacobian:
        """The strategy for states of dimension ``dim``."""
        if dim <= self.max_full_dim:
            return FullJacobian()
        return StochasticDiagonalJacobian()


def resolve_jacobian(
    strategy: JacobianStrategy | AutoJacobian, dim: int
) -> JacobianStrategy:
    """The strategy that solves states of dimension ``dim``: an
    :class:`AutoJacobian` resolved, any other strategy as it is."""
    if isinstance(strategy, AutoJacobian):
        return strategy.resolve(dim)
    return strategy


def jacobian_from_name(
    name: str | JacobianStrategy | AutoJacobian,
) -> JacobianStrategy | AutoJacobian:
    """``"auto"``, ``"full"``, ``"diag"`` or ``"stochastic"`` as a strategy
    object with its defaults; a strategy object as it is."""
    if isinstance(
        name,
        FullJacobian | DiagonalJacobian | StochasticDiagonalJacobian | AutoJacobian,
    ):
        return name
    strategies = {
        "auto": AutoJacobian,
        "full": FullJacobian,
        "diag": DiagonalJacobian,
        "stochastic": StochasticDiagonalJacobian,
    }
    if not isinstance(name, str) or name not in strategies:
        raise ValueError(
            f"jacobian={name!r} is not a Jacobian strategy: use one of "
            f"{sorted(strategies)} or a strategy object such as "
            "StochasticDiagonalJacobian(num_probes=2)."
        )
    return strategies[name]()
