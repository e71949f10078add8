"""Autotune: the Bayesian search's decisions on fake objectives (pure, no processes, fake clock) and a real 2-rank
job that tunes while staying correct."""

import csv
import math
import random
import sys

import pytest

from horovod.autotune import CSV_HEADER, CYCLE, FUSION, MIB, SEEDS, Autotuner, BayesianSearch, Dimension
from horovod.common.config import load_config
from horovod.testing import spawn_ranks


def _throughput(fusion_mb, cycle_ms, cache=1):
    """A fake objective: throughput peaks at 24 MiB and 3 ms, falls off smoothly, and the cache adds 10 %."""
    f = math.log2(fusion_mb + 1) - math.log2(25)
    c = math.log2(cycle_ms) - math.log2(3)
    return 1000.0 * math.exp(-0.08 * f * f - 0.12 * c * c) * (1.1 if cache else 1.0)


GRID = [(f, c) for f in (0, 1, 2, 4, 8, 16, 32, 64) for c in (1, 2.5, 5, 10, 25, 50, 100)]


def _drive(search, noise=0.03, seed=1):
    rng = random.Random(seed)
    decisions = []
    while True:
        decision = search.next()
        decisions.append(decision)
        if decision.settled:
            return decisions
        p = decision.point
        search.observe(p, _throughput(p["fusion_mb"], p["cycle_ms"], p.get("cache", 1)) * (1 + rng.gauss(0, noise)))


@pytest.mark.unit
def test_bayesian_search_beats_the_grid_on_a_fake_objective():
    search = BayesianSearch([FUSION, CYCLE], [{"fusion_mb": f, "cycle_ms": c} for f, c in SEEDS], max_samples=20)
    decisions = _drive(search)
    assert [tuple(d.point.values()) for d in decisions[:4]] == [(float(f), float(c)) for f, c in SEEDS]
    assert all(d.reason.startswith("seed") for d in decisions[:4])
    assert all("expected improvement" in d.reason for d in decisions[4:-1])
    assert len(search.tried) <= 20 and decisions[-1].reason.startswith("settled")
    kept = decisions[-1].point
    best_grid = max(_throughput(f, c) for f, c in GRID)
    assert _throughput(kept["fusion_mb"], kept["cycle_ms"]) >= 0.95 * best_grid, (kept, search.tried)
    again = _drive(BayesianSearch([FUSION, CYCLE], [{"fusion_mb": f, "cycle_ms": c} for f, c in SEEDS], 20))
    assert [d.point for d in again] == [d.point for d in decisions]    # same scores, same decisions


@pytest.mark.unit
def test_bayesian_search_needs_nothing_beyond_numpy(monkeypatch):
    for name in [n for n in sys.modules if n.split(".")[0] in ("sklearn", "scipy")] + ["sklearn", "scipy"]:
        monkeypatch.setitem(sys.modules, name, None)      # as on a plain install: numpy and cloudpickle only
    search = BayesianSearch([FUSION, CYCLE], [{"fusion_mb": f, "cycle_ms": c} for f, c in SEEDS], max_samples=20)
    decisions = _drive(search)
    assert len(decisions) > 5 and all("expected improvement" in d.reason for d in decisions[4:-1])
    kept = decisions[-1].point
    assert _throughput(kept["fusion_mb"], kept["cycle_ms"]) >= 0.95 * max(_throughput(f, c) for f, c in GRID)


@pytest.mark.unit
def test_bayesian_search_settles_early_on_a_flat_objective():
    search = BayesianSearch([FUSION, CYCLE], [{"fusion_mb": f, "cycle_ms": c} for f, c in SEEDS], max_samples=30)
    while not (decision := search.next()).settled:
        search.observe(decision.point, 500.0)
    assert len(search.tried) < 30 and "expected to improve" in decision.reason


@pytest.mark.unit
def test_bayesian_search_over_a_categorical_setting():
    cache = Dimension("cache", choices=(0, 1))
    seeds = [{"fusion_mb": f, "cycle_ms": c, "cache": 0} for f, c in SEEDS]
    decisions = _drive(BayesianSearch([FUSION, CYCLE, cache], seeds, max_samples=20))
    assert decisions[-1].point["cache"] == 1


@pytest.mark.unit
def test_autotuner_logs_each_try_and_why_it_settled(tmp_path):
    log = tmp_path / "autotune.csv"
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                          "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
                          "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "8"})
    now = [0.0]
    applied = []
    tuner = Autotuner(config, lambda fusion, cycle: applied.append((fusion, cycle)), clock=lambda: now[0])
    while not tuner.done:     # one cycle moves 1 MiB in a time set by the fake objective
        now[0] += (1 << 20) / _throughput(*tuner.current) / 1000
        tuner.record(1 << 20)
    assert applied[0] == (SEEDS[0][0] * MIB, SEEDS[0][1])
    rows = list(csv.reader(log.read_text().splitlines()))
    assert ",".join(rows[0]) == CSV_HEADER and 1 + 4 < len(rows) <= 1 + 8 + 1
    assert [r[7] for r in rows[1:5]] == [f"seed {i} of 4" for i in range(1, 5)]
    assert rows[-1][7].startswith("settled") and int(rows[-1][5]) == int(round(tuner.current[0] * MIB))
    best_grid = max(_throughput(f, c) for f, c in GRID)
    assert _throughput(*tuner.current) >= 0.85 * best_grid     # (8 samples only; 20 reach 0.95, above)


