"""The race: wall time to an accurate posterior, compilation and warmup included.

For every target (``benchmarks/gym_models.py``: Inference Gym posteriors with
their ground truth, and the benchmark models against stored NUTS references)
and every competitor (``benchmarks/race_samplers.py``) at every chain count,
one run in a fresh Python process (so each competitor compiles everything it
uses, as a user's first run does) warms up with the competitor's own
recommended warmup and then samples in segments until both errors are at or
below ``--thresholds``' smallest value or ``--budget-seconds`` have passed.

**Score.** With all draws after warmup pooled over chains, for every scalar
component ``i`` of every latent site (constrained scale):

* mean error ``max_i ((mean_i - m_i) / s_i)^2`` (about ``1/ESS``),
* second-moment error
  ``max_i (E[x_i^2] - m_i^2 - s_i^2)^2 / (2 s_i^4 + 4 m_i^2 s_i^2)``,
  the squared error of the second moment over its variance under a Gaussian
  with the true mean and sd (the Gym gives no fourth moments).

**Clock.** ``time.perf_counter`` from before the first trace to each segment's
end, the draws copied to the host. Errors are evaluated at segment ends and at
geometric draw counts inside segments; inside a segment the wall time and the
gradient count are interpolated linearly in draws (constant rate within a
segment). The first segment after warmup holds the compile of the sampling
program (and, for ``numpyro_deer.MCMC`` rows, the warmup itself: their first
segment is one ``mcmc.run`` with the warmup, as a user runs it, so that the
block programs compile while the warmup runs): its checkpoints are timed back
from its end at the second segment's time per draw (a run of ``k`` draws
waits for the compile and then draws at the steady rate), never before the
segment's start; while no second segment exists they hold the segment's end.
The time to a threshold is the first checkpoint at which the error is at or
below it (a single run: noisy by a factor of about 2 either way).

**Gradients and the critical path.** Next to the wall time, every checkpoint
(and every threshold reached) records three counts, from the warmup's start up
to that checkpoint (``benchmarks/_counts.py`` computes them):

* ``gradients``: all gradient-equivalents evaluated, every chain, warmup
  included. A *gradient-equivalent* is one evaluation of ``grad U`` or one
  Jacobian-vector (Hessian-vector) product through it. Under ``vmap`` the
  hardware also computes the masked lanes of chains that finished early; those
  are not counted.
* ``critical_path_gradients``: the longest chain of dependent
  gradient-equivalents, what a latency-bound accelerator waits for.
  Evaluations side by side (chains under ``vmap`` or on their own cores, the
  steps of a block, Hutchinson probes, basis vectors) count once.

  - NUTS: per iteration its ``num_steps`` (leapfrog steps, one gradient each).
    Vectorized chains move in lockstep: ``sum_t max_c num_steps[c, t]``; a
    chain per core (or one chain): ``max_c sum_t num_steps[c, t]``.
  - ChEES, MEADS, adjusted MCLMC (vectorized): per iteration the integration
    steps of the longest trajectory over chains (BlackJAX's
    ``num_integration_steps``; GHMC: 1), summed over warmup and sampling.
    Adjusted MCLMC's tuning reports a total per chain: its maximum over
    chains (a lower bound of the lockstep count).
  - Sequential MALA / HMC (``method="sequential"``): every transition, one
    gradient per MALA step and ``L`` per HMC transition (the gradient is
    carried), plus one at each block's start. ``L`` is the run's
    ``state.num_steps`` (``DEERHMC(num_steps="auto")`` chooses it at the end
    of warmup; warmup's transitions take 4).
  - A DEER block of ``B`` transitions (``newton_iterations`` and
    ``block.info.front`` extra fields), counted by
    ``numpyro_deer.core.warmup_cost.solve_costs`` (the parallel warmup's own
    count): per Newton iteration the step function's ``g`` dependent
    gradients for each of the ``B`` steps (MALA 2: it recomputes ``grad U``
    at its start; HMC ``L + 1``) and their tangents, ``2 g`` on the path and
    ``B g (1 + P)`` in all, with ``P`` the Jacobian estimate's products per
    step (Hutchinson: ``num_probes``; exact diagonal or full: ``D``); the
    sweep's sequential segments (1 + ``sweep`` carried transitions per
    iteration after ``sweep_after``); the sequential fallback's ``1 + (B -
    front)`` carried transitions when the front stops short; the Hessian
    solve basis's mean Hessian (``K = 16`` points, ``K (1 + D)`` in all, 2 on
    the path) where the kernel takes it. Vectorized chains: each block's
    Newton loop runs until its slowest chain's solve ends, then the longest
    fallback.
  - Warmup of ``DEERMALA``/``DEERHMC`` (NumPyro's adaptation, one step
    function per draw): ``num_warmup * g`` per chain; the initial step size
    search and the Hessian mass matrix's window ends are not counted.
  - The parallel warmup of the ``_pw`` rows: its own report
    (``numpyro_deer.core.warmup_cost``: windows, fallback, the acceptance
    curves and ChEES choices between windows, the initial step size search);
    its sampling blocks as DEER blocks above (no solve basis Hessian).

* ``scan_levels``: the associative scan's ``ceil(log2 B)`` levels per Newton
  iteration (cheap elementwise products, no gradient), summed like the
  critical path.

Inside a segment all three are interpolated linearly in draws, like the wall
time. A block's draws all exist only once its program has run, and on an
accelerator a DEER block costs about the same whatever its length: the
interpolation inside a block favours the DEER rows (and the more, the longer
their blocks against the other rows' segments).

**A second process.** ``--compilation-cache DIR`` turns on JAX's persistent
compilation cache in ``DIR`` in every run, every competitor alike
(``common.use_compilation_cache``): run the same command twice and the second
times what a user waits for when running the same script again on the same
machine (tracing and lowering still count; XLA's compiles are loaded from
disk).

**Sampling loops.** NUTS samples after NumPyro's own warmup in a compiled
``lax.scan`` of its kernel per segment (``MCMC.run`` would recompile its loop
at every segment); MALA and DEER go through ``numpyro_deer.MCMC``, which
compiles its block loop once; BlackJAX samplers in a compiled ``lax.scan``.

Run from the repository root (JSON, figures and the table go to ``--out``;
``--samplers deer:1,16`` gives a sampler its own chain counts)::

    PYTHONPATH=. python3 benchmarks/race.py --quick --out benchmarks/results/race_cpu \
        --targets eight_schools --samplers nuts_dense:2 deer:1,4 chees:4

The table is printed last; ``--summarize --out DIR`` redraws it from
``DIR/race.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _counts import Counts  # noqa: E402
from common import (  # noqa: E402
    MASS_WORDS,
    adapt_mass_matrix,
    num_steps_word,
    use_compilation_cache,
)

THRESHOLDS = (1e-2, 1e-4)
COUNT_KEYS = ("gradients", "critical_path_gradients", "scan_levels")


class Tracker:
    """Running moments, errors against the truth and the clock of one run."""

    def __init__(self, truth, budget_s: float, stop_at: float, stream=None):
        self.stream = stream  # stream(snapshot) after every segment
        self.m = np.concatenate([t.mean for t in truth.values()])
        self.s = np.concatenate([t.sd for t in truth.values()])
        self.var2 = 2 * self.s**4 + 4 * self.m**2 * self.s**2
        self.budget_s, self.stop_at = budget_s, stop_at
        self.t0 = time.perf_counter()
        self.warmup_s = self.counts_warmup = None
        self.n = 0  # draws per chain
        self.s1 = self.s2 = 0.0
        self.counts = Counts()
        self.t_last = None
        self.checkpoints: list[dict] = []
        self.first = None  # the first segment: (its checkpoints, draws, start, end)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def warmup_done(self, counts: Counts, in_first_segment: bool = False) -> None:
        """The warmup's end (``in_first_segment``: it runs in the first
        segment's call, and its time is not known apart)."""
        self.t_last = self.now()
        self.warmup_s = None if in_first_segment else self.t_last
        self.counts_warmup = self.counts = counts

    def errors(self, s1, s2, count):
        mean, second = s1 / count, s2 / count
        return (
            float(np.max(((mean - self.m) / self.s) ** 2)),
            float(np.max((second - self.m**2 - self.s**2) ** 2 / self.var2)),
        )

    def segment(self, s1, s2, chains: int, counts: Counts) -> None:
        """Add a segment: per-draw sums over chains of ``x`` and ``x**2`` (n, D),
        and the segment's gradient counts."""
        t_end, n = self.now(), s1.shape[0]
        if self.first is not None:  # time the first segment back at this rate
            _time_back(*self.first, (t_end - self.t_last) / n)
            self.first = None
        first = not self.checkpoints
        c1 = self.s1 + np.cumsum(s1.astype(np.float64), 0)
        c2 = self.s2 + np.cumsum(s2.astype(np.float64), 0)
        total = self.n + np.arange(1, n + 1)
        grid = np.unique(np.round(2 ** np.arange(0, 40, 0.25)).astype(int))
        marks = [int(j) - self.n - 1 for j in grid if self.n < j < self.n + n] + [n - 1]
        for j in marks:
            frac = (j + 1) / n
            e1, e2 = self.errors(c1[j], c2[j], total[j] * chains)
            wall = t_end if first else self.t_last + frac * (t_end - self.t_last)
            self.checkpoints.append({
                "wall_s": wall,
                "draws_per_chain": int(total[j]),
                **(self.counts + counts.scaled(frac)).as_dict(),
                "err_mean": e1, "err_second": e2,
            })  # fmt: skip
        if first:
            self.first = (list(self.checkpoints), n, self.t_last, t_end)
        self.s1, self.s2, self.n = c1[-1], c2[-1], self.n + n
        self.counts = self.counts + counts
        self.t_last = t_end
        if self.stream is not None:
            self.stream({"warmup_s": self.warmup_s, "checkpoints": self.checkpoints})

    def done(self) -> bool:
        """Stop at the budget, or at the accuracy after two segments at least
        (the second times the first); always after one segment at least."""
        if not self.checkpoints:
            return False
        last = self.checkpoints[-1]
        accurate = max(last["err_mean"], last["err_second"]) <= self.stop_at
        return self.now() >= self.budget_s or (accurate and self.first is None)

    def reached(self, thr: float) -> dict | None:
        """The first checkpoint with both errors at or below ``thr``."""
        return _first_at(self.checkpoints, thr)


