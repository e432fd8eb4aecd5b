"""Smoke test of the race (``benchmarks/race.py``) at tiny sizes.

The scoring is checked against exact moments; each competitor that is
importable here runs one tiny segment on eight schools against its stored
reference; the Inference Gym models' log densities are compared with the Gym's
``unnormalized_log_prob`` (skipped where the Gym is not installed).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import gym_models  # noqa: E402
import race  # noqa: E402
import race_samplers  # noqa: E402

# tests of benchmarks/, not of the package: a CI job of their own
pytestmark = pytest.mark.harness

TINY = {
    "platform": "cpu",
    "seed": 0,
    "budget_s": 0.0,  # one segment, then stop
    "x64": False,
    "nuts_warmup": 50,
    "nuts_segment": 20,
    "mala_warmup": 50,
    "block_size": 32,
    "hmc_warmup": 20,
    "hmc_segment": 10,
    "hmc_leapfrog": 2,
    "pw_windows": (8, 16),
    "pw_sequential": 1,
    "pw_block": 16,
    "pw_steps": (1, 2),
}


def test_tracker_scores_against_the_truth():
    truth = {"a": gym_models.Truth(np.array([1.0, -2.0]), np.array([2.0, 0.5]))}
    tracker = race.Tracker(truth, budget_s=1e9, stop_at=1e-4)
    tracker.warmup_done(race.Counts())
    # one draw per chain, two chains: x = m -/+ s, so the mean is exact and
    # the second moment is m^2 + s^2 exactly
    m, s = truth["a"]
    s1 = (2 * m)[None]
    s2 = ((m - s) ** 2 + (m + s) ** 2)[None]
    tracker.segment(s1, s2, chains=2, counts=race.Counts(4.0, 2.0, 1.0))
    c = tracker.checkpoints[-1]
    assert c["err_mean"] == pytest.approx(0.0, abs=1e-12)
    assert c["err_second"] == pytest.approx(0.0, abs=1e-12)
    hit = tracker.reached(1e-4)
    assert (hit["gradients"], hit["critical_path_gradients"]) == (4.0, 2.0)
    assert hit["scan_levels"] == 1.0
    # half the draws off by half an sd in one component: mean off by s/4
    tracker.segment(
        (2 * (m + [0.0, 0.25]))[None], s2, chains=2, counts=race.Counts(4.0, 2.0)
    )
    assert tracker.checkpoints[-1]["gradients"] == 8.0
    e1, _ = tracker.errors(tracker.s1, tracker.s2, 4)
    assert e1 == pytest.approx((0.125 / 0.5) ** 2, rel=1e-9)


def test_first_segment_is_timed_back_from_its_end():
    """The first segment (the sampling program's compile in it) is timed back
    from its end at the second segment's rate, never before its start; later
    segments are interpolated linearly."""
    truth = {"a": gym_models.Truth(np.array([0.0]), np.array([1.0]))}
    tracker = race.Tracker(truth, budget_s=1e9, stop_at=0.0)
    clock = iter([10.0, 20.0, 21.0, 40.0, 41.0])
    tracker.now = lambda: next(clock)
    tracker.warmup_done(race.Counts())  # at 10 s
    x, x2 = np.zeros((4, 1)), np.ones((4, 1))
    tracker.segment(x, x2, chains=1, counts=race.Counts())  # ends at 20 s
    assert [c["wall_s"] for c in tracker.checkpoints] == [20.0] * 4
    tracker.segment(x, x2, chains=1, counts=race.Counts())  # 4 draws in 1 s
    wall = {c["draws_per_chain"]: c["wall_s"] for c in tracker.checkpoints}
    assert wall == {
        1: 19.25, 2: 19.5, 3: 19.75, 4: 20.0,  # the first, timed back
        5: 20.25, 6: 20.5, 7: 20.75, 8: 21.0,  # the second, interpolated
    }  # fmt: skip
    # a first segment faster than the second's rate starts at its start
    tracker = race.Tracker(truth, budget_s=1e9, stop_at=0.0)
    clock = iter([0.0, 1.0, 41.0])
    tracker.now = lambda: next(clock)
    tracker.warmup_done(race.Counts(), in_first_segment=True)
    assert tracker.warmup_s is None
    tracker.segment(x, x2, chains=1, counts=race.Counts())
    tracker.segment(x, x2, chains=1, counts=race.Counts())  # 10 s per draw
    assert [c["wall_s"] for c in tracker.checkpoints[:4]] == [0.0, 0.0, 0.0, 1.0]


def test_a_killed_worker_keeps_its_streamed_checkpoints(capsys):
    """The worker prints a snapshot after every segment; a worker killed
    after the budget (its last segment or its exit running long) is a
    timeout that keeps the thresholds it reached, and a printed result
    wins over the snapshots."""
    truth = {"a": gym_models.Truth(np.array([0.0]), np.array([1.0]))}
    tracker = race.Tracker(truth, 1e9, 0.0, stream=race._print_partial)
    tracker.warmup_done(race.Counts())
    x, x2 = np.zeros((4, 1)), np.ones((4, 1))
    tracker.segment(x, x2, chains=1, counts=race.Counts(8.0, 4.0))
    tracker.segment(x + 5.0, x2 + 25.0, chains=1, counts=race.Counts(8.0, 4.0))
    printed = capsys.readouterr().out
    assert printed.count("PARTIAL ") == 2
    spec = {"target": "t", "sampler": "s", "chains": 1}
    row = race.worker_row(spec, printed.encode(), "timeout")
    assert row["status"] == "timeout"
    assert len(row["checkpoints"]) == len(tracker.checkpoints) == 8
    # exact moments from the first draw on: every threshold reached there
    assert row["reached"] == race.reached_table(tracker.checkpoints)
    assert row["reached"]["0.0001"]["wall_s"] == tracker.checkpoints[0]["wall_s"]
    assert row["reached"]["0.0001"]["gradients"] == 2.0  # a quarter segment
    done = printed + "RESULT " + '{"status": "ok"}' + "\n"
    assert race.worker_row(spec, done, "timeout") == {"status": "ok"}
    nothing = race.worker_row(spec, None, "timeout")
    assert nothing["checkpoints"] == [] and nothing["reached"]["0.01"] is None


def _available(sampler):
    if (
        sampler in race_samplers.BLACKJAX_SAMPLERS
        and not race_samplers.blackjax_available()
    ):
        pytest.skip("BlackJAX not installed")


@pytest.mark.parametrize(
    "sampler, chains",
    [
        ("nuts_diag", 1),
        ("mala_seq", 2),
        ("deer", 1),
        ("hmc_seq", 2),
        ("deerhmc", 2),
        ("deerhmc_auto", 2),
        ("deer_pw", 4),
        ("deerhmc_pw", 4),
        ("chees", 4),
        ("meads", 4),
        ("adjusted_mclmc", 4),
    ],
)
def test_competitor_runs_one_segment(sampler, chains):
    _available(sampler)
    row = race.run_one(
        {**TINY, "target": "eight_schools", "sampler": sampler, "chains": chains}
    )
    assert row["status"] == "ok", row["status"]
    assert row["draws_per_chain"] > 0
    warm = row["counts_warmup"]
    assert warm["gradients"] > 0
    assert 0 < warm["critical_path_gradients"] <= warm["gradients"]
    c = row["checkpoints"][-1]
    assert np.isfinite(c["err_mean"]) and np.isfinite(c["err_second"])
    assert c["gradients"] > warm["gradients"]
    assert warm["critical_path_gradients"] < c["critical_path_gradients"]
    assert c["critical_path_gradients"] <= c["gradients"]
    assert row["dim"] == 18  # mu, tau, theta_tilde (8) and the deterministic theta (8)


def test_compilation_cache_reaches_the_worker(tmp_path):
    """``--compilation-cache DIR``: the run's fresh process keeps its compiles
    in ``DIR`` (JAX's persistent cache, turned on in the worker only)."""
    spec = {
        **TINY,
        "target": "eight_schools",
        "sampler": "nuts_diag",
        "chains": 1,
        "compilation_cache": str(tmp_path),
    }
    row = race.run_subprocess(spec, cpu_devices=1, grace_s=120.0)
    assert row["status"] == "ok", row["status"]
    assert any(tmp_path.iterdir()), "no compile was written to the cache"


def test_summary_names_the_winner_and_ratio():
    def row(sampler, wall, grads):
        hit = {"wall_s": wall, "gradients": grads, "critical_path_gradients": grads / 2}
        return {
            "target": "t",
            "sampler": sampler,
            "chains": 1,
            "reached": {"0.01": hit},
        }

    lines = race.summary(
        [row("deer", 4.0, 10.0), row("nuts_diag", 2.0, 20.0)],
        ["t"],
        ["deer", "nuts_diag"],
    )
    assert "| t | 0.01 | nuts_diag (1) | 2.0 | 4.0 (1) | 2.00 | 0.50 | 0.50 |" in lines


@pytest.mark.parametrize("name", list(gym_models.GYM_TARGETS))
def test_gym_model_log_density_matches_the_gym(name):
    pytest.importorskip("inference_gym")
    pytest.importorskip("tensorflow_probability")
    target = gym_models.get_target(name)
    gaps = gym_models.gym_log_density_gap(target, num_points=4)
    # the same density up to a constant; float32 rounding of values of order 1e4
    scale = max(1.0, np.max(np.abs(gaps)))
    assert np.ptp(gaps) < 1e-5 * scale + 5e-3, gaps


def test_counts_table_lists_wall_time_gradients_and_critical_path():
    hit = {"wall_s": 2.5, "gradients": 4000.0, "critical_path_gradients": 250.0}
    rows = [
        {"target": "t", "sampler": "deer", "chains": 16, "status": "ok",
         "reached": {"0.01": hit, "0.0001": None},
         "checkpoints": [{**hit, "err_mean": 0.002, "err_second": 0.001}]},
        {"target": "t", "sampler": "nuts_diag", "chains": 1, "status": "timeout",
         "reached": {}},
    ]  # fmt: skip
    lines = race.counts_table(rows)
    assert lines[2] == (
        "| t | deer | 16 | ok | 2.50 | 4e+03 | 250 | - | - | - "
        "| 2.50 | 4e+03 | 250 | 0.002 |"
    )
    assert lines[3] == "| t | nuts_diag | 1 | timeout |" + " - |" * 10


def test_sampler_named_twice_runs_every_chain_count():
    plan = race.sampler_plan(["deerhmc:64", "hmc_seq:1024", "deerhmc:1024,64", "deer"])
    assert plan == {"deerhmc": [64, 1024], "hmc_seq": [1024], "deer": None}
    with pytest.raises(ValueError, match="unknown 'nuts'"):
        race.sampler_plan(["nuts:4"])


@pytest.mark.parametrize("flag, expected", [("true", True), ("hessian", "hessian")])
def test_deer_mass_reaches_the_kernels(flag, expected):
    """``--deer-mass`` becomes the DEER rows' ``adapt_mass_matrix``."""
    parser_settings = race.settings(
        race.argparse.Namespace(
            platform="cpu", seed=0, budget_seconds=1.0, quick=True, mala_warmup=None,
            block_size=None, hmc_leapfrog=4, deer_warmup=None, deer_mass=flag,
            pw_windows=None, pw_sequential=1, pw_block=None, compilation_cache=None,
        )
    )  # fmt: skip
    options = race_samplers._with_warmup_hook(
        race_samplers.numpyro_deer.DEERHMC, parser_settings, {"num_steps": 4}
    )
    assert options == {"num_steps": 4, "adapt_mass_matrix": expected}
