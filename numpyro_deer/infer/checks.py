"""Validation of NumPyro models before DEER-MALA samples them.

`DEERMALA` needs a potential (negative log density) that is a differentiable,
traceable function of a fixed set of continuous latent values: it is evaluated
under ``jit``, ``vmap`` and ``jvp`` at every Newton iteration. `check_model`
traces the model once and rejects the features that break this, with an
`UnsupportedModelError` that names the site and says what to do instead;
`translate_tracer_errors` turns JAX's tracer errors, raised when the potential
itself is traced, into the same error.

What stock NumPyro does with each feature (measured with ``initialize_model``
and ``NUTS`` on NumPyro 0.22.0 and 0.21.0, which behave alike, and JAX 0.10.2):

* Discrete latent site, without funsor installed: ``initialize_model`` raises
  ``ImportError("Looking like you want to do inference for models with
  discrete latent variables ... install `funsor` ...")``, after a
  ``FutureWarning`` about automatic enumeration when the site is not marked
  ``infer={"enumerate": "parallel"}``. With funsor installed it enumerates
  the site inside the potential (it disappears from the latent values), or
  raises ``RuntimeError`` for distributions without enumerate support (e.g.
  ``Poisson``). DEER-MALA never enumerates. `check_model` runs before
  ``initialize_model``, so neither the ``ImportError`` nor the warning is seen.
* Plate with ``subsample_size < size``: ``initialize_model`` succeeds (it
  traces the model under a seed), then every evaluation of the potential
  raises ``ValueError("Missing random key to generate subsample indices.
  Algorithms like HMC/NUTS do not support subsampling. ...")``.
* Latent ``Delta`` site: ``initialize_model`` raises ``ValueError("Sample site
  'd' has a delta distribution; use `numpyro.deterministic` ...")`` only when
  the site's distribution is a ``Delta`` itself; ``Delta(...).to_event(1)``
  slips through and ends in ``RuntimeError("Cannot find valid initial
  parameters. ...")``. `check_model` looks through ``Independent``,
  ``ExpandedDistribution`` and ``MaskedDistribution`` wrappers.
* Python control flow on a latent value: ``initialize_model`` succeeds (it
  evaluates the potential on concrete values); the error comes when the
  potential is traced: ``jax.errors.TracerBoolConversionError`` for ``if x >
  0:``, ``jax.errors.ConcretizationTypeError`` for ``int(x)`` or
  ``float(x)``, ``jax.errors.TracerIntegerConversionError`` for ``range(n)``
  or indexing a Python list with a traced integer.
"""

import inspect
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.handlers import block, seed, substitute, trace
from numpyro.infer.initialization import init_to_uniform
from numpyro.util import is_prng_key

__all__ = [
    "UnsupportedModelError",
    "check_model",
    "check_potential_traceable",
    "non_finite_sites_message",
    "translate_tracer_errors",
]

_TRACER_ERRORS = (
    jax.errors.TracerBoolConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
)

# Sites that hold a value a later site could use.
_VALUE_SITES = frozenset({"sample", "deterministic", "param"})

# Frames of these packages are skipped when pointing at the user's code.
_LIBRARY_MODULES = frozenset({"jax", "jaxlib", "numpyro", "numpyro_deer", "contextlib"})


class UnsupportedModelError(ValueError):
    """The model uses a feature that DEER-MALA cannot sample.

    The message names the offending sample site (or the line of the model that
    failed to trace) and says how to rewrite the model.
    """


def _discrete_message(name: str, fn: dist.Distribution) -> str:
    family = type(_base_distribution(fn)).__name__
    return (
        f"Sample site '{name}' is a discrete latent variable ({family}). MALA "
        "needs a differentiable log density of continuous latent variables. "
        "Marginalise the discrete site out by hand "
        "(sum its values in log space with jax.nn.logsumexp and add the result "
        "with numpyro.factor), or sample the model with NumPyro's "
        "DiscreteHMCGibbs or MixedHMC. Enumeration "
        "(infer={'enumerate': 'parallel'}) is not supported, even when funsor "
        "is installed."
    )


def _missing_data_message(
    name: str, fn: dist.Distribution, data_names: list[str]
) -> str:
    if data_names:
        names = ", ".join(repr(n) for n in data_names)
        verb = "is" if len(data_names) == 1 else "are"
        why = f"The model's argument {names} {verb} None in this call."
    else:
        why = "It is the model's last site and nothing uses its value."
    family = type(_base_distribution(fn)).__name__
    return (
        f"Sample site '{name}' ({family}) has no observed value: did "
        f"you forget to pass its data (obs=...)? {why} Pass the observations to "
        "MCMC.run as the model argument that feeds "
        f"numpyro.sample('{name}', ..., obs=...). If '{name}' is meant to be "
        f"latent: {_discrete_message(name, fn)}"
    )


