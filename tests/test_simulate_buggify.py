"""Faults inside the real code (issue 46, item 5; horovod.core.buggify): named points in the engine and the
negotiations that only the simulation turns on, by seed. With them on, the seed sweep keeps every invariant and every
answer and each point fires somewhere; in a real job every point is off; a seed replays exactly, buggify included,
from the one command a violation prints."""

import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections import Counter

import pytest

from horovod.core import buggify
from horovod.testing.spawn import spawn_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Peer (2-4 ranks), star (5-16) and tree (17 up: 17 has one relay level, 24 and 32 several relays).
SIZES = (2, 3, 4, 5, 8, 12, 17, 24, 32)
SEEDS = int(os.environ.get("HVD_BUGGIFY_SEEDS", "45"))   # make soak runs more
HORIZON = 60.0      # virtual seconds: a partition's detection takes 10


class BuggifyPointsFired(UserWarning):
    """How often each point fired in the sweep (shown in the warnings summary under make test's workers)."""


def _sweep_run(seed: int):
    pytest.importorskip("greenlet")
    from horovod.tools.simulate.replay import seeded
    return seeded(SIZES[seed % len(SIZES)], seed, varied=True, drawn_faults=True, buggify=True, horizon=HORIZON)


def _trace(job) -> str:
    return json.dumps([job.world.events_run, repr(job.world.now), sorted(job.points.fired.items()),
                       sorted(job.points.chances.items()), sorted(job.failed_at.items()),
                       [r.cycles for r in job.ranks], [str(r.error) for r in job.ranks],
                       sorted((str(k), repr(v)) for k, v in job._decided.items()), job.answers.results])


@pytest.mark.ranks
def test_with_the_fault_points_on_every_seed_keeps_every_invariant_and_answer_and_every_point_fires(capsys):
    # Each seed draws its faults, its per-rank workload and which points are on (and how often they fire); every
    # result is checked byte for byte. A violation raises InvariantViolation naming the seed and the command that
    # replays it (python -m horovod.tools.simulate --ranks N --seed S --varied --drawn-faults --buggify ...).
    began = time.process_time()
    fired, seeds_firing = Counter(), Counter()
    for seed in range(SEEDS):
        job = _sweep_run(seed)
        fired.update(job.points.fired)
        seeds_firing.update(job.points.fired.keys())
    line = (f"buggify: {SEEDS} seeds at {min(SIZES)}-{max(SIZES)} ranks in {time.process_time() - began:.1f} CPU-s; "
            f"fired (times, seeds): " + ", ".join(f"{name} {fired[name]}/{seeds_firing[name]}"
                                                 for name in sorted(buggify.POINTS)))
    with capsys.disabled():
        print("\n" + line)
    warnings.warn(BuggifyPointsFired(line))
    assert set(fired) == set(buggify.POINTS), f"never fired: {sorted(set(buggify.POINTS) - set(fired))}"


@pytest.mark.unit
def test_every_point_a_call_site_checks_is_registered_and_every_registered_point_is_checked():
    used = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "horovod")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as source:
                    text = source.read()
                used |= set(re.findall(r'(?:buggify\.(?:fires|late|held)|send_to_each)\([^"]*?"([a-z_]+\.[a-z_]+)"',
                                          text))
    assert used == set(buggify.POINTS)


@pytest.mark.unit
def test_the_points_are_off_unless_a_simulation_turns_them_on_and_off_again_after():
    assert buggify.ON is False and buggify.chances() == {}
    with buggify.enabled(3, stall=lambda seconds: None) as chances:
        assert buggify.ON is True and chances and set(chances) <= set(buggify.POINTS)
        with pytest.raises(RuntimeError):
            with buggify.enabled(4, stall=lambda seconds: None):
                pass
        with pytest.raises(KeyError):
            buggify.fires("no.such_point")
    assert buggify.ON is False and buggify.chances() == {}
    # The same seed enables the same points at the same chances; seeds differ in which.
    drawn = []
    for seed in range(8):
        with buggify.enabled(seed, stall=lambda seconds: None) as chances:
            drawn.append(tuple(sorted(chances.items())))
    with buggify.enabled(0, stall=lambda seconds: None) as chances:
        assert tuple(sorted(chances.items())) == drawn[0]
    assert len(set(drawn)) == len(drawn)


def _real_job(steps: int):
    """A real job's ranks: every collective's path, with every check of a point recorded (none may run)."""
    import numpy as np

    import horovod.numpy as hvd
    from horovod.core import buggify as points
    checked = []
    real_fires, real_late = points.fires, points.late
    points.fires = lambda name: checked.append(name) or real_fires(name)
    points.late = lambda timeout, name: checked.append(name) or real_late(timeout, name)
    hvd.init()
    for step in range(steps):
        handles = [hvd.allreduce_async(np.full(n + 1, step, np.float32), name=f"g.{n}") for n in range(6)]
        for handle in handles:
            hvd.synchronize(handle)
        hvd.allgather(np.ones((hvd.rank() + 1, 2)), name="gather")
        hvd.broadcast(np.arange(3.0), root_rank=0, name="bcast")
        hvd.allreduce(np.ones(100_000, np.float32), name="big")
    hvd.shutdown()
    return points.ON, points.chances(), checked


@pytest.mark.ranks
@pytest.mark.parametrize("negotiation,ranks", [("peer", 2), ("star", 3), ("tree", 3)])
def test_in_a_real_job_every_point_is_off(negotiation, ranks):
    results = spawn_ranks(_real_job, ranks, timeout=90, kwargs={"steps": 5},
                          env={"HOROVOD_NEGOTIATION": negotiation})
    assert results == [(False, {}, [])] * ranks


@pytest.mark.ranks
def test_a_seed_with_the_points_on_replays_exactly_and_from_the_command_it_prints():
    pytest.importorskip("greenlet")
    seed = 7        # 24 ranks: the tree, relays slow to forward among the points this seed fires
    first, second = _sweep_run(seed), _sweep_run(seed)
    assert first.points.fired and _trace(first) == _trace(second)
    # The command a violation of this seed would print runs the same job in another process.
    command = first.replay.command
    assert command.startswith(f"python -m horovod.tools.simulate --ranks 24 --seed {seed} --varied --drawn-faults "
                              f"--buggify"), command
    out = subprocess.run([sys.executable] + command.split()[1:], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{first.world.events_run} events, ended at {first.world.now:.6f} s" in out.stdout, out.stdout
    assert f"fired {dict(sorted(first.points.fired.items()))}" in out.stdout, out.stdout


@pytest.mark.unit
def test_a_violation_with_the_points_on_prints_the_command_that_replays_it():
    pytest.importorskip("greenlet")
    from horovod.tools.simulate.job import InvariantViolation
    from horovod.tools.simulate.mutants import planted
    with planted("batches reordered"):
        with pytest.raises(InvariantViolation) as caught:
            for seed in range(0, 40, len(SIZES)):       # (5 ranks: the star)
                _sweep_run(seed + 3)
    assert re.match(r"(?s)seed \d+: .* \(replay: python -m horovod\.tools\.simulate --ranks 5 --seed \d+ --varied "
                    r"--drawn-faults --buggify --horizon 60; buggify fired \{.*\}\)$", str(caught.value)), \
        str(caught.value)
