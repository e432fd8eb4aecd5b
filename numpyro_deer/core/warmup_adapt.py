r"""The adaptation between windows of a parallel warmup: pooled statistics.

Between two windows of :mod:`numpyro_deer.core.parallel_warmup` the kernel is
adapted from the draws of all chains (:func:`spread` picks evenly spaced ones):

* the metric from the pooled variance or covariance
  (:func:`pooled_inverse_mass`, Stan's and NumPyro's regularisation) or the
  inverse mean Hessian (:func:`hessian_inverse_mass`);
* the step size where the estimated acceptance curve falls through the
  target times its plateau (:func:`acceptance_curve`,
  :func:`choose_step_size`): a few transitions from each pooled draw at each
  candidate step size, side by side;
* chains that accepted nothing in the window restart from another chain's
  draws first (:func:`restart_stuck`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array

from .hessian import inverse_abs_mean_hessian
from .metric import solve_sqrt, whiten
from .transition import PotentialFn, Transition, make_step_fn
from .warmup_cost import CURVE_TRANSITIONS, gradients_per_transition


def _mean(values: Array, valid: Array | None) -> Array:
    """The mean over the leading axis, of the ``valid`` rows only."""
    if valid is None:
        return jnp.mean(values, axis=0)
    keep = valid.reshape(valid.shape + (1,) * (values.ndim - 1))
    return jnp.sum(jnp.where(keep, values, 0.0), axis=0) / jnp.sum(valid)


def acceptance_curve(
    transition: Transition,
    potential_fn: PotentialFn,
    points: Array,
    step_size: Array,
    mass_sqrt: Array | None,
    factors: Array,
    key: Array,
    valid: Array | None = None,
    num_transitions: int = CURVE_TRANSITIONS,
) -> Array:
    r"""Mean acceptance along ``num_transitions`` transitions from ``points``
    at ``step_size * f``.

    From every point the kernel at every candidate step size takes
    ``num_transitions = n`` consecutive transitions on the same tape (common
    random numbers, so the estimated curve is smooth in the step size); the
    estimate is the mean acceptance probability over points and transitions,

    .. math::

        \hat a(\epsilon) = \frac{1}{K n} \sum_{k=1}^{K} \sum_{j=1}^{n}
        \alpha_\epsilon(x_k^{(j-1)}, x_k^{(j)\prime}),
        \qquad x_k^{(0)} = \text{point}_k ,

    what a window at ``epsilon`` accepts along its chains over its first
    ``n`` steps from those points. At stationarity every transition has the
    same mean acceptance, and the path mean estimates the stationary curve
    as one transition does. Off the typical set (chains still moving towards
    it, the first windows) it does not: a first transition from there is
    mostly a large move downhill, which the Metropolis ratio accepts, while
    where it lands the proposals of the same step size overshoot and are
    rejected (the transient phase of MALA needs step sizes of smaller order
    in the dimension than its stationary phase: Christensen, Roberts and
    Rosenthal, 2005, "Scaling limits for the transient phase of local
    Metropolis-Hastings algorithms"). One transition's acceptance then
    overstates what the next window accepts, the step size chosen from it is
    too large, and the chains hardly move; the path mean sees the rejections
    after the first move. A non-finite proposal counts as a rejection.
    ``valid`` (``(K,)`` booleans): the points the mean is over (default
    all). Costs ``n`` dependent transitions and ``K n`` per factor. Returns
    one mean per factor.
    """
    num_points, dim = points.shape
    n = num_transitions
    tape = transition.make_tape(key, num_points * n, dim, points.dtype)
    tape = jax.tree.map(lambda a: a.reshape((n, num_points) + a.shape[1:]), tape)
    potential_w = whiten(potential_fn, mass_sqrt)
    w = jax.vmap(lambda x: solve_sqrt(mass_sqrt, x))(points)

    def mean_accept(factor):
        step_fn = jax.vmap(make_step_fn(transition, potential_w, step_size * factor))

        def one(w, tape_j):
            w, info = step_fn(w, tape_j)
            prob = info.accept_prob
            return w, jnp.where(jnp.isfinite(prob), prob, 0.0)

        _, prob = jax.lax.scan(one, w, tape)
        return _mean(jnp.mean(prob, axis=0), valid)

    return jax.vmap(mean_accept)(factors)


def choose_step_size(
    step_size: Array, factors: Array, accept: Array, target: float
) -> Array:
    r"""Where the acceptance curve falls through ``target`` times its plateau.

    ``accept[k]`` is the mean acceptance over the pooled points at
    ``step_size * factors[k]`` (factors increasing). For a potential twice
    differentiable where it is finite, each point's acceptance tends to 1 as
    the step size tends to 0; a point whose own curve has not risen from 0
    on the grid (a far-out or stuck chain, whose step must be orders of
    magnitude smaller, or a non-finite potential) accepts nothing at every
    candidate. With a fraction ``p`` of the points accepting nothing and the
    others' mean curve ``a_ok``, the mean curve is

    .. math::

        \bar a(\epsilon) = p \cdot 0 + (1 - p) \, a_{ok}(\epsilon),
        \qquad \max_k \bar a \approx 1 - p ,

    so it plateaus at ``1 - p`` and never reaches a target above that: a rule
    aiming the mean at ``target`` takes the smallest candidate after every
    window and the step size collapses while the stuck points stay stuck.
    The level aimed at is therefore ``target * max_k accept[k]``: where the
    moving points accept everything at the smallest candidates
    (:math:`\max a_{ok} = 1`), :math:`\bar a \ge \text{target} \, (1 - p)`
    exactly when :math:`a_{ok} \ge \text{target}`, the target for the
    points that can move. Where the curve's maximum is 1 (every point
    accepts at the smaller candidates) the level is ``target`` itself.

    The crossing is between the last candidate of the run that starts at the
    curve's maximum and stays at or above the level, and the next candidate,
    linear in ``log eps``; smaller candidates left of the maximum (rounding
    noise of acceptances near 1) are ignored. When every candidate reaches
    the level the largest is taken (the next window's curve moves further);
    when the curve is 0 everywhere, the smallest.
    """
    log_f = jnp.log(factors)
    size = factors.shape[0]
    peak = jnp.argmax(accept)
    level = target * accept[peak]
    before = jnp.arange(size) < peak
    ok = jnp.cumprod((accept >= level) | before).astype(bool)  # the run from peak
    count = jnp.sum(ok)
    hi = jnp.clip(count, 1, size - 1)
    lo = hi - 1
    gap = accept[lo] - accept[hi]
    t = jnp.where(gap > 0, (accept[lo] - level) / jnp.where(gap > 0, gap, 1.0), 0.0)
    between = log_f[lo] + jnp.clip(t, 0.0, 1.0) * (log_f[hi] - log_f[lo])
    log_factor = jnp.where(
        accept[peak] <= 0,
        log_f[0],
        jnp.where(count == size, log_f[-1], between),
    )
    return step_size * jnp.exp(log_factor)


def restart_stuck(draws: Array, accepted: Array, key: Array) -> tuple[Array, Array]:
    """Chains that accepted no proposal in a window take another chain's draws.

    ``draws`` ``(C, W, D)`` and ``accepted`` ``(C, W)`` of one window. A chain
    that rejected every proposal sits where the shared step size is orders of
    magnitude too large for it (far from the typical set: its acceptance is 0
    at every candidate of the curve, see :func:`choose_step_size`); one step
    size cannot serve it and the other chains at once, and its draws would
    hold the pooled metric and acceptance curve at its starting point. Such a
    chain continues from the draws of a chain drawn uniformly among those
    that moved (warmup draws: the chains part again in the next window, each
    with its own tape). When no chain moved nothing changes. Returns the
    draws and which chains were restarted.
    """
    moved = jnp.any(accepted, axis=1)
    keep = moved | ~jnp.any(moved)
    donor = jax.random.categorical(
        key, jnp.where(moved, 0.0, -jnp.inf), shape=moved.shape
    )
    return jnp.where(keep[:, None, None], draws, draws[donor]), ~keep


def pooled_inverse_mass(
    draws: Array, dense: bool, weights: Array | None = None
) -> Array:
    """The regularised variance (or covariance) of pooled draws ``(n, D)``.

    ``n/(n+5) S + 1e-3 * 5/(n+5)`` (times the identity for a dense ``S``),
    Stan's and NumPyro's regularisation of the windowed estimate. With
    ``weights`` (``(n,)``, 0 or 1) only the rows of weight 1 are the draws
    (a padded window's), ``n`` their number.
    """
    dim = draws.shape[1]
    if weights is None:
        n = draws.shape[0]
        if dense:
            cov = jnp.atleast_2d(jnp.cov(draws, rowvar=False))
        else:
            cov = jnp.var(draws, axis=0, ddof=1)
    else:
        n = jnp.sum(weights)
        keep = weights[:, None] > 0  # the other rows may hold anything
        mean = jnp.sum(jnp.where(keep, draws, 0.0), axis=0) / n
        centred = jnp.where(keep, draws - mean, 0.0)
        if dense:
            cov = centred.T @ centred / (n - 1)
        else:
            cov = jnp.sum(centred**2, axis=0) / (n - 1)
    shrink = n / (n + 5.0)
    ridge = 1e-3 * 5.0 / (n + 5.0)
    if not dense:
        return shrink * cov + ridge
    return shrink * cov + ridge * jnp.eye(dim, dtype=draws.dtype)


def hessian_inverse_mass(potential_fn: PotentialFn, points: Array) -> Array:
    """``|H|^{-1}`` with ``H`` the mean Hessian at ``points``
    (:func:`~numpyro_deer.core.hessian.inverse_abs_mean_hessian`); NaN where
    the Hessian is not finite."""
    inverse, finite = inverse_abs_mean_hessian(potential_fn, points)
    return jnp.where(finite, inverse, jnp.nan)


def spread(points: Array, count: int) -> Array:
    """At most ``count`` rows of ``points``, evenly spaced, the last included."""
    num = points.shape[0]
    if num <= count:
        return points
    index = (jnp.arange(1, count + 1) * num) // count - 1
    return points[index]


def window_points(
    draws: Array, first: Array, stop: Array, count: int, slots: int
) -> tuple[Array, Array]:
    """:func:`spread`'s rows of ``draws[:, first:stop]`` pooled over chains
    (chain by chain), with ``first`` and ``stop`` traced: ``draws`` is
    ``(C, T, D)``. Returns ``slots`` rows and which of them are points: the
    ``count`` evenly spaced ones, or all pooled draws where there are at
    most ``count``, in the first rows (``slots`` at least that many)."""
    num_chains = draws.shape[0]
    size = stop - first
    num = num_chains * size
    j = jnp.arange(slots)
    valid = j < jnp.minimum(num, count)
    index = jnp.where(num > count, ((j + 1) * num) // count - 1, j)
    index = jnp.where(valid, index, 0)
    return draws[index // size, first + index % size], valid


def chees_per_gradient(
    potential_fn: PotentialFn,
    transitions: tuple[Transition, ...],
    points: Array,
    step_size: Array,
    mass_sqrt: Array | None,
    key: Array,
    valid: Array | None = None,
) -> Array:
    r"""ChEES per gradient of each transition (Hoffman, Radul and Sountsov, 2021).

    .. math::

        \mathrm{ChEES} = \tfrac14 \, E\big[(|w' - m|^2 - |w - m|^2)^2\big],

    the expected squared change, over one transition, of the squared distance
    of the whitened state ``w`` to the pooled mean ``m``, with ``w`` the
    pooled draws and ``w'`` the next state (the accept decision inside the
    expectation). Divided by the transition's gradients (``num_steps``), it
    scores trajectory lengths without sequential feedback: one transition of
    every candidate from every point, side by side, with the same tape.
    ``valid`` (``(K,)`` booleans): the points the means are over (default
    all).
    """
    num_points, dim = points.shape
    w = jax.vmap(lambda x: solve_sqrt(mass_sqrt, x))(points)
    centre = _mean(w, valid)
    before = jnp.sum((w - centre) ** 2, axis=-1)
    potential_w = whiten(potential_fn, mass_sqrt)
    scores = []
    for transition in transitions:
        tape = transition.make_tape(key, num_points, dim, points.dtype)
        step_fn = make_step_fn(transition, potential_w, step_size)
        after = jnp.sum((jax.vmap(step_fn)(w, tape)[0] - centre) ** 2, axis=-1)
        chees = 0.25 * _mean((after - before) ** 2, valid)
        scores.append(chees / gradients_per_transition(transition))
    return jnp.stack(scores)


INITIAL_FACTORS = tuple(2.0 ** (k / 2) for k in range(-32, 9))
"""Step size factors of the initial search (``2^(k/2)``, ``2^-16`` to 16)."""


@partial(jax.jit, static_argnums=(0, 1, 4, 6))
def initial_step_size(
    transition: Transition,
    potential_fn: PotentialFn,
    x0: Array,
    step_size: Array,
    target: float,
    key: Array,
    num_transitions: int = CURVE_TRANSITIONS,
) -> Array:
    """The acceptance curve at the initial positions (identity metric) over
    :data:`INITIAL_FACTORS` of ``step_size``, ``num_transitions`` from each
    (:func:`acceptance_curve`), and its crossing of ``target``."""
    factors = jnp.asarray(INITIAL_FACTORS, x0.dtype)
    accept = acceptance_curve(
        transition, potential_fn, x0, step_size, None, factors, key, None,
        num_transitions,
    )  # fmt: skip
    return choose_step_size(step_size, factors, accept, target)