def _enumerate_message(name: str, mode: object) -> str:
    return (
        f"Sample site '{name}' is marked infer={{'enumerate': {mode!r}}}. "
        "DEERMALA does not enumerate sites; remove the 'enumerate' mark."
    )


def _subsample_message(name: str, size: int, subsample_size: int) -> str:
    return (
        f"Plate '{name}' subsamples {subsample_size} of {size} elements. DEER "
        "needs a fixed potential over the whole block of MALA steps, and a "
        "subsampled likelihood changes at every evaluation. Remove "
        f"subsample_size from numpyro.plate('{name}', ...); for data "
        "subsampling use SVI or NumPyro's HMCECS."
    )


def _delta_message(name: str) -> str:
    return (
        f"Sample site '{name}' is a latent Delta distribution, which has no "
        "density to sample. Record the value with "
        f"numpyro.deterministic('{name}', value) instead."
    )


def _base_distribution(fn: dist.Distribution) -> dist.Distribution:
    """Strip the ``to_event``/``expand``/``mask`` wrappers from a distribution."""
    wrappers = (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)
    while isinstance(fn, wrappers):
        fn = fn.base_dist
    return fn


def _site_problems(
    name: str,
    site: dict[str, Any],
    unbound: frozenset[str] = frozenset(),
    last: bool = False,
) -> list[str]:
    """The problems of one site of a model trace, as messages.

    A discrete latent site that looks like an observation whose data was not
    passed (its name, ``{name}_obs`` or ``obs`` is a model parameter that is
    ``None`` in this call, among ``unbound``; or it is the ``last`` site of
    the model, whose value nothing uses) gets the missing-data message first.
    """
    if site["type"] == "plate":
        size, subsample_size = site["args"]
        if subsample_size is not None and subsample_size < size:
            return [_subsample_message(name, size, subsample_size)]
        return []
    if site["type"] != "sample" or site["is_observed"]:
        return []
    fn = site["fn"]
    if fn.support.is_discrete:
        data_names = {name, f"{name}_obs", f"obs_{name}", "obs"} & unbound
        if data_names or last:
            return [_missing_data_message(name, fn, sorted(data_names))]
        return [_discrete_message(name, fn)]
    problems = []
    mode = (site.get("infer") or {}).get("enumerate")
    if mode is not None:
        problems.append(_enumerate_message(name, mode))
    if isinstance(_base_distribution(fn), dist.Delta):
        problems.append(_delta_message(name))
    return problems


def _initial_trace(
    model: Callable[..., Any],
    model_args: tuple[Any, ...],
    model_kwargs: dict[str, Any] | None,
    rng_key: jax.Array | None,
) -> dict[str, dict[str, Any]]:
    """The model's trace at an initial point, as ``initialize_model`` runs it.

    Under ``seed`` (``rng_key``, or the first of a batch of keys; defaults to
    ``jax.random.PRNGKey(0)``) and ``substitute(substitute_fn=init_to_uniform)``
    (so improper priors work), inside ``block`` so that enclosing handlers see
    nothing.
    """
    if rng_key is None:
        rng_key = jax.random.PRNGKey(0)
    elif not is_prng_key(rng_key):
        rng_key = rng_key[0]
    seeded = substitute(seed(model, rng_key), substitute_fn=init_to_uniform)
    with block():
        return trace(seeded).get_trace(*model_args, **(model_kwargs or {}))


def _missing_data_names(
    model: Callable[..., Any],
    model_args: tuple[Any, ...],
    model_kwargs: dict[str, Any] | None,
) -> frozenset[str]:
    """The model's parameters that are ``None`` in this call (passed as
    ``None`` or left at a ``None`` default): where observed data would go."""
    try:
        bound = inspect.signature(model).bind_partial(
            *model_args, **(model_kwargs or {})
        )
    except (TypeError, ValueError):  # no signature, or arguments it rejects
        return frozenset()
    bound.apply_defaults()
    return frozenset(name for name, value in bound.arguments.items() if value is None)


def _last_sample_site(model_trace: dict[str, dict[str, Any]]) -> str | None:
    """The last site of the trace if it is a sample site (nothing comes after
    it: no later site can use its value), else ``None``."""
    names = [n for n, s in model_trace.items() if s["type"] in _VALUE_SITES]
    if names and model_trace[names[-1]]["type"] == "sample":
        return names[-1]
    return None