def _first_at(checkpoints: list[dict], thr: float) -> dict | None:
    for c in checkpoints:
        if max(c["err_mean"], c["err_second"]) <= thr:
            return c
    return None


def reached_table(checkpoints: list[dict]) -> dict:
    """Per threshold, the wall time and counts of the first checkpoint at or
    below it (``None``: not reached)."""
    return {
        str(thr): (c and {k: c[k] for k in ("wall_s", *COUNT_KEYS)})
        for thr in THRESHOLDS
        for c in [_first_at(checkpoints, thr)]
    }


def _time_back(marks: list[dict], draws: int, start: float, end: float, rate):
    """A first segment's checkpoints ``marks`` (``draws`` per chain, from
    ``start`` to ``end``) timed back from its end at ``rate`` seconds per
    draw, never before its start."""
    for c in marks:
        c["wall_s"] = max(start, end - (draws - c["draws_per_chain"]) * rate)


def retime(row: dict) -> dict:
    """A row of the clock that interpolated its first segment after warmup
    linearly (before this clock), timed back from that segment's end as
    :class:`Tracker` times it now; ``reached`` recomputed. The segments are
    found in the checkpoints (wall time linear in draws within a segment)."""
    points = row.get("checkpoints") or []
    if row.get("warmup_s") is None or len(points) < 3:
        return row

    def slope(a, b):
        return (b["wall_s"] - a["wall_s"]) / (
            b["draws_per_chain"] - a["draws_per_chain"]
        )

    start = {"wall_s": row["warmup_s"], "draws_per_chain": 0}
    rate1 = slope(start, points[0])
    end = 0  # the first segment's last checkpoint
    while end + 1 < len(points) and np.isclose(
        slope(start, points[end + 1]), rate1, rtol=1e-6
    ):
        end += 1
    points = [dict(c) for c in points]
    # no second segment: the first segment's checkpoints hold its end
    rate2 = slope(points[end], points[end + 1]) if end + 1 < len(points) else 0.0
    last = points[end]
    _time_back(
        points[: end + 1],
        last["draws_per_chain"],
        start["wall_s"],
        last["wall_s"],
        rate2,
    )
    return {**row, "checkpoints": points, "reached": reached_table(points)}


