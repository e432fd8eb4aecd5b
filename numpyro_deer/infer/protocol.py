"""What :class:`numpyro_deer.MCMC` needs from a block kernel, declared.

A block kernel is a NumPyro ``MCMCKernel`` whose sampling phase is computed a
block of transitions at a time. The driver uses nothing of it beyond
:class:`BlockKernel` (the kernel: its settings, the run set-up, what
``method="auto"`` chose) and :class:`RunProgram` (the run set up by ``init``:
its steps as pure functions of the state and the model's arguments). A new
transition needs neither: it is a :class:`~numpyro_deer.core.Transition`
handed to :class:`~numpyro_deer.infer.kernel.DEERKernel`, which implements
both (see :class:`~numpyro_deer.DEERMALA` and :class:`~numpyro_deer.DEERHMC`,
each a transition and its arguments).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from jax.sharding import Mesh

from .method import MethodChoice


@runtime_checkable
class RunProgram(Protocol):
    """A run after ``init``: frozen; each step a pure function.

    ``args, kwargs`` are the model's arguments; ``batched`` says the state has
    a leading chain axis (vectorized chains, advanced together).
    """

    block_size: int
    """Transitions per block of this run (fitted to its length)."""

    @property
    def window_ends(self) -> tuple[int, ...]:
        """Iteration counts after which warmup runs :meth:`window_end` then
        :meth:`step_size` (when the warmup loop leaves them out)."""

    @property
    def adapts_step_size(self) -> bool:
        """Whether :meth:`step_size` runs after the initial state and each
        window end."""

    def key(self, method: str | None) -> tuple:
        """The compile-cache key of the run's programs (blocks by ``method``;
        ``None``: warmup's)."""

    def initialized(self, output: Any) -> Any:
        """The initial state from the initial program's output, checked."""

    def warmup(self, state, args, kwargs, batched: bool, window_end: bool) -> Any:
        """One warmup step (``window_end``: with the window end inside)."""

    def step_size(self, state, use, args, kwargs, batched: bool) -> Any:
        """The step size search and restart, where ``use``."""

    def window_end(self, state, args, kwargs, batched: bool) -> tuple[Any, Any]:
        """``(state, finite)``: the mass matrix of a window end."""

    def refill(self, state, args, kwargs, method: str, batched: bool) -> Any:
        """A new block by ``method`` where the buffer is used up."""

    def emit(self, state, k, batched: bool) -> Any:
        """The state after handing out buffer entry ``k``."""

    def postprocess(self, args, kwargs) -> Callable:
        """NumPyro's postprocessing of one chain's latent values."""


@runtime_checkable
class BlockKernel(Protocol):
    """A NumPyro kernel that :class:`numpyro_deer.MCMC` runs a block at a time.

    The kernel's arguments never change after construction; ``init`` (or
    :meth:`init_program` then :meth:`start`) sets up the run,
    :attr:`program`. The one thing a kernel keeps from a run for the next is
    what ``method="auto"`` measured (:meth:`remember_method`).
    """

    @property
    def program(self) -> RunProgram | None:
        """The run set up by the last ``init`` (``None`` before)."""

    @property
    def block_size(self) -> int:
        """The ``block_size`` argument (transitions per block, at most)."""

    @property
    def block_multiple(self) -> int:
        """Block sizes are multiples of this (a mesh's device count)."""

    @property
    def mesh(self) -> Mesh | None:
        """The mesh blocks are solved over, or ``None``."""

    @property
    def method(self) -> str:
        """The ``method`` argument: ``"auto"``, ``"deer"`` or ``"sequential"``."""

    @property
    def method_chosen(self) -> str:
        """The method blocks are computed with now."""

    @property
    def method_choice(self) -> MethodChoice | None:
        """What ``method="auto"`` chose, and why."""

    @property
    def on_failure(self) -> str:
        """What an unconverged block becomes (``"sequential"``, ...)."""

    def remember_method(self, choice: MethodChoice) -> None:
        """Keep ``method="auto"``'s choice for later runs."""

    def init_program(
        self,
        rng_key,
        num_warmup: int,
        init_params,
        model_args,
        model_kwargs,
        num_samples: int | None = None,
    ) -> Any:
        """Set up the run; the initial state's program (not run yet)."""

    def start(self, init: Any, call: Callable | None = None) -> Any:
        """The initial state of :meth:`init_program`'s program."""

    def postprocess_fn(self, model_args, model_kwargs) -> Callable:
        """NumPyro's ``MCMCKernel.postprocess_fn``."""


def is_block_kernel(kernel: Any) -> bool:
    """Whether ``kernel`` offers the block protocol (:class:`BlockKernel`)."""
    return isinstance(kernel, BlockKernel)
