"""Strong and weak scaling of a block solve split over devices, core and kernel.

One MALA block's time axis is split over 1, 2, 4, ... devices, measured two ways
(``--through``): ``core`` times one ``sharded_deer_solve`` of the target's
potential; ``kernel`` times what a NumPyro user runs,
``numpyro_deer.MCMC(DEERMALA(model, block_size=T, mesh=mesh))`` sampling
``--kernel-blocks`` blocks after a warmup of ``--kernel-warmup`` draws (see
``benchmarks/_scaling_kernel.py``). Both:

* **strong scaling**: the block size ``T`` is fixed (``--block-sizes``) and the
  device count grows; ideal is time ``t(1) / n``;
* **weak scaling**: the steps per device are fixed (``--per-device``), so
  ``T = per_device * n``; ideal is constant time. ``--per-device 1250000`` on
  8 devices is a block of 10^7 draws; a configuration that runs out of device
  memory is recorded as ``oom`` and the sweep goes on.

Each configuration is compiled once (the compile time is reported apart) and
timed over ``--repeats`` runs (median). The tape is generated on the devices,
already sharded along time. The unsharded ``deer_solve`` on one device is timed
as the baseline of each strong-scaling block size (with ``--baseline``; for
the kernel, the kernel without a mesh).

On a CPU-only machine the script exposes ``max(--devices)`` host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count``) before importing JAX, so
the sweep runs anywhere; host devices share the machine's cores, so CPU numbers
test the code path, not the scaling. Run from the repository root::

    python benchmarks/scaling.py --devices 1 2 4                  # CPU, minutes
    python benchmarks/scaling.py --devices 1 2 4 8 --block-sizes 65536 1048576 \\
        --per-device 131072 1250000 --dim 16 --baseline \\
        --json benchmarks/results/scaling.json                    # 8 GPUs

The table is printed last; full results go to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from functools import partial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--block-sizes",
        type=int,
        nargs="*",
        default=[2048],
        help="strong scaling: block sizes T (each must divide by every device count)",
    )
    parser.add_argument(
        "--per-device",
        type=int,
        nargs="*",
        default=[512],
        help="weak scaling: steps per device (T = per_device * devices)",
    )
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--model", choices=["gaussian", "logistic"], default="gaussian")
    parser.add_argument(
        "--num-obs", type=int, default=500, help="logistic model: observations"
    )
    parser.add_argument(
        "--jacobian", choices=["full", "diag", "stochastic"], default="stochastic"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--through",
        choices=["core", "kernel", "both"],
        default="both",
        help="time sharded_deer_solve, DEERMALA(mesh=...) through MCMC, or both",
    )
    parser.add_argument(
        "--kernel-warmup", type=int, default=200, help="kernel rows: warmup draws"
    )
    parser.add_argument(
        "--kernel-blocks", type=int, default=1, help="kernel rows: blocks per run"
    )
    parser.add_argument(
        "--max-draws",
        type=int,
        default=10_000_000,
        help="skip configurations whose block is larger than this",
    )
    parser.add_argument("--x64", action="store_true", help="float64 (default float32)")
    parser.add_argument(
        "--matmul-precision",
        default="highest",
        choices=["default", "high", "highest"],
        help="jax_default_matmul_precision; GPUs' default (TF32) stops DEER from "
        "converging on long float32 blocks",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also time the unsharded deer_solve on one device per block size",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="call jax.distributed.initialize() first (one process per host)",
    )
    parser.add_argument("--coordinator", help="with --distributed: host:port")
    parser.add_argument("--num-processes", type=int, help="with --distributed")
    parser.add_argument("--process-id", type=int, help="with --distributed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="benchmarks/results/scaling.json")
    return parser.parse_args(argv)


NS = _parse()
# Before JAX is imported: enough host devices for a CPU run (ignored by GPUs).
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (
        f"{_flags} --xla_force_host_platform_device_count={max(NS.devices)}".strip()
    )
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from benchmarks._scaling_kernel import (  # noqa: E402
    KernelBench,
    gaussian_model,
    logistic_model,
)
from numpyro_deer.core import (  # noqa: E402
    MALA,
    DEERSolver,
    deer_solve,
    make_step_fn,
    make_tape,
    sharded_deer_solve,
    time_mesh,
)

if NS.x64:
    jax.config.update("jax_enable_x64", True)
if NS.matmul_precision != "default":
    jax.config.update("jax_default_matmul_precision", NS.matmul_precision)
if NS.distributed:
    # CPU processes need a collectives backend; GPUs use NCCL whatever this says
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # None: taken from the cluster environment (SLURM, Open MPI, ...)
    jax.distributed.initialize(
        coordinator_address=NS.coordinator,
        num_processes=NS.num_processes,
        process_id=NS.process_id,
    )
LEAD = jax.process_index() == 0


# ------------------------------------------------------------------------ models
def gaussian(dim: int, seed: int):
    """Correlated Gaussian, covariance eigenvalues in [0.5, 2]; start at 0."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    eig = np.geomspace(0.5, 2.0, dim)
    precision = jnp.asarray((q / eig) @ q.T)

    def potential(x):
        return 0.5 * x @ precision @ x

    step_size = 0.5 * eig.min() * dim ** (-1 / 3)
    return potential, jnp.zeros(dim), step_size, gaussian_model(precision)