# ----------------------------------------------------------------- worker
def run_one(spec: dict, stream=None) -> dict:
    """One competitor on one target with one chain count (in this process);
    ``stream(snapshot)`` after each segment (the worker prints it)."""
    import gym_models
    import jax
    import race_samplers

    if spec.get("x64"):
        jax.config.update("jax_enable_x64", True)
    if spec.get("compilation_cache"):
        use_compilation_cache(spec["compilation_cache"])
    target = gym_models.get_target(spec["target"])
    tracker = Tracker(target.truth, spec["budget_s"], min(THRESHOLDS), stream)
    out = {k: spec[k] for k in ("target", "sampler", "chains")}
    try:
        race_samplers.SAMPLERS[spec["sampler"]](target, spec["chains"], spec, tracker)
        out["status"] = "ok"
    except Exception as err:  # a competitor that fails is reported, not hidden
        out["status"] = f"failed: {type(err).__name__}: {str(err)[:300]}"
    out.update(
        warmup_s=tracker.warmup_s,
        counts_warmup=tracker.counts_warmup and tracker.counts_warmup.as_dict(),
        total_s=tracker.now(),
        draws_per_chain=tracker.n,
        checkpoints=tracker.checkpoints,
        reached=reached_table(tracker.checkpoints),
        source=target.source,
        reference_ess=target.reference_ess,
        dim=int(sum(t.mean.size for t in target.truth.values())),
        backend=jax.default_backend(),
    )
    return out