@pytest.mark.unit
def test_autotuner_says_what_it_does_each_phase_and_when_the_job_ended_first(tmp_path, capsys):
    log = tmp_path / "autotune.csv"
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                          "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
                          "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "8"})
    now = [0.0]
    tuner = Autotuner(config, lambda fusion, cycle: None, clock=lambda: now[0])
    while len(tuner.search.tried) < 5:      # the seeds and one more: the job then ends mid-search
        now[0] += (1 << 20) / _throughput(*tuner.current) / 1000
        tuner.record(1 << 20)
    tuner.finish()
    tuner.finish()                          # once only
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("horovod autotune: ") for line in lines), lines
    assert "tuning the fusion threshold and the cycle time on rank 0: 4 seed points" in lines[0] and str(log) in lines[0]
    assert "the 4 seed points are scored" in lines[1]
    assert "the search did not finish" in lines[2] and "after 5 of at most 8 candidates" in lines[2]
    rows = list(csv.reader(log.read_text().splitlines()))
    assert len(rows) == 1 + 5 + 1 and rows[-1][7].startswith("stopped: the job ended before the search settled")
    best = max(rows[1:6], key=lambda r: float(r[6]))
    assert rows[-1][4:7] == best[4:7]


@pytest.mark.unit
def test_time_spent_deciding_is_not_charged_to_the_next_point():
    """A slow decision (the Gaussian-process fit runs on the engine's thread) must not lower the score of the point it
    chose. The objective is flat, but a point's three samples run at 1.0x, 0.9x and 1.1x speed, so its median is
    exact only if its first sample is not charged with the decision before it."""
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
                          "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7"})
    now = [0.0]
    tuner = Autotuner(config, lambda fusion, cycle: None, clock=lambda: now[0])
    decide = tuner.search.next

    def slow_next():
        now[0] += 0.5           # as long as a whole sample
        return decide()

    tuner.search.next = slow_next
    while not tuner.done:
        now[0] += 0.25 * (1.0, 0.9, 1.1)[len(tuner._scores)]     # a cycle moves 1 MiB; the sample sets the pace
        tuner.record(1 << 20)
    assert len(tuner.search.tried) >= 6
    assert all(score == pytest.approx(4 * MIB) for _, score in tuner.search.tried), tuner.search.tried


@pytest.mark.unit
def test_explicit_settings_stay_fixed():
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_FUSION_THRESHOLD": str(2 * MIB)})
    applied = []
    Autotuner(config, lambda fusion, cycle: applied.append((fusion, cycle)))
    assert applied == [(2 * MIB, SEEDS[0][1])]


@pytest.mark.unit
def test_a_failing_decision_keeps_the_best_point_and_never_reaches_the_engine(tmp_path):
    """The tuner runs on the engine's thread: an error in its search must end the tuning, not the job."""
    log = tmp_path / "autotune.csv"
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                          "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0"})
    now = [0.0]
    applied = []
    tuner = Autotuner(config, lambda fusion, cycle: applied.append((fusion, cycle)), clock=lambda: now[0])
    decide = tuner.search.next

    def failing_next():
        if len(tuner.search.tried) >= 3:
            raise RuntimeError("the model broke")
        return decide()

    tuner.search.next = failing_next
    for _ in range(100):
        now[0] += 1.0 / _throughput(*tuner.current)
        tuner.record(1 << 20)
    best = max(SEEDS[:3], key=lambda s: _throughput(*s))
    assert tuner.done and applied[-1] == (best[0] * MIB, best[1]) and len(applied) == 4
    note = log.read_text().splitlines()[-1]
    assert "stopped" in note and "the model broke" in note, note


def _tuned_job(block_scikit_learn=False):
    import sys
    if block_scikit_learn:
        for name in [n for n in sys.modules if n.split(".")[0] in ("sklearn", "scipy")] + ["sklearn", "scipy"]:
            sys.modules[name] = None
    import numpy as np
    import horovod.numpy as hvd
    from horovod.runtime import basics
    hvd.init()
    xs = [np.arange(500 * (i + 1), dtype=np.float32) for i in range(10)]
    for _ in range(150):
        handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"g{i}") for i, x in enumerate(xs)]
        for x, h in zip(xs, handles):
            assert np.array_equal(h.result(), 2 * x)
    tuner = basics.context().engine.autotuner
    done = None if tuner is None else tuner.done
    hvd.shutdown()
    return done


@pytest.mark.ranks
def test_two_ranks_tune_while_results_stay_exact(tmp_path):
    log = tmp_path / "autotune.csv"
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log), "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3",
           "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "4"}
    assert spawn_ranks(_tuned_job, 2, timeout=90, env=env) == [True, None]   # the tuner runs on rank 0 only
    rows = log.read_text().splitlines()
    assert rows[0] == CSV_HEADER and len(rows) >= 3


@pytest.mark.ranks
def test_two_ranks_tune_with_the_model_without_scikit_learn(tmp_path):
    """A plain install has numpy and cloudpickle only: past the four seeds the model chooses, and the job goes on."""
    log = tmp_path / "autotune.csv"
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log), "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2",
           "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6"}
    assert spawn_ranks(_tuned_job, 2, timeout=90, env=env, kwargs={"block_scikit_learn": True}) == [True, None]
    notes = [row[7] for row in csv.reader(log.read_text().splitlines()[1:])]
    assert notes[:4] == [f"seed {i} of 4" for i in range(1, 5)], notes
    assert any("expected improvement" in n for n in notes) and notes[-1].startswith("settled"), notes
