"""Autotune: the candidate search (pure, fake clock) and a real 2-rank job that tunes while staying correct."""

import pytest

from horovod.autotune import CSV_HEADER, MIB, SEEDS, Autotuner
from horovod.common.config import load_config
from horovod.testing import spawn_ranks


@pytest.mark.unit
def test_search_tries_seeds_then_neighbours_and_keeps_the_best(tmp_path):
    log = tmp_path / "autotune.csv"
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                          "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
                          "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6"})
    now = [0.0]
    applied = []
    tuner = Autotuner(config, lambda fusion, cycle: applied.append((fusion, cycle)), clock=lambda: now[0])
    # Pretend throughput peaks at 16 MiB fusion: cycles take less time the closer the threshold is to it.
    while not tuner.done:
        fusion_mb = tuner.current[0]
        now[0] += 0.001 * (1 + abs(fusion_mb - 16) / 16)
        tuner.record(1 << 20)
    assert applied[0] == (SEEDS[0][0] * MIB, SEEDS[0][1])
    assert tuner.current[0] == 16
    rows = log.read_text().splitlines()
    assert rows[0] == CSV_HEADER and len(rows) == 1 + 6 + 1
    assert rows[-1].split(",")[5] == str(16 * MIB)


@pytest.mark.unit
def test_explicit_settings_stay_fixed():
    config = load_config({"HOROVOD_AUTOTUNE": "1", "HOROVOD_FUSION_THRESHOLD": str(2 * MIB)})
    applied = []
    Autotuner(config, lambda fusion, cycle: applied.append((fusion, cycle)))
    assert applied == [(2 * MIB, SEEDS[0][1])]


def _tuned_job():
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
