"""The result codes of a solve and the error ``on_failure="raise"`` raises.

The codes are pinned (a solve's ``info.result`` is an int array that users
store); every code has its own sentence; the raise path hands the caller the
very :class:`DEERConvergenceError` object built from the code on the host,
never one rebuilt from JAX's error text.
"""

import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_deer import DEERConvergenceError, DEERConvergenceWarning
from numpyro_deer.core import RESULTS
from numpyro_deer.core.newton import NewtonInfo, no_solve_info
from numpyro_deer.infer import convergence
from numpyro_deer.infer.loops import result_bits


def test_codes_are_pinned_ints_with_a_sentence_each():
    assert [(m.name, int(m)) for m in RESULTS] == [
        ("successful", 0),
        ("max_iterations_reached", 1),
        ("no_progress", 2),
        ("nonfinite", 3),
    ]
    messages = [m.message for m in RESULTS]
    assert all(isinstance(text, str) and text for text in messages)
    assert len(set(messages)) == len(messages)
    # the sentence starts with the reason's short name
    assert [text.split(":")[0] for text in messages] == [
        "converged",
        "iteration limit",
        "no progress",
        "non-finite",
    ]
    assert RESULTS.failures() == (
        RESULTS.max_iterations_reached,
        RESULTS.no_progress,
        RESULTS.nonfinite,
    )


@pytest.mark.parametrize("member", list(RESULTS))
def test_a_code_from_the_device_gives_its_member_and_sentence(member):
    code = jnp.asarray(int(member), jnp.int32)  # as info.result holds it
    assert RESULTS(int(code)) is member
    assert RESULTS.message(code) == member.message
    assert RESULTS.message(int(member)) == member.message
    # members are their codes: they compare with and enter arrays as ints
    assert bool(code == member)
    assert int(jnp.where(True, member, -1)) == int(member)


def test_unknown_code_is_an_error():
    with pytest.raises(ValueError, match="4 is not a valid RESULTS"):
        RESULTS.message(4)


def test_info_result_is_an_int_array():
    info = no_solve_info(jnp.float64)
    assert isinstance(info, NewtonInfo)
    assert info.result.dtype == jnp.int32
    assert bool(info.converged)
    failed = info._replace(result=jnp.asarray(RESULTS.nonfinite, jnp.int32))
    assert failed.result.dtype == jnp.int32
    assert not bool(failed.converged)


def test_result_bits_has_the_bit_of_every_failed_code():
    result = jnp.array([0, 1, 3, 2, 3], jnp.int32)
    failed = jnp.array([False, True, True, False, True])
    bits = int(result_bits(failed, result))
    assert bits == (1 << 1) | (1 << 3)  # code 2 is not of a failed block
    everything = int(result_bits(jnp.ones(4, bool), jnp.arange(4, dtype=jnp.int32)))
    assert everything == sum(1 << int(m) for m in RESULTS)


def test_warning_names_the_reason_of_every_code_seen():
    bits = (1 << RESULTS.no_progress) | (1 << RESULTS.nonfinite)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convergence.warn_unconverged(2, 10, "sequential", bits)
    (warning,) = caught
    assert issubclass(warning.category, DEERConvergenceWarning)
    text = str(warning.message)
    assert RESULTS.no_progress.message in text
    assert RESULTS.nonfinite.message in text
    assert RESULTS.max_iterations_reached.message not in text


@pytest.mark.parametrize("member", RESULTS.failures())
def test_error_is_built_from_the_code(member):
    error = DEERConvergenceError(jnp.asarray(int(member), jnp.int32))
    assert error.result is member
    assert member.message in str(error)
    assert "on_failure='raise'" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.result is member and str(copy) == str(error)


def _raising_program(record):
    """A compiled program that raises the package's error from the host, as
    the kernel does, and records the object the callback raised."""

    def callback(result):
        try:
            convergence.raise_unconverged(result)
        except DEERConvergenceError as error:
            record.append(error)
            raise

    @jax.jit
    def program(result):
        jax.lax.cond(
            jnp.any(result != 0),
            lambda: jax.debug.callback(callback, result),
            lambda: None,
        )
        return result + 1

    return program


def test_raise_path_gives_the_callbacks_error_object():
    record = []
    program = _raising_program(record)
    result = jnp.array([0, RESULTS.no_progress, RESULTS.nonfinite], jnp.int32)
    with pytest.raises(DEERConvergenceError) as caught:
        with convergence.reraise_convergence_error():
            program(result).block_until_ready()
            jax.effects_barrier()
    # the very object raised on the host (not one rebuilt from JAX's text),
    # for the first failing code
    (raised,) = record
    assert caught.value is raised
    assert caught.value.result is RESULTS.no_progress
    assert RESULTS.no_progress.message in str(caught.value)
    # a converged block raises nothing
    with convergence.reraise_convergence_error():
        np.testing.assert_array_equal(program(jnp.zeros(3, jnp.int32)), 1)
        jax.effects_barrier()


def _foreign_program():
    """A compiled program whose host callback raises an error not ours."""

    def callback(x):
        raise ValueError("not a convergence failure")

    @jax.jit
    def program(x):
        jax.debug.callback(callback, x)
        return x

    return program


def test_other_runtime_errors_pass_the_boundary_unchanged():
    # also after an error that was raised before the boundary and never
    # claimed (the stock MCMC path)
    stale = _raising_program([])
    with pytest.raises(jax.errors.JaxRuntimeError, match="DEERConvergenceError"):
        stale(jnp.array([RESULTS.nonfinite], jnp.int32)).block_until_ready()
        jax.effects_barrier()
    program = _foreign_program()
    with pytest.raises(jax.errors.JaxRuntimeError, match="not a convergence"):
        with convergence.reraise_convergence_error():
            program(jnp.zeros(())).block_until_ready()
            jax.effects_barrier()
