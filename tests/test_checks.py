"""Tests of model validation (``numpyro_deer.infer.checks``).

Each unsupported feature must raise `UnsupportedModelError` (a ``ValueError``)
whose message names the site and says what to do instead.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.handlers import trace
from numpyro.infer.util import potential_energy

from benchmarks import models
from benchmarks.models import BENCHMARK_MODELS
from numpyro_deer.infer.checks import (
    UnsupportedModelError,
    check_model,
    check_potential_traceable,
    translate_tracer_errors,
)

Y = jnp.array([0.3, -1.2, 0.8])


def _mixture(enumerate_mark: bool) -> None:
    infer = {"enumerate": "parallel"} if enumerate_mark else {}
    loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
    switch = numpyro.sample("switch", dist.Bernoulli(0.3), infer=infer)
    numpyro.sample("y", dist.Normal(loc + 2.0 * switch, 1.0), obs=Y)


@pytest.mark.parametrize("enumerate_mark", [False, True])
def test_discrete_latent_site(enumerate_mark: bool) -> None:
    with pytest.raises(UnsupportedModelError) as excinfo:
        check_model(partial(_mixture, enumerate_mark))
    message = str(excinfo.value)
    assert "'switch'" in message
    assert "discrete latent" in message
    assert "numpyro.factor" in message and "logsumexp" in message
    assert "DiscreteHMCGibbs" in message and "MixedHMC" in message
    assert "funsor" in message
    assert isinstance(excinfo.value, ValueError)


def test_discrete_site_without_enumerate_support() -> None:
    def model() -> None:
        count = numpyro.sample("count", dist.Poisson(3.0))
        numpyro.sample("y", dist.Normal(count, 1.0), obs=Y)

    with pytest.raises(UnsupportedModelError, match="'count'.*discrete"):
        check_model(model)


def _counts(y=None) -> None:
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
    with numpyro.plate("data", 3):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def _forgotten(message: str, name: str) -> bool:
    return message.startswith(
        f"Sample site '{name}' (Poisson) has no observed value: did you forget "
        "to pass its data (obs=...)?"
    )


@pytest.mark.parametrize("kwargs", [{}, {"y": None}])
def test_forgotten_observations_are_named_first(kwargs) -> None:
    with pytest.raises(UnsupportedModelError) as excinfo:
        check_model(_counts, (), kwargs)
    message = str(excinfo.value)
    assert _forgotten(message, "y")
    assert "argument 'y' is None" in message
    assert "Marginalise" in message  # the advice for a latent site comes after
    check_model(_counts, (), {"y": jnp.array([1, 0, 3])})  # with its data: fine


def test_forgotten_observations_through_the_driver() -> None:
    from numpyro_deer import DEERMALA, MCMC

    mcmc = MCMC(DEERMALA(_counts), num_warmup=5, num_samples=5)
    with pytest.raises(UnsupportedModelError) as excinfo:
        mcmc.run(jax.random.PRNGKey(0))  # y not passed
    assert _forgotten(str(excinfo.value), "y")


def test_a_discrete_last_site_may_be_a_forgotten_observation() -> None:
    def model(data) -> None:  # the observations come in under another name
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        numpyro.sample("counts", dist.Poisson(rate), obs=None)

    with pytest.raises(UnsupportedModelError) as excinfo:
        check_model(model, (jnp.array([1, 2]),))
    message = str(excinfo.value)
    assert _forgotten(message, "counts")
    assert "last site and nothing uses its value" in message


def test_continuous_site_marked_for_enumeration() -> None:
    def model() -> None:
        loc = numpyro.sample("loc", dist.Normal(), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(loc, 1.0), obs=Y)

    with pytest.raises(UnsupportedModelError, match="'loc'.*remove the 'enumerate'"):
        check_model(model)


def test_subsampled_plate() -> None:
    def model(y: jax.Array) -> None:
        loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
        with numpyro.plate("batch", y.shape[0], subsample_size=2) as idx:
            numpyro.sample("y", dist.Normal(loc, 1.0), obs=y[idx])

    with pytest.raises(UnsupportedModelError) as excinfo:
        check_model(model, (Y,))
    message = str(excinfo.value)
    assert "'batch'" in message
    assert "2 of 3" in message
    assert "Remove subsample_size" in message
    assert "HMCECS" in message


def test_plate_subsampling_everything_is_fine() -> None:
    def model(y: jax.Array) -> None:
        loc = numpyro.sample("loc", dist.Normal(0.0, 1.0))
        with numpyro.plate("batch", y.shape[0], subsample_size=y.shape[0]):
            numpyro.sample("y", dist.Normal(loc, 1.0), obs=y)

    check_model(model, (Y,))


def _delta_plain() -> None:
    loc = numpyro.sample("loc", dist.Normal())
    shifted = numpyro.sample("shifted", dist.Delta(loc + 1.0))
    numpyro.sample("y", dist.Normal(shifted, 1.0), obs=Y)


def _delta_to_event() -> None:
    loc = numpyro.sample("loc", dist.Normal().expand([3]).to_event(1))
    shifted = numpyro.sample("shifted", dist.Delta(loc + 1.0).to_event(1))
    numpyro.sample("y", dist.Normal(shifted, 1.0).to_event(1), obs=Y)


def _delta_in_plate() -> None:
    with numpyro.plate("rows", 3):
        loc = numpyro.sample("loc", dist.Normal())
        shifted = numpyro.sample("shifted", dist.Delta(loc + 1.0))
        numpyro.sample("y", dist.Normal(shifted, 1.0), obs=Y)


@pytest.mark.parametrize("model", [_delta_plain, _delta_to_event, _delta_in_plate])
def test_latent_delta_site(model) -> None:
    with pytest.raises(UnsupportedModelError) as excinfo:
        check_model(model)
    message = str(excinfo.value)
    assert "'shifted'" in message
    assert "numpyro.deterministic('shifted', value)" in message


def test_observed_delta_and_factor_are_fine() -> None:
    def model() -> None:
        loc = numpyro.sample("loc", dist.Normal())
        numpyro.factor("penalty", -(loc**2))
        numpyro.sample("y", dist.Delta(0.0), obs=0.0)

    check_model(model)


def test_every_problem_is_reported() -> None:
    def model(y: jax.Array) -> None:
        count = numpyro.sample("count", dist.Poisson(3.0))
        numpyro.sample("fixed", dist.Delta(1.0))
        with numpyro.plate("batch", y.shape[0], subsample_size=1):
            numpyro.sample("y", dist.Normal(count, 1.0), obs=y[:1])

    with pytest.raises(UnsupportedModelError) as excinfo:
        check_model(model, (Y,))
    message = str(excinfo.value)
    assert all(name in message for name in ("'count'", "'fixed'", "'batch'"))


@pytest.mark.parametrize("name", sorted(BENCHMARK_MODELS))
def test_benchmark_models_pass(name: str) -> None:
    bench = BENCHMARK_MODELS[name]
    args, kwargs = bench.make_data()
    check_model(bench.model, args, kwargs, jax.random.PRNGKey(1))


@pytest.mark.parametrize(
    ("model", "make_data"),
    [
        (models.gaussian_mean_model, models.make_gaussian_mean_data),
        (models.beta_bernoulli, models.make_beta_bernoulli_data),
        (models.dirichlet_categorical, models.make_dirichlet_categorical_data),
    ],
)
def test_closed_form_models_pass(model, make_data) -> None:
    args, kwargs = make_data()
    check_model(model, args, kwargs)


def test_improper_prior_and_batched_keys() -> None:
    def model() -> None:
        loc = numpyro.sample("loc", dist.ImproperUniform(dist.constraints.real, (), ()))
        numpyro.sample("y", dist.Normal(loc, 1.0), obs=Y)

    check_model(model, rng_key=jax.random.split(jax.random.PRNGKey(0), 4))


def test_check_is_invisible_to_enclosing_handlers() -> None:
    args, kwargs = models.make_eight_schools_data()
    with trace() as outer:
        check_model(models.eight_schools, args, kwargs)
    assert outer == {}


# --------------------------------------------------------------------------
# Python control flow on latent values
# --------------------------------------------------------------------------


def _if_on_latent() -> None:
    loc = numpyro.sample("loc", dist.Normal())
    if loc > 0:
        numpyro.sample("y", dist.Normal(loc, 1.0), obs=Y)


def _int_of_latent() -> None:
    loc = numpyro.sample("loc", dist.Normal())
    numpyro.sample("y", dist.Normal(int(loc), 1.0), obs=Y)


def _range_of_latent() -> None:
    loc = numpyro.sample("loc", dist.Normal())
    total = 0.0
    for _ in range(jnp.abs(loc).astype(jnp.int32)):
        total = total + 1.0
    numpyro.sample("y", dist.Normal(total, 1.0), obs=Y)


@pytest.mark.parametrize(
    ("model", "jax_error"),
    [
        (_if_on_latent, jax.errors.TracerBoolConversionError),
        (_int_of_latent, jax.errors.ConcretizationTypeError),
        (_range_of_latent, jax.errors.TracerIntegerConversionError),
    ],
)
def test_control_flow_on_latent_value(model, jax_error) -> None:
    # Stock NumPyro builds this potential and evaluates it on concrete values.
    potential = partial(potential_energy, model, (), {})
    params = {"loc": jnp.array(0.5)}
    assert jnp.isfinite(potential(params))
    with pytest.raises(UnsupportedModelError) as excinfo:
        check_potential_traceable(potential, params)
    message = str(excinfo.value)
    assert model.__name__ in message  # the location of the offending line
    assert "jnp.where" in message and "jax.lax.cond" in message
    assert jax_error.__name__ in message
    # raised from None: the JAX frames of the original error are not printed
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__suppress_context__


def test_control_flow_error_through_the_driver_has_a_short_traceback() -> None:
    import traceback

    from numpyro_deer import DEERMALA, MCMC

    mcmc = MCMC(DEERMALA(_if_on_latent), num_warmup=5, num_samples=5)
    with pytest.raises(UnsupportedModelError, match="_if_on_latent") as excinfo:
        mcmc.run(jax.random.PRNGKey(0))
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__suppress_context__
    printed = "".join(traceback.format_exception(excinfo.value))
    assert "TracerBoolConversionError" in printed  # named in the message
    assert "The above exception was the direct cause" not in printed
    assert "During handling of the above exception" not in printed


def test_translate_tracer_errors_passes_other_errors_through() -> None:
    with pytest.raises(KeyError):
        with translate_tracer_errors():
            raise KeyError("unrelated")
    with translate_tracer_errors():
        pass


def test_translate_tracer_errors_as_decorator() -> None:
    @translate_tracer_errors()
    def energy(x: jax.Array) -> jax.Array:
        return jax.jit(lambda v: v if v > 0 else -v)(x)

    with pytest.raises(UnsupportedModelError, match="TracerBoolConversionError"):
        energy(jnp.array(1.0))


@pytest.mark.parametrize("stock", [False, True])
def test_non_finite_initial_potential_is_an_error(stock) -> None:
    # numpyro_deer.MCMC computes the initial state in the run (beside the
    # other programs' compiles), stock MCMC in the kernel's init: both raise
    from numpyro.infer import MCMC as StockMCMC

    from numpyro_deer import DEERMALA, MCMC

    def potential(z):
        return jnp.sum(z["x"] ** 2) + jnp.log(z["x"][0] - 1.0)  # log of -1

    driver = StockMCMC if stock else MCMC
    mcmc = driver(
        DEERMALA(potential_fn=potential, block_size=8),
        num_warmup=5,
        num_samples=8,
        progress_bar=False,
    )
    with pytest.raises(ValueError, match="potential energy at the initial parameters"):
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(3)})