def check_model(
    model: Callable[..., Any],
    model_args: tuple[Any, ...] = (),
    model_kwargs: dict[str, Any] | None = None,
    rng_key: jax.Array | None = None,
) -> None:
    """Check that DEER-MALA can sample ``model``, before building its potential.

    The model is run once, eagerly, the way ``initialize_model`` runs it:
    under ``seed`` and ``substitute(substitute_fn=init_to_uniform)`` (so
    improper priors work), inside ``block`` so that enclosing handlers see
    nothing. Every problem found is reported in one error. A discrete latent
    site that looks like a forgotten observation (a model argument of its
    name is ``None``, or it is the model's last site) is reported as such
    first.

    Detected: discrete latent sample sites (including sites marked for
    enumeration), plates with ``subsample_size < size``, and latent ``Delta``
    sites (also under ``to_event``, ``expand`` or ``mask``). Python control
    flow on latent values cannot be seen on concrete values; it is caught when
    the potential is traced, see `translate_tracer_errors` and
    `check_potential_traceable`.

    Args:
        model: The NumPyro model function.
        model_args: Positional arguments of the model.
        model_kwargs: Keyword arguments of the model.
        rng_key: Key for the trace; a batch of keys (vectorized chains) uses
            its first. Defaults to ``jax.random.PRNGKey(0)``.

    Raises:
        UnsupportedModelError: If the model has any of the features above.
    """
    model_trace = _initial_trace(model, model_args, model_kwargs, rng_key)
    unbound = _missing_data_names(model, model_args, model_kwargs)
    last = _last_sample_site(model_trace)
    problems = [
        message
        for name, site in model_trace.items()
        for message in _site_problems(name, site, unbound, name == last)
    ]
    if problems:
        raise UnsupportedModelError("\n".join(problems))


def non_finite_sites_message(
    model: Callable[..., Any],
    model_args: tuple[Any, ...] = (),
    model_kwargs: dict[str, Any] | None = None,
    rng_key: jax.Array | None = None,
) -> str:
    """Which sites have a non-finite log density at an initial point.

    Runs the model once as `check_model` does (latent values from
    ``init_to_uniform``) and sums each sample site's ``log_prob``. Used when
    NumPyro finds no valid initial parameters, to say where to look: usually
    NaN or infinite data in an observed site, or an observation outside its
    distribution's support.
    """
    try:
        model_trace = _initial_trace(model, model_args, model_kwargs, rng_key)
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return ""
    bad = []
    for name, site in model_trace.items():
        if site["type"] != "sample":
            continue
        log_prob = jnp.sum(site["fn"].log_prob(site["value"]))
        if not bool(jnp.isfinite(log_prob)):
            kind = "observed" if site["is_observed"] else "latent"
            bad.append(f"'{name}' ({kind})")
    if not bad:
        return ""
    return (
        "The log density is not finite at the initial point at site(s) "
        + ", ".join(bad)
        + ": check those sites' data for NaN or infinite values and for values "
        "outside the distribution's support."
    )


def _user_frame(err: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame outside the libraries."""
    location = None
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] not in _LIBRARY_MODULES:
            code = frame.f_code
            location = f"{code.co_filename}:{lineno} in {code.co_name}"
    return location


def _control_flow_message(err: BaseException) -> str:
    location = _user_frame(err)
    where = f" (at {location})" if location is not None else ""
    summary = str(err).split("\n", 1)[0]
    return (
        f"The model's log density could not be traced by JAX{where}: it uses "
        "Python control flow (if/while, int(), float(), range(), indexing a "
        "Python list) on a value that depends on a latent variable (or on a "
        "model argument, under jit_model_args=True). DEERMALA "
        "evaluates the potential under jax.jit, vmap and jvp, so it must be "
        "traceable: use jnp.where or jax.lax.cond instead of if, "
        "jax.lax.fori_loop, jax.lax.while_loop or jax.lax.scan instead of "
        "Python loops, and x.astype(int) or jnp.take instead of int() and list "
        f"indexing. Original error: {type(err).__name__}: {summary}"
    )


@contextmanager
def translate_tracer_errors() -> Iterator[None]:
    """Re-raise JAX tracer errors as `UnsupportedModelError`.

    Wrap the code that builds or traces the potential. The JAX errors
    ``TracerBoolConversionError``, ``ConcretizationTypeError`` and
    ``TracerIntegerConversionError`` become an `UnsupportedModelError` that
    points at the innermost line outside JAX, NumPyro and this package
    (normally the offending line of the model), explains the fix, and names
    the original error and its first line. It is raised ``from None``: the
    original traceback, dozens of JAX frames, is not printed. Usable as a
    decorator too.

    Raises:
        UnsupportedModelError: If the wrapped code raised one of those errors.
    """
    try:
        yield
    except _TRACER_ERRORS as err:
        # the message names the user's line and the JAX error: the JAX frames
        # of the original traceback would only bury it
        raise UnsupportedModelError(_control_flow_message(err)) from None


def check_potential_traceable(
    potential_fn: Callable[[Any], jax.Array], params: Any
) -> None:
    """Trace ``potential_fn`` and its gradient abstractly, compiling nothing.

    Uses ``jax.eval_shape``, so it costs one trace and no XLA compilation.

    Args:
        potential_fn: The potential, e.g. from ``initialize_model``.
        params: Unconstrained latent values (a pytree) to trace it at.

    Raises:
        UnsupportedModelError: If tracing hits Python control flow on a latent
            value (see `translate_tracer_errors`).
    """
    with translate_tracer_errors():
        jax.eval_shape(jax.value_and_grad(potential_fn), params)
