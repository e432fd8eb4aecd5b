"""A kernel's starting point: the model's potential, initial values and state.

:func:`initialize` traces the kernel's model checks and NumPyro's
``initialize_model`` (``dynamic_args=True``, so the potential is built from
whatever arguments a later call passes) abstractly, compiling nothing.
:func:`find_initial_params` is NumPyro's search for initial values as a
traceable function, run inside the compiled initial state;
:func:`check_initial_values` raises when it found none. :func:`initial_state`
is the kernel state before the first warmup step: NumPyro's
``warmup_adapter`` initialised (its step size search included), an empty block
buffer, and the curvature points all at the initial point.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.flatten_util import ravel_pytree
from numpyro.infer.util import initialize_model
from numpyro.util import is_prng_key

from .block import NUM_CURVATURE_POINTS, DEERState, empty_block
from .chains import check_initial_potential
from .checks import check_model, translate_tracer_errors


class ModelPotential(NamedTuple):
    """What :func:`initialize` gives: the model's potential and postprocessing
    (NumPyro's, with ``dynamic_args=True``: built from the arguments a call
    passes) and the shapes and dtypes of one chain's unconstrained values."""

    potential_fn_gen: Callable
    postprocess_fn: Callable
    shapes: Any


def initialize(
    model: Callable,
    rng_key: Array,
    model_args: tuple,
    model_kwargs: dict | None,
    init_strategy: Callable,
    validate_model: bool = True,
) -> ModelPotential:
    """The model checks and NumPyro's ``initialize_model``, traced abstractly.

    Both run under :func:`jax.eval_shape`, with the key as its argument: the
    model is traced, not run, so none of its operations compiles a program
    of its own (run eagerly, each operation of the model, of its gradient and
    of NumPyro's search compiled alone, 2-9 s on the CPU for the benchmark
    models against 0.1-0.5 s traced). The initial values themselves come from
    :func:`find_initial_params`, inside the compiled initial state.

    Functions traced this way must not hold on to the trace's values. NumPyro
    keeps values of the model's trace for its potential (``param`` sites) and
    postprocessing (transforms with array parameters); when anything reachable
    from them is a tracer, the set-up is run again eagerly, from the key
    ``rng_key`` (a chain's key, or the first of a batch of keys; the values of
    ``param`` sites come from it).

    Raises:
        UnsupportedModelError: from :func:`check_model` (``validate_model``),
            or Python control flow on a latent value.
    """
    found = []

    def set_up(key):
        if validate_model:
            check_model(model, model_args, model_kwargs, key)
        info, potential_fn_gen, postprocess_fn, _ = _initialize_model(
            key, model, init_strategy, model_args, model_kwargs
        )
        found.append((potential_fn_gen, postprocess_fn))
        return info[0]

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # a key, traced
    with translate_tracer_errors():
        shapes = jax.eval_shape(set_up, key)
    if not holds_tracer(found[0]):
        return ModelPotential(*found[0], shapes)
    if not is_prng_key(rng_key):  # vectorized chains: the first chain's key
        rng_key = rng_key[0]
    key_model = jax.random.split(rng_key)[1]  # the search's key
    with translate_tracer_errors():
        # the batch of one makes NumPyro search in one compiled loop, not
        # operation by operation; its values are not used
        _, potential_fn_gen, postprocess_fn, _ = _initialize_model(
            key_model[None], model, init_strategy, model_args, model_kwargs
        )
    return ModelPotential(potential_fn_gen, postprocess_fn, shapes)


def _initialize_model(key, model, init_strategy, model_args, model_kwargs):
    """NumPyro's ``initialize_model``, the potential built from the arguments
    of a later call (``dynamic_args=True``)."""
    return initialize_model(
        key,
        model,
        dynamic_args=True,
        init_strategy=init_strategy,
        model_args=model_args,
        model_kwargs=model_kwargs,
    )


