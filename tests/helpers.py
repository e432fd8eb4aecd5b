"""Small shared helpers for the tests."""

import sys
import threading
from collections import Counter
from concurrent.futures import Future

import jax
import jax.numpy as jnp

STOCK_RUN_CONFIG = {
    "block_size": 64,
    # 384 steps: six blocks of 64, which numpyro_deer.MCMC keeps (it fits the
    # block size to the run; stock MCMC cannot); thinning 3 does not divide
    # the block, so kept draws fall at other places in each block
    "mcmc": {"num_warmup": 150, "num_samples": 384, "thinning": 3},
    "extra": ("adapt_state.step_size", "newton_iterations", "deer_converged"),
}


def gaussian_data(value: float, n: int = 20):
    """Data for ``gaussian_mean_model``: ``n`` copies of ``value``, noise scale 1."""
    return (jnp.full((n,), value), 1.0), {}


def _caller_module() -> str:
    """The module of the innermost frame outside JAX (and this file): the
    code whose call made JAX compile."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and module.partition(".")[0] not in _JAX_MODULES:
            return module
        frame = frame.f_back
    return ""


_JAX_MODULES = frozenset({"jax", "jaxlib", "contextlib", "functools"})


class CompileLog:
    """XLA compilations by function name, from ``jax.monitoring``'s
    backend-compile events (the listener stays for the process).

    ``events`` lists every compilation as ``(function name, module)``, the
    module whose code asked JAX for it (see :func:`_caller_module`), and
    ``threads`` as ``(function name, thread name)``; ``traces`` counts the
    traces to a jaxpr by function name.
    """

    EVENT = "/jax/core/compile/backend_compile_duration"
    TRACE = "/jax/core/compile/jaxpr_trace_duration"
    OURS = ("warmup_loop", "block_step", "init_one", "step_size", "window_end")

    def __init__(self):
        self.names = Counter()
        self.events: list[tuple[str, str]] = []
        self.threads: list[tuple[str, str]] = []
        self.traces = Counter()
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event == self.TRACE:
            self.traces[str(kwargs.get("fun_name"))] += 1
        if event == self.EVENT:
            name = str(kwargs.get("fun_name"))
            self.names[name] += 1
            self.events.append((name, _caller_module()))
            self.threads.append((name, threading.current_thread().name))

    def ours(self) -> Counter:
        """Compilations of the kernel's and the driver's own programs."""
        return Counter(
            {n: c for n, c in self.names.items() if any(f in n for f in self.OURS)}
        )


_LOG = None


def compiled_now(lowered):
    """``compile_in_background`` that returns when every program is compiled."""
    futures = {}
    for name, low in lowered:
        futures[name] = Future()
        futures[name].set_result(low.compile())
    return futures


def compile_log() -> CompileLog:
    """The process's one :class:`CompileLog` (made on first use)."""
    global _LOG
    if _LOG is None:
        _LOG = CompileLog()
    return _LOG


def primitive_names(jaxpr, into_conds: bool = True) -> set:
    """The primitives of ``jaxpr`` and of every jaxpr inside it (loop
    bodies, nested jits and, with ``into_conds``, ``cond`` branches; without,
    only what runs whatever the data)."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        if eqn.primitive.name == "cond" and not into_conds:
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= primitive_names(inner, into_conds)
    return names
