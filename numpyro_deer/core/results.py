"""Why a Newton solve stopped: the result codes and the solve's report.

A solve reports a :class:`RESULTS` code in :attr:`NewtonInfo.result`, an
``int32`` array (one code per solve, so it batches and crosses ``jit``,
``vmap`` and ``shard_map`` like any other array). :class:`RESULTS` is an
:class:`enum.IntEnum`: its members are the codes, each with the sentence that
says what it means, so a code read back from the device turns into words with
``RESULTS(code).message`` (or ``RESULTS.message(code)``), and ``list(RESULTS)``
or :meth:`RESULTS.failures` iterate the codes without counting them by hand.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax.numpy as jnp
from jax import Array


class _Message:
    """``RESULTS.message``: the sentence of a member, or of a code.

    On a member it is that member's sentence (``RESULTS.nonfinite.message``);
    on the class it is a function of a code, a Python int or a scalar array
    (``RESULTS.message(info.result)``).
    """

    def __get__(self, member, cls):
        if member is None:
            return lambda code: cls(int(code))._message
        return member._message


class RESULTS(enum.IntEnum):
    """Why a solve stopped: the codes of :attr:`NewtonInfo.result`.

    Members (code, meaning):

    - ``successful`` (0): every step of the block passed.
    - ``max_iterations_reached`` (1): ``max_iter * max_solves`` Newton
      iterations were spent first.
    - ``no_progress`` (2): a whole solve left the front where it was.
    - ``nonfinite`` (3): an iterate or a step value became inf or NaN.

    ``RESULTS(code)`` is the member of a code (a Python int or
    ``int(array)``); ``member.message`` or ``RESULTS.message(code)`` is its
    sentence; ``list(RESULTS)`` is every code, :meth:`failures` every code but
    ``successful``. Members are ints, so they compare with and go into arrays
    as their codes.
    """

    def __new__(cls, code: int, message: str):
        member = int.__new__(cls, code)
        member._value_ = code
        member._message = message
        return member

    successful = 0, "converged: every step of the block passed"
    max_iterations_reached = (
        1,
        "iteration limit: max_iter * max_solves Newton iterations were spent "
        "before every step passed",
    )
    no_progress = (
        2,
        "no progress: a whole solve of max_iter iterations left the front where it was",
    )
    nonfinite = (
        3,
        "non-finite: an iterate or a step value became non-finite (inf or NaN)",
    )

    message = _Message()

    @classmethod
    def failures(cls) -> tuple[RESULTS, ...]:
        """Every code but ``successful``, in code order."""
        return tuple(member for member in cls if member is not cls.successful)


class NewtonInfo(NamedTuple):
    """Outcome of a solve; failures are reported here, never hidden.

    Attributes:
        iterations: Newton iterations taken (all solves).
        solves: solves taken (restarts from the front plus one).
        result: why the solve stopped, a :class:`RESULTS` code (``int32``);
            ``RESULTS.message(result)`` says it in words.
        front: number of leading steps that passed (exact states).
        residual: ``max_t |s_t - f_t(s_{t-1})|`` over the passed steps: the
            certificate of the returned block.
        batch_iterations: iterations of the loop over the whole batch of
            chains the solve ran in (a solve of its own: ``iterations``; the
            batch paid the largest over its chains).
        straggler_iterations: iterations run afterwards on the small batch of
            the chains that had not converged
            (:func:`~numpyro_deer.core.batched.batched_deer_solve`; 0
            elsewhere).
    """

    iterations: Array
    solves: Array
    result: Array
    front: Array
    residual: Array
    batch_iterations: Array
    straggler_iterations: Array

    @property
    def converged(self) -> Array:
        """Every step of the block passed (``result == RESULTS.successful``)."""
        return self.result == RESULTS.successful


def no_solve_info(dtype) -> NewtonInfo:
    """The report of a block computed without a Newton solve (sequentially)."""
    zero = jnp.zeros((), jnp.int32)
    return NewtonInfo(zero, zero, zero, zero, jnp.zeros((), dtype), zero, zero)
