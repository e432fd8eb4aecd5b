r"""Warmup: sequential steps of the transition under NumPyro's adaptation.

Warmup is not solved by DEER: while the step size and the mass matrix change
from one step to the next there is no fixed map ``s_t = f_t(s_{t-1})`` to solve
for. Each warmup draw is one step of the kernel's transition (MALA or HMC,
:func:`numpyro_deer.core.make_step_fn`) followed by NumPyro's
``warmup_adapter`` update: dual averaging of the step size toward
``target_accept_prob`` (Hoffman and Gelman, 2014) over the window schedule of
Stan, and at each window end either NumPyro's own mass matrix (the windowed
covariance of the draws) or the inverse mean Hessian (the kernel's window
end, :meth:`~numpyro_deer.infer.program.BlockProgram.warmup`).

NumPyro's adapter searches a starting step size at each window start with a
``find_reasonable_step_size`` written for HMC (one leapfrog step);
:func:`find_reasonable_step_size` is its counterpart for the kernel's
transition.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.flatten_util import ravel_pytree
from numpyro.infer.hmc_util import dual_averaging, warmup_adapter

from ..core.certificate import tree_where
from ..core.metric import mass_matrix_sqrt
from ..core.transition import Transition, make_step_fn
from .block import DEERState, record_warmup_draw
from .hessian_mass import adapt_mass_sqrt

MAX_STEP_SIZE_SEARCH = 40
"""Most doublings or halvings of the step size in one search."""


def find_reasonable_step_size(
    potential_flat: Callable[[Array], Array],
    target: float,
    step_size: Array,
    inverse_mass_matrix: Array,
    z_info: tuple,
    rng_key: Array,
    transition: Transition,
) -> Array:
    r"""Double or halve the step size until one step's acceptance crosses target.

    With ``a(\epsilon)`` the acceptance probability of one step of
    ``transition`` from ``z_info[0]`` on a fixed tape: if
    ``a(step_size) > target`` the step doubles while ``a > target`` and the
    last step that still passed is returned; otherwise it halves until
    ``a >= target``. Either way ``a(\epsilon) \ge target \ge a(2 \epsilon)``
    unless the search stopped after :data:`MAX_STEP_SIZE_SEARCH` changes. The
    signature is the one NumPyro's ``warmup_adapter`` calls, with
    ``potential_flat`` and ``target`` bound; ``transition`` is the taped step
    on a one-step tape.
    """
    x = z_info[0]
    tape = transition.make_tape(rng_key, 1, x.shape[0], x.dtype)
    tape = jax.tree.map(lambda v: v[0], tape)
    mass_sqrt = mass_matrix_sqrt(inverse_mass_matrix)

    def accept(eps):
        step_fn = make_step_fn(transition, potential_flat, eps, mass_sqrt)
        return step_fn(x, tape)[1].accept_prob

    # one evaluation of the step per loop iteration (one copy of it in the
    # compiled graph): the first also fixes the direction
    def body(carry):
        eps, direction, count, _ = carry
        a = accept(eps)
        direction = jnp.where(count == 0, jnp.where(a > target, 1.0, -1.0), direction)
        go = (direction * (a - target) > 0) & (count < MAX_STEP_SIZE_SEARCH)
        return jnp.where(go, eps * 2.0**direction, eps), direction, count + 1, go

    eps = jnp.asarray(step_size)
    eps, direction, _, _ = jax.lax.while_loop(
        lambda carry: carry[3],
        body,
        (eps, jnp.ones((), eps.dtype), jnp.zeros((), jnp.int32), jnp.ones((), bool)),
    )
    # the last step overshot the target: step back once when growing
    return jnp.where(direction > 0, eps / 2.0, eps)


def _keep_step_size(step_size, *_):
    return step_size


def restart_step_size(
    adapt: Any, x: Array, find_step_size: Callable, use: Array | bool = True
) -> Any:
    """NumPyro's step size search and dual averaging restart, where ``use``.

    What ``warmup_adapter`` does at its start and after each mass matrix
    update: ``key, key_ss = split(adapt.rng_key)``, a search
    (``find_step_size``, see :func:`find_reasonable_step_size`) from
    ``adapt.step_size`` in ``adapt``'s metric at ``x``, dual averaging
    restarted at ``log(10 eps)``, and ``key`` kept. The kernel's initial
    state holds NumPyro's adapt state before that search (its key not yet
    split), so the search is a program of its own for the initial state and
    for each Hessian window end. NumPyro writes the restart as
    ``log(10 * eps)`` at the start (``window_idx`` 0) and as ``log(10) +
    log(eps)`` after an update; both are kept.
    """
    key, key_ss = jax.random.split(adapt.rng_key)
    eps = find_step_size(adapt.step_size, adapt.inverse_mass_matrix, (x,), key_ss)
    log_10_eps = jnp.where(
        adapt.window_idx == 0, jnp.log(10 * eps), jnp.log(10.0) + jnp.log(eps)
    )
    ss_init, _ = dual_averaging()
    new = adapt._replace(step_size=eps, ss_state=ss_init(log_10_eps), rng_key=key)
    return tree_where(use, new, adapt)


class Adapter(NamedTuple):
    """NumPyro's ``warmup_adapter`` for a transition (:func:`build_adapter`).

    Attributes:
        init: ``init(x, key, step_size)``, NumPyro's adapt state at the flat
            position ``x`` before its initial step size search: that search
            is :func:`restart_step_size` with ``find_step_size``, from the
            state's key (``key``, not yet split).
        update: ``update(t, accept_prob, x, adapt_state)``, NumPyro's
            update after warmup step ``t`` at ``x`` (the Hessian window end is
            the kernel's, :meth:`~.program.BlockProgram.warmup`).
        find_step_size: the step size search (:func:`find_reasonable_step_size`
            for the transition); ``None`` when the step size is not adapted.
    """

    init: Callable
    update: Callable
    find_step_size: Callable | None


def build_adapter(
    potential_flat: Callable[[Array], Array],
    num_warmup: int,
    *,
    mass_adaptation: bool | str,
    dense_mass: bool,
    adapt_step_size: bool,
    target_accept_prob: float,
    transition: Transition,
) -> Adapter:
    """NumPyro's ``warmup_adapter`` for a transition.

    With ``mass_adaptation == "hessian"`` NumPyro's adapter keeps the
    metric: the kernel replaces it at each window end by the inverse mean
    Hessian at the curvature points and restarts the step size search in the
    new metric (:meth:`~numpyro_deer.infer.program.BlockProgram.window_end`).
    """
    hessian = mass_adaptation == "hessian"
    find_step_size = None
    if adapt_step_size:
        find_step_size = partial(
            find_reasonable_step_size,
            potential_flat,
            target_accept_prob,
            transition=transition,
        )
    # Under the Hessian mass NumPyro's own estimate (a dense covariance of
    # the draws, updated every step, factorised at window ends) is not
    # computed: the kernel replaces the metric at every window end (and
    # keeps the previous one where the mean Hessian is not finite). Its step
    # size search at window ends, in the old metric, is skipped too: the
    # search runs in the new one.
    adapter = partial(
        warmup_adapter,
        num_warmup,
        adapt_step_size=adapt_step_size,
        adapt_mass_matrix=bool(mass_adaptation) and not hessian,
        dense_mass=dense_mass or hessian,
        target_accept_prob=target_accept_prob,
    )
    numpyro_init, _ = adapter(find_reasonable_step_size=_keep_step_size)
    _, numpyro_update = adapter(
        find_reasonable_step_size=find_step_size if not hessian else _keep_step_size
    )

    def init(x, key, step_size):
        # the step size as the search returns it (x's dtype, not weakly
        # typed), so the state has the types it has after the search
        step_size = jnp.asarray(step_size, x.dtype)
        adapt = numpyro_init((x,), key, step_size, mass_matrix_size=x.size)
        # the search to come splits the key as NumPyro's init would have
        return adapt if find_step_size is None else adapt._replace(rng_key=key)

    def update(t, accept_prob, x, adapt):
        return numpyro_update(t, accept_prob, (x,), adapt)

    return Adapter(init, update, find_step_size)


def warmup_step(
    state: DEERState,
    potential_flat: Callable[[Array], Array],
    adapter_update: Callable,
    num_warmup: int,
    unravel: Callable,
    transition: Transition,
) -> DEERState:
    """One warmup draw: a step in the current metric, then the adaptation.

    The step is ``transition``'s on a one-step tape (:func:`make_step_fn`).
    The state's key is split into the next key and the step's tape; the draw
    goes into the curvature points when it is one of them, and
    ``mean_accept_prob`` is the running mean over the warmup so far.
    """
    rng_key, key_tape = jax.random.split(state.rng_key)
    adapt = state.adapt_state
    x = ravel_pytree(state.z)[0]
    tape = transition.make_tape(key_tape, 1, x.shape[0], x.dtype)
    step_fn = make_step_fn(
        transition,
        potential_flat,
        adapt.step_size,
        adapt_mass_sqrt(adapt),
    )
    x, info = step_fn(x, jax.tree.map(lambda v: v[0], tape))
    i = state.i + 1
    points = record_warmup_draw(state.curvature_points, i, num_warmup, x)
    adapt = adapter_update(state.i, info.accept_prob, x, adapt)
    mean = state.mean_accept_prob + (info.accept_prob - state.mean_accept_prob) / i
    return state._replace(
        i=i,
        z=unravel(x),
        potential_energy=info.potential_energy,
        accept_prob=info.accept_prob,
        mean_accept_prob=mean,
        diverging=info.diverging,
        adapt_state=adapt,
        rng_key=rng_key,
        curvature_points=points,
    )


def shared_schedule(step: Callable, state) -> Callable:
    """``step`` with the chains' shared iteration count and NumPyro window
    index closed over, for mapping over the chains of ``state``.

    Vectorized chains advance in lockstep, so ``state.i`` and the adapt
    state's ``window_idx`` are the same for all. Passed unbatched, the
    predicate of NumPyro's window-end ``cond`` (``warmup_adapter``: the
    metric's final estimate and the step size search) is unbatched too, and
    the ``cond`` stays a ``cond`` under ``vmap``; from the batched state it
    would become a ``select`` that computes both branches, the search's
    loop included, at every step.
    """
    i = jnp.reshape(state.i, (-1,))[0]
    window = jnp.reshape(state.adapt_state.window_idx, (-1,))[0]

    def shared(s):
        adapt = s.adapt_state._replace(window_idx=window)
        return step(s._replace(i=i, adapt_state=adapt))

    return shared