def logistic(dim: int, seed: int, num_obs: int):
    """Bayesian logistic regression, N(0, 1) prior; start at the MAP."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((num_obs, dim)) / np.sqrt(dim)
    w_true = rng.standard_normal(dim)
    y = np.where(rng.random(num_obs) < 1 / (1 + np.exp(-X @ w_true)), 1.0, -1.0)
    w = np.zeros(dim)
    for _ in range(25):  # Newton's method for the MAP, on the host
        p = 1 / (1 + np.exp(y * (X @ w)))
        grad = -X.T @ (y * p) + w
        hess = (X.T * (p * (1 - p))) @ X + np.eye(dim)
        w = w - np.linalg.solve(hess, grad)
    curvature = np.linalg.eigvalsh(hess).max()
    X_j, y_j = jnp.asarray(X), jnp.asarray(y)

    def potential(w):
        return jnp.sum(jnp.logaddexp(0.0, -y_j * (X_j @ w))) + 0.5 * w @ w

    step_size = 0.5 / curvature * dim ** (-1 / 3)
    return potential, jnp.asarray(w), step_size, logistic_model(X, y)


# ----------------------------------------------------------------------- running
def _devices(num: int) -> list:
    """``num`` devices, the same number from each process, ordered by process."""
    per_process = num // jax.process_count()
    chosen = []
    for process in range(jax.process_count()):
        mine = [d for d in jax.devices() if d.process_index == process]
        chosen += sorted(mine, key=lambda d: d.id)[:per_process]
    return chosen


def _print(*args, **kwargs) -> None:
    if LEAD:
        print(*args, **kwargs)


def _is_oom(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def _ready(tree):
    return jax.block_until_ready(tree)


class Bench:
    def __init__(self, ns: argparse.Namespace):
        dtype = jnp.float64 if ns.x64 else jnp.float32
        if ns.model == "gaussian":
            potential, x0, step_size, model = gaussian(ns.dim, ns.seed)
        else:
            potential, x0, step_size, model = logistic(ns.dim, ns.seed, ns.num_obs)
        self.kernel = KernelBench(
            model,
            ns.jacobian,
            ns.kernel_warmup,
            ns.kernel_blocks,
            ns.repeats,
            ns.seed,
            lambda n: time_mesh(_devices(n)),
        )
        self.ns, self.dtype = ns, dtype
        # host values, identical on every process: replicated inputs of `jit`
        self.x0 = np.asarray(x0, dtype)
        self.step_size = float(step_size)
        self.step_fn = make_step_fn(MALA(), potential, jnp.asarray(step_size, dtype))
        # no sweep: the sharded solver has none, so both solve alike
        self.solver = DEERSolver(jacobian=ns.jacobian, sweep=0)
        self.key = np.asarray(jax.random.PRNGKey(ns.seed))
        self._compiled: dict = {}

    def _tape(self, num_steps: int, sharding):
        make = jax.jit(
            partial(
                make_tape, num_steps=num_steps, dim=self.x0.shape[0], dtype=self.dtype
            ),
            out_shardings=sharding,
        )
        return _ready(make(np.asarray(jax.random.fold_in(self.key, 1))))

    def _compile(self, num_steps: int, num_devices: int | None):
        """Compiled solve and its tape; ``num_devices=None`` is ``deer_solve``."""
        cache_key = (num_steps, num_devices)
        if cache_key in self._compiled:
            return self._compiled[cache_key] + (0.0,)
        if num_devices is None:
            device = jax.devices()[0]
            sharding = jax.sharding.SingleDeviceSharding(device)
            fn = partial(deer_solve, self.step_fn, solver=self.solver)
        else:
            mesh = time_mesh(_devices(num_devices))
            sharding = NamedSharding(mesh, PartitionSpec("time"))
            fn = partial(
                sharded_deer_solve, self.step_fn, solver=self.solver, mesh=mesh
            )
        tape = self._tape(num_steps, sharding)
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(self.x0, tape, self.key).compile()
        compile_s = time.perf_counter() - start
        self._compiled[cache_key] = (compiled, tape)
        return compiled, tape, compile_s

    def run(self, num_steps: int, num_devices: int | None) -> dict:
        row = {
            "num_steps": num_steps,
            "devices": 1 if num_devices is None else num_devices,
            "sharded": num_devices is not None,
        }
        try:
            compiled, tape, compile_s = self._compile(num_steps, num_devices)
            times = []
            for _ in range(self.ns.repeats):
                start = time.perf_counter()
                states, aux, info = _ready(compiled(self.x0, tape, self.key))
                times.append(time.perf_counter() - start)
        except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
            if not _is_oom(error):
                raise
            self._compiled.pop((num_steps, num_devices), None)
            return {**row, "status": "oom", "error": str(error).splitlines()[0]}
        wall = float(np.median(times))
        iterations = int(info.iterations)
        row.update(
            status="ok",
            compile_s=compile_s,
            wall_s=wall,
            times_s=times,
            iterations=iterations,
            solves=int(info.solves),
            converged=bool(info.converged),
            front=int(info.front),
            residual=float(info.residual),
            s_per_iteration=wall / max(iterations, 1),
            draws_per_s=num_steps / wall,
            accept_rate=float(jnp.mean(aux.accepted)),
        )
        del states
        return row

    def run_kernel(self, num_steps: int, num_devices: int | None) -> dict:
        """``DEERMALA(mesh=...)`` through ``numpyro_deer.MCMC``; ``oom`` recorded."""
        try:
            return self.kernel.run(num_steps, num_devices)
        except Exception as error:  # noqa: BLE001 - recorded, the sweep goes on
            if not (_is_oom(error) or "block_size=" in str(error)):
                raise
            row = {"num_steps": num_steps, "devices": num_devices or 1}
            return {**row, "status": "oom", "error": str(error).splitlines()[0]}


def _sweep(bench: Bench, ns: argparse.Namespace, available: int) -> list[dict]:
    rows = []
    devices = sorted(set(ns.devices))

    def add(through, mode, num_steps, num_devices, reference=None):
        base = {
            "through": through,
            "mode": mode,
            "per_device": num_steps // (num_devices or 1),
        }
        processes = jax.process_count()
        if num_devices is not None and num_devices > available:
            row = {"num_steps": num_steps, "devices": num_devices, "status": "skipped"}
            row["error"] = f"only {available} devices"
        elif num_devices is not None and num_devices % processes:
            row = {"num_steps": num_steps, "devices": num_devices, "status": "skipped"}
            row["error"] = f"not a multiple of the {processes} processes"
        elif num_steps > ns.max_draws:
            row = {"num_steps": num_steps, "devices": num_devices, "status": "skipped"}
            row["error"] = f"T > --max-draws={ns.max_draws}"
        elif num_devices is not None and num_steps % num_devices:
            row = {"num_steps": num_steps, "devices": num_devices, "status": "skipped"}
            row["error"] = f"T not divisible by {num_devices}"
        elif through == "kernel":
            row = bench.run_kernel(num_steps, num_devices)
        else:
            row = bench.run(num_steps, num_devices)
        row = {**base, **row}
        if reference is not None and row.get("status") == "ok":
            if mode == "strong":
                row["speedup"] = reference["wall_s"] / row["wall_s"]
                row["efficiency"] = (
                    row["speedup"] * reference["devices"] / row["devices"]
                )
            else:
                row["efficiency"] = reference["wall_s"] / row["wall_s"]
        rows.append(row)
        _print(_line(row), flush=True)
        return row

    throughs = ["core", "kernel"] if ns.through == "both" else [ns.through]
    for through in throughs:
        for num_steps in ns.block_sizes:
            if ns.baseline and jax.process_count() == 1:
                add(through, "baseline", num_steps, None)
            reference = None
            for n in devices:
                row = add(through, "strong", num_steps, n, reference)
                if reference is None and row.get("status") == "ok":
                    reference = row
        for per_device in ns.per_device:
            reference = None
            for n in devices:
                row = add(through, "weak", per_device * n, n, reference)
                if reference is None and row.get("status") == "ok":
                    reference = row
    return rows


COLUMNS = [  # (key, header, format)
    ("through", "through", "{}"),
    ("mode", "mode", "{}"),
    ("num_steps", "T", "{}"),
    ("devices", "dev", "{}"),
    ("per_device", "T/dev", "{}"),
    ("iterations", "iter", "{:.4g}"),
    ("converged", "conv", "{}"),
    ("compile_s", "compile s", "{:.2f}"),
    ("wall_s", "wall s", "{:.4f}"),
    ("s_per_iteration", "s/iter", "{:.2e}"),
    ("draws_per_s", "draws/s", "{:.3g}"),
    ("speedup", "speedup", "{:.2f}"),
    ("efficiency", "eff", "{:.2f}"),
]


def _cells(row: dict) -> list[str]:
    cells = [
        "-" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in COLUMNS
    ]
    if row.get("status") != "ok":
        cells.append(f"{row.get('status')}: {row.get('error', '')}")
    return cells


def _line(row: dict) -> str:
    cells = _cells(row)
    pairs = zip(COLUMNS, cells, strict=False)
    line = " ".join(f"{head}={cell}" for (_, head, _), cell in pairs)
    return " ".join([line] + cells[len(COLUMNS) :])


def _table(rows: list[dict]) -> str:
    body = [_cells(row) for row in rows]
    header = [head for _, head, _ in COLUMNS]
    widths = [
        max([len(head)] + [len(cells[i]) for cells in body])
        for i, head in enumerate(header)
    ]

    def fmt(cells):
        out = [cells[0].ljust(widths[0])]
        out += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=False)]
        out += cells[len(widths) :]  # status note of a row that did not run
        return "  ".join(out)

    head = fmt(header)
    return "\n".join([head, "-" * len(head)] + [fmt(cells) for cells in body])


def main(ns: argparse.Namespace) -> None:
    devices = jax.devices()
    machine = {
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "num_devices": len(devices),
        "num_processes": jax.process_count(),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    bench = Bench(ns)
    config = {**vars(ns), "step_size": bench.step_size, "dtype": str(bench.dtype.dtype)}
    _print(
        f"# {machine['num_devices']} x {machine['device_kind']} ({machine['platform']})"
    )
    dtype = config["dtype"]
    _print(f"# model={ns.model} dim={ns.dim} jacobian={ns.jacobian} dtype={dtype}")
    if machine["platform"] == "cpu":
        _print(
            "# CPU host devices share the cores: this tests the code path, not scaling"
        )
    rows = _sweep(bench, ns, len(devices))
    if LEAD:
        os.makedirs(os.path.dirname(os.path.abspath(ns.json)), exist_ok=True)
        with open(ns.json, "w") as f:
            json.dump({"machine": machine, "config": config, "rows": rows}, f, indent=1)
    _print()
    _print(_table(rows))
    _print(f"\nwrote {ns.json}")


if __name__ == "__main__":
    main(NS)
