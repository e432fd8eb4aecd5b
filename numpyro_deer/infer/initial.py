"""A kernel's starting point: the model's initial values and the initial state.

:func:`initialize` runs NumPyro's ``initialize_model`` (``dynamic_args=True``,
so the potential is built from whatever arguments a later call passes) after
the kernel's model checks, and says which sites to look at when no valid
initial point exists. :func:`starting_params` gives each chain its initial
values (the user's or the model's). :func:`initial_state` is the kernel state
before the first warmup step: NumPyro's ``warmup_adapter`` initialised (its
step size search included), an empty block buffer, and the curvature points
all at the initial point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import initialize_model
from numpyro.util import is_prng_key, not_jax_tracer

from .block import NUM_CURVATURE_POINTS, DEERMALAState, empty_block
from .chains import float_params, has_chain_axis
from .checks import check_model, non_finite_sites_message, translate_tracer_errors


def initialize(
    model: Callable,
    rng_key: Array,
    model_args: tuple,
    model_kwargs: dict | None,
    init_strategy: Callable,
    validate_model: bool = True,
) -> tuple[Any, Callable, Callable]:
    """``(params, potential_fn_gen, postprocess_fn)`` of ``model``.

    ``params`` are the unconstrained initial values NumPyro's search found
    (with a leading chain axis when ``rng_key`` is a batch of keys). A single
    key is passed to NumPyro as a batch of one: NumPyro then searches in one
    compiled loop (the same first draw) instead of running the model and its
    gradient operation by operation, each operation compiled alone, which cost
    about 2.5 s more on the CPU (eight schools).

    Raises:
        UnsupportedModelError: from :func:`check_model` (``validate_model``).
        RuntimeError: no valid initial point, with the sites whose log density
            is not finite.
    """
    if validate_model:
        check_model(model, model_args, model_kwargs, rng_key)
    single = is_prng_key(rng_key) and not_jax_tracer(rng_key)
    try:
        with translate_tracer_errors():
            params_info, potential_fn_gen, postprocess_fn, _ = initialize_model(
                _batch_of_one(rng_key) if single else rng_key,
                model,
                dynamic_args=True,
                init_strategy=init_strategy,
                model_args=model_args,
                model_kwargs=model_kwargs,
            )
    except RuntimeError as err:
        if "Cannot find valid initial parameters" not in str(err):
            raise
        raise RuntimeError(
            str(err)
            + " "
            + non_finite_sites_message(model, model_args, model_kwargs, rng_key)
        ) from err
    params = params_info[0]
    if single:
        params = _first(params)
    return params, potential_fn_gen, postprocess_fn


def _batch_of_one(rng_key: Array) -> Array:
    """A concrete key as a batch of one key.

    A raw key (``uint32`` words) goes as a numpy array: NumPyro takes its
    first key back out (``rng_key[0]``), and on numpy neither step compiles a
    program. A typed key (``jax.random.key``) is indexed as a JAX array.
    """
    if jnp.issubdtype(rng_key.dtype, jax.dtypes.prng_key):
        return rng_key[None]
    return np.asarray(rng_key)[None]


@jax.jit
def _split_chain_keys(rng_key: Array) -> tuple[Array, Array, Array]:
    """``(keys left, keys of the model, first key of the model)``: each
    chain's key split in two, in one compiled program rather than a program
    per operation."""
    rng_key, key_model = jnp.swapaxes(jax.vmap(jax.random.split)(rng_key), 0, 1)
    return rng_key, key_model, key_model[0]


@jax.jit
def _first(tree: Any) -> Any:
    """The first entry of every leaf: one compiled program per structure and
    shapes, where indexing each leaf compiles one per leaf shape."""
    return jax.tree.map(lambda x: x[0], tree)


def starting_params(
    init_model: Callable,
    rng_key: Array,
    model_args: tuple,
    model_kwargs: dict | None,
    init_params: Any,
) -> tuple[Array, Any]:
    """``(rng_key, params)``: the key left for the chain(s), and float params.

    ``init_model(key, args, kwargs, init_params)`` gives one chain's initial
    values (the user's ``init_params`` when given). With a batch of keys
    (vectorized chains) the chain axis comes from where the values come from:
    the user's ``init_params`` must carry one (as for NumPyro's kernels), the
    model's own initialization is vmapped over the chains' keys.

    Raises:
        ValueError: vectorized ``init_params`` without a leading chain axis.
    """
    if is_prng_key(rng_key):
        rng_key, key_model = jax.random.split(rng_key)
        params = init_model(key_model, model_args, model_kwargs, init_params)
        return rng_key, float_params(params)
    num_chains = rng_key.shape[0]
    rng_key, key_model, first_key = _split_chain_keys(rng_key)
    # sets up the potential (and checks the model) once, from the first key
    params = init_model(first_key, model_args, model_kwargs, init_params)
    if init_params is None:
        params = jax.vmap(lambda k: init_model(k, model_args, model_kwargs, None))(
            key_model
        )
    elif not has_chain_axis(params, num_chains):
        raise ValueError(
            "init_params for vectorized chains need a leading axis of "
            f"length num_chains={num_chains} on every site."
        )
    return rng_key, float_params(params)


def initial_state(
    params: Any,
    rng_key: Array,
    potential_flat: Callable[[Array], Array],
    adapter_init: Callable,
    step_size: float,
    block_size: int,
) -> DEERMALAState:
    """The state before the first warmup step, at ``params``.

    ``adapter_init`` is NumPyro's ``warmup_adapter`` init
    (:func:`~numpyro_deer.infer.warmup.build_adapter`), which searches the
    starting step size from ``step_size``.
    """
    key, key_adapt = jax.random.split(rng_key)
    z_flat = ravel_pytree(params)[0]
    with translate_tracer_errors():
        potential = potential_flat(z_flat)
    adapt = adapter_init((z_flat,), key_adapt, step_size, mass_matrix_size=z_flat.size)
    zero = jnp.zeros((), z_flat.dtype)
    return DEERMALAState(
        i=jnp.zeros((), jnp.int32),
        z=params,
        potential_energy=potential,
        accept_prob=zero,
        mean_accept_prob=zero,
        diverging=jnp.zeros((), bool),
        newton_iterations=jnp.zeros((), jnp.int32),
        deer_converged=jnp.ones((), bool),
        adapt_state=adapt,
        rng_key=key,
        block=empty_block(block_size, z_flat, key),
        curvature_points=jnp.broadcast_to(
            z_flat, (NUM_CURVATURE_POINTS,) + z_flat.shape
        ),
    )