def _print_partial(snapshot: dict) -> None:
    print("PARTIAL " + json.dumps(snapshot), flush=True)


def run_subprocess(spec: dict, cpu_devices: int, grace_s: float) -> dict:
    """``run_one`` in a fresh process, killed ``grace_s`` after the budget
    (:func:`worker_row`: a timeout keeps its finished segments)."""
    env = dict(os.environ)
    if spec["platform"] == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        flag = f"--xla_force_host_platform_device_count={cpu_devices}"
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=spec["budget_s"] + grace_s,
        )
    except subprocess.TimeoutExpired as killed:
        return worker_row(spec, killed.stdout, "timeout")
    return worker_row(spec, proc.stdout, f"crashed: {proc.stderr[-500:]}")


def worker_row(spec: dict, stdout, status: str) -> dict:
    """The row a worker printed (its ``RESULT`` line), else ``status`` with
    the checkpoints of its last ``PARTIAL`` line: a worker killed after the
    budget (a last segment or the process's exit running long) keeps what it
    reached."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode(errors="replace")
    partial = {"checkpoints": []}
    for line in (stdout or "").splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
        if line.startswith("PARTIAL "):
            partial = json.loads(line[len("PARTIAL ") :])
    points = partial["checkpoints"]
    return {**spec, **partial, "status": status, "reached": reached_table(points)}


# ----------------------------------------------------------------- output
def best_rows(rows: list[dict], thr: float) -> dict:
    """Per (target, sampler): the chain count reaching ``thr`` soonest."""
    best = {}
    for r in rows:
        hit = (r.get("reached") or {}).get(str(thr))
        if not hit:
            continue
        key = (r["target"], r["sampler"])
        if key not in best or hit["wall_s"] < best[key][1]["wall_s"]:
            best[key] = (r["chains"], hit)
    return best


def _lowest_error(rows: list[dict], target: str) -> str:
    """``"; lowest: NAME (C) ERR at T s"`` over the runs of ``target``, or ``""``."""
    best = None
    for r in rows:
        for c in r.get("checkpoints") or [] if r["target"] == target else []:
            err = max(c["err_mean"], c["err_second"])
            if best is None or err < best[0]:
                best = (err, r["sampler"], r["chains"], c["wall_s"])
    if best is None:
        return ""
    return f"; lowest: {best[1]} ({best[2]}) {best[0]:.2g} at {best[3]:.0f} s"


def _count(hit: dict, key: str) -> float:
    """A count of a threshold hit (``"grads"`` in files of older races)."""
    return hit.get(key, hit.get("grads") if key == "gradients" else None)


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def sampler_plan(items: list[str]) -> dict[str, list[int] | None]:
    """``--samplers`` items (``NAME`` or ``NAME:C1,C2``) as name -> chain
    counts (``None``: ``--chains``'s). A name given twice runs every count
    given (``deerhmc:64 deerhmc:1024`` is ``deerhmc:64,1024``).

    Raises:
        ValueError: a name that is not a race sampler.
    """
    import race_samplers

    plan: dict[str, list[int] | None] = {}
    for item in items:
        name, _, counts = item.partition(":")
        if name not in race_samplers.SAMPLERS:
            raise ValueError(
                f"--samplers: unknown {name!r}; one of {list(race_samplers.SAMPLERS)}"
            )
        if not counts:
            plan.setdefault(name, None)
            continue
        given = [int(c) for c in counts.split(",")]
        plan[name] = list(dict.fromkeys((plan.get(name) or []) + given))
    return plan


def summary(rows: list[dict], targets: list[str], samplers: list[str]) -> list[str]:
    """Per target and threshold: the fastest sampler and DEER against it."""
    lines = [
        "| target | thr | winner (chains) | time s | deer (chains) | deer / winner "
        "| grads deer / winner | critical path deer / winner |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for thr in THRESHOLDS:
        best = best_rows(rows, thr)
        for t in targets:
            cands = {s: best[(t, s)] for s in samplers if (t, s) in best}
            if not cands:
                low = _lowest_error(rows, t)
                lines.append(
                    f"| {t} | {thr:g} | none reached{low} | - | - | - | - | - |"
                )
                continue
            win = min(cands, key=lambda s: cands[s][1]["wall_s"])
            wc, wh = cands[win]
            cell = f"| {t} | {thr:g} | {win} ({wc}) | {wh['wall_s']:.1f} |"
            if "deer" in cands:
                dc, dh = cands["deer"]
                ratio = dh["wall_s"] / wh["wall_s"]
                gr = _ratio(_count(dh, "gradients"), _count(wh, "gradients"))
                cp = _ratio(
                    _count(dh, "critical_path_gradients"),
                    _count(wh, "critical_path_gradients"),
                )
                cell += f" {dh['wall_s']:.1f} ({dc}) | {ratio:.2f} | {gr} | {cp} |"
            else:
                cell += " not reached | - | - | - |"
            lines.append(cell)
    return lines


def counts_table(rows: list[dict]) -> list[str]:
    """Every run: wall time, gradients and critical path to each threshold and
    at its last checkpoint (with the error there)."""

    def cell(hit):
        if not hit:
            return "- | - | -"
        cp = _count(hit, "critical_path_gradients")
        cp = f"{cp:.3g}" if cp is not None else "-"
        return f"{hit['wall_s']:.2f} | {_count(hit, 'gradients'):.3g} | {cp}"

    head = "| target | sampler | chains | status |"
    rule = "|---|---|---|---|"
    for thr in THRESHOLDS:
        head += f" s to {thr:g} | grads | critical path |"
        rule += "---|---|---|"
    head += " end: s | grads | critical path | error |"
    rule += "---|---|---|---|"
    lines = [head, rule]
    for r in rows:
        reached = r.get("reached") or {}
        line = (
            f"| {r['target']} | {r['sampler']} | {r['chains']} | {r['status'][:20]} |"
        )
        for thr in THRESHOLDS:
            line += f" {cell(reached.get(str(thr)))} |"
        last = (r.get("checkpoints") or [None])[-1]
        if last:
            err = max(last["err_mean"], last["err_second"])
            line += f" {cell(last)} | {err:.2g} |"
        else:
            line += " - | - | - | - |"
        lines.append(line)
    return lines


def plot(rows: list[dict], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for t in sorted({r["target"] for r in rows}):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in rows:
            if r["target"] != t or not r.get("checkpoints"):
                continue
            c = r["checkpoints"]
            err = [max(p["err_mean"], p["err_second"]) for p in c]
            ax.loglog(
                [p["wall_s"] for p in c], err, label=f"{r['sampler']} x{r['chains']}"
            )
        for thr in THRESHOLDS:
            ax.axhline(thr, color="grey", lw=0.5, ls="--")
        ax.set_xlabel("wall time, compilation and warmup included (s)")
        ax.set_ylabel("max standardized squared error (mean, 2nd moment)")
        ax.set_title(t)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(out / f"race_{t}.png", dpi=110)
        plt.close(fig)


# ------------------------------------------------------------------- main
def settings(ns) -> dict:
    quick = ns.quick
    return {
        "platform": ns.platform,
        "seed": ns.seed,
        "budget_s": ns.budget_seconds,
        "x64": False,
        "nuts_warmup": 300 if quick else 1000,
        "nuts_segment": 100 if quick else 500,
        "mala_warmup": ns.mala_warmup or (500 if quick else 1000),
        "block_size": ns.block_size or (512 if quick else 4096),
        "hmc_warmup": 300 if quick else 1000,
        "hmc_segment": 100 if quick else 500,
        "hmc_leapfrog": ns.hmc_leapfrog,
        "deerhmc_warmup": ns.mala_warmup or (500 if quick else 1000),
        "deer_warmup": ns.deer_warmup,
        "deer_mass": adapt_mass_matrix(ns.deer_mass),
        "pw_windows": ns.pw_windows,
        "pw_sequential": ns.pw_sequential,
        "pw_block": ns.pw_block,
        "compilation_cache": ns.compilation_cache,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--targets", nargs="+", default=None)
    parser.add_argument(
        "--samplers", nargs="+", default=None, help="names, each optionally NAME:C1,C2"
    )
    parser.add_argument("--chains", nargs="+", type=int, default=None)
    parser.add_argument("--budget-seconds", type=float, default=60.0)
    parser.add_argument("--out", default="benchmarks/results/race")
    parser.add_argument("--quick", action="store_true", help="small warmups and blocks")
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--mala-warmup", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hmc-leapfrog",
        type=num_steps_word,
        default="auto",
        help="DEERHMC's num_steps ('auto', its default, or a count)",
    )
    parser.add_argument(
        "--deer-warmup",
        default=None,
        help="passed to DEERMALA/DEERHMC as warmup= (a kernel without that "
        "argument fails the run)",
    )
    parser.add_argument(
        "--deer-mass",
        choices=MASS_WORDS,
        default=None,
        help="passed to DEERMALA/DEERHMC as adapt_mass_matrix= (default: "
        "theirs, 'auto')",
    )
    parser.add_argument(
        "--pw-windows",
        type=int,
        nargs="+",
        default=None,
        help="the _pw rows' warmup windows (default: WarmupSchedule's)",
    )
    parser.add_argument(
        "--pw-sequential",
        type=int,
        default=1,
        help="leading windows of the _pw rows' warmup run sequentially",
    )
    parser.add_argument(
        "--pw-block",
        type=int,
        default=None,
        help="the _pw rows' sampling block (default: race_samplers.PW_BLOCK)",
    )
    parser.add_argument(
        "--in-process", action="store_true", help="no fresh process per run"
    )
    parser.add_argument(
        "--compilation-cache",
        default=None,
        metavar="DIR",
        help="JAX's persistent compilation cache in DIR for every run, every "
        "competitor alike; run the same command twice: the second run times a "
        "user's second process of the same script",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=300.0,
        help="a run still going this long after its budget is killed (warmup "
        "cannot be cut short) and reported as a timeout, with the checkpoints "
        "of the segments it finished",
    )
    parser.add_argument(
        "--summarize",
        action="store_true",
        help="figures and table from --out's race.json",
    )
    parser.add_argument(
        "--retime",
        nargs="+",
        default=None,
        help="race JSON files of the earlier clock: seconds to each threshold "
        "before and after timing the first segment back from its end",
    )
    ns = parser.parse_args(argv)
    if ns.summarize:
        rows = json.loads((Path(ns.out) / "race.json").read_text())["rows"]
        return report(rows, Path(ns.out))
    if ns.retime:
        return retime_table(ns.retime)
    if ns.worker:
        row = run_one(json.loads(ns.worker), stream=_print_partial)
        print("RESULT " + json.dumps(row), flush=True)
        os._exit(0)  # the row is out: no wait for compiles still under way

    import gym_models
    import race_samplers

    targets = ns.targets or gym_models.available_targets()
    try:
        plan = sampler_plan(ns.samplers or list(race_samplers.SAMPLERS))
    except ValueError as error:
        parser.error(str(error))
    samplers = list(plan)
    if not race_samplers.blackjax_available():
        skipped = [s for s in samplers if s in race_samplers.BLACKJAX_SAMPLERS]
        samplers = [s for s in samplers if s not in skipped]
        if skipped:
            print(f"BlackJAX not importable: skipping {skipped}", flush=True)
    if not gym_models.gym_available():
        skipped = [t for t in targets if t in gym_models.GYM_TARGETS]
        targets = [t for t in targets if t not in skipped]
        if skipped:
            print(f"Inference Gym not importable: skipping {skipped}", flush=True)
    chains = ns.chains or ([1, 2] if ns.platform == "cpu" else [1, 4, 16, 64, 256])
    cores = os.cpu_count() or 1
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    base = settings(ns)
    rows = []
    for t in targets:
        for s in samplers:
            counts = plan[s] or chains
            if s in ("nuts_diag", "nuts_dense") and ns.platform == "cpu":
                counts = sorted({min(c, cores) for c in counts})  # one per core at most
            if s == "meads":
                counts = [c for c in counts if c % 4 == 0]  # MEADS folds chains in 4
            if s == "chees":
                counts = [c for c in counts if c >= 4]  # its criterion averages chains
            for c in counts:
                spec = {**base, "target": t, "sampler": s, "chains": c}
                if ns.in_process:
                    row = run_one(spec)
                else:
                    row = run_subprocess(spec, max(cores, c), ns.grace_seconds)
                rows.append(row)
                hit = {
                    k: v and round(v["wall_s"], 2)
                    for k, v in (row.get("reached") or {}).items()
                }
                print(f"{t} {s} x{c}: {row['status']}, reached {hit}", flush=True)
                (out / "race.json").write_text(
                    json.dumps({"settings": base, "versions": versions(), "rows": rows})
                    + "\n"
                )
    return report(rows, out)


def retime_table(paths: list[str]) -> list[dict]:
    """Print, per row of each file, the seconds to each threshold with the
    earlier clock and timed back (:func:`retime`)."""
    print(
        "| file | target | sampler (chains) | s to "
        + " | s to ".join(f"{t:g}, earlier / now" for t in THRESHOLDS)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(THRESHOLDS))
    rows = []
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            new = retime(row)
            cells = []
            for thr in THRESHOLDS:
                old_hit, new_hit = (r["reached"].get(str(thr)) for r in (row, new))
                cells.append(
                    " / ".join(
                        "-" if h is None else f"{h['wall_s']:.2f}"
                        for h in (old_hit, new_hit)
                    )
                )
            print(
                f"| {Path(path).name} | {row['target']} | {row['sampler']} "
                f"({row['chains']}) | " + " | ".join(cells) + " |"
            )
            rows.append(new)
    return rows


def report(rows: list[dict], out: Path) -> list[dict]:
    """Figures, ``summary.md`` and the table (printed last)."""
    targets = list(dict.fromkeys(r["target"] for r in rows))
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    plot(rows, out)
    lines = counts_table(rows) + [""] + summary(rows, targets, samplers)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    vs = {}
    for name in (
        "jax",
        "jaxlib",
        "numpyro",
        "blackjax",
        "optax",
        "inference_gym",
        "tfp-nightly",
    ):
        try:
            vs[name] = version(name)
        except PackageNotFoundError:
            vs[name] = None
    return vs


if __name__ == "__main__":
    main()