def holds_tracer(root: Any, max_depth: int = 32) -> bool:
    """Whether a JAX tracer is reachable from ``root`` through containers,
    ``functools.partial`` objects, closures and object attributes."""
    seen = set()
    stack = [(root, 0)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, jax.core.Tracer):
            return True
        if isinstance(obj, (np.ndarray, jax.Array)):
            continue
        if depth > max_depth or id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        elif isinstance(obj, partial):
            children = [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, types.MethodType):
            children = [obj.__func__, obj.__self__]
        elif isinstance(obj, types.FunctionType):
            cells = obj.__closure__ or ()
            children = [c.cell_contents for c in cells if _filled(c)]
            children += list(obj.__defaults__ or ())
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            slots = getattr(type(obj), "__slots__", ())
            slots = (slots,) if isinstance(slots, str) else slots or ()
            children += [getattr(obj, name, None) for name in slots]
        stack.extend((child, depth + 1) for child in children)
    return False


_LEAVES = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises for an empty cell
    except ValueError:
        return False
    return True


def find_initial_params(
    model: Callable, init_strategy: Callable
) -> Callable[[Array, tuple, dict], tuple[Any, Array]]:
    """``search(key, args, kwargs) -> (params, valid)``: NumPyro's search for
    initial values, to be traced inside a compiled program.

    ``params`` are the unconstrained values ``initialize_model`` finds from
    ``key`` (up to 100 draws from ``init_strategy``; the same values as an
    eager search with that key), ``valid`` whether their potential energy and
    its gradient are finite (NumPyro raises when they are not; traced, the
    caller checks ``valid``).
    """

    def search(key, model_args, model_kwargs):
        (params, energy, grad), *_ = _initialize_model(
            key, model, init_strategy, model_args, model_kwargs
        )
        valid = jnp.isfinite(energy) & jnp.all(jnp.isfinite(ravel_pytree(grad)[0]))
        return params, valid

    return search


def check_initial_values(valid, message: Callable[[], str]) -> None:
    """Raise ``RuntimeError`` if NumPyro's search found no valid initial
    values for some chain (``valid``: one flag per chain, on the host);
    ``message()`` says which sites to look at."""
    if isinstance(valid, jax.core.Tracer):
        return
    valid = np.asarray(valid)
    if np.all(valid):
        return
    chains = ""
    if valid.ndim:
        chains = f" for chain(s) {np.flatnonzero(~valid).tolist()}"
    raise RuntimeError(
        f"Cannot find valid initial parameters{chains}: no draw of the "
        "init_strategy (100 tries) gave a finite potential energy and gradient. "
        + message()
    )


def check_initial(valid, potential_energy, message: Callable[[], str]) -> None:
    """:func:`check_initial_values` and
    :func:`~numpyro_deer.infer.chains.check_initial_potential`, both from one
    transfer from the device."""
    if not isinstance(potential_energy, jax.core.Tracer):
        valid, potential_energy = jax.device_get((valid, potential_energy))
    check_initial_values(valid, message)
    check_initial_potential(potential_energy)


def initial_state(
    params: Any,
    rng_key: Array,
    potential_flat: Callable[[Array], Array],
    adapter_init: Callable,
    step_size: float,
    block_size: int,
    num_steps: int = 1,
) -> DEERState:
    """The state before the first warmup step, at ``params``, its
    transitions of ``num_steps`` gradients.

    ``adapter_init`` is NumPyro's ``warmup_adapter`` init
    (:attr:`~numpyro_deer.infer.warmup.Adapter.init`) at ``step_size``; its
    search for a starting step size is left to the kernel's step size
    program (:func:`~numpyro_deer.infer.warmup.restart_step_size`).
    """
    key, key_adapt = jax.random.split(rng_key)
    z_flat = ravel_pytree(params)[0]
    with translate_tracer_errors():
        potential = potential_flat(z_flat)
    adapt = adapter_init(z_flat, key_adapt, step_size)
    zero = jnp.zeros((), z_flat.dtype)
    return DEERState(
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
        num_steps=jnp.asarray(num_steps, jnp.int32),
    )
