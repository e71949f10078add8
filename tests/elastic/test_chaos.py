"""Elastic training under fire (issue 19): 20 seeded trials, each killing workers at a random moment (tier cli).

Each trial runs the real ``horovodrun`` on three loopback hosts (``127.0.0.1-3``, one slot each, ``--min-np 1``) with
the small paced job of ``chaos_worker.py`` and SIGKILLs, by the trial's seed:

* ``init``:   one random worker (rank 0 included) up to 1 s after all three started: inside ``hvd.init()`` (the
  rendezvous, the mesh) or its first steps;
* ``step``:   one random worker at a random moment of training (mid-step, inside ``commit()``);
* ``reset``:  one worker during training, then a second one as soon as the driver publishes the next round
  (during the reset's rendezvous and the state's sync);
* ``two``:    two workers at once during training.

Every trial must end with exit status 0, every epoch committed exactly once and in order, every sample of every
epoch trained, and identical parameters on every surviving rank. The recovery time (the kill to the next committed
step) of each trial is printed with the driver's own figure (its log's ``recovery:``), and the median and maximum
at the end (recorded in docs/elastic.md).
"""

import json
import os
import random
import re
import signal
import statistics
import time

import pytest

from elastic_run import ElasticRun

# One xdist group (make test runs timed tests with --dist loadgroup): the trials fill RECOVERIES, which the summary
# at the end reads in the same process.
pytestmark = [pytest.mark.cli, pytest.mark.timed, pytest.mark.xdist_group("chaos")]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos_worker.py")
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
PHASES = ["init", "step", "reset", "two", "step"]
TRIALS = 20
EPOCHS = 3
N = 24
RECOVERIES = {}     # trial -> kill to the next committed step in seconds (None: no step was left to commit)
STARTED = set()     # the trials begun in this process
# The slowest recovery a trial may take: about 0.1 s, 1.1 s where a reset's second kill waits for the next round
# (2-core VM); a worker waiting out a timeout (liveness 10 s, start 20 s) instead would take far longer.
RECOVERY_BOUND = 4.0


def _wait(predicate, run, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if run.proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s:\n{run.log()}")
        time.sleep(0.01)
    return True


def _live_pids(run):
    finished = {name[len("final."):-len(".json")] for name in run.markers("final.*.json")}
    return [(name, int(name.rsplit(".", 1)[1])) for name in (m[len("pid."):] for m in run.markers("pid.*"))
            if name not in finished and _alive(int(name.rsplit(".", 1)[1]))]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _committed(run):
    lines = []
    for name in run.markers("commit.*"):
        with open(os.path.join(run.dir, name)) as handle:
            lines += [line.split() for line in handle if line.strip()]
    return lines


def _kill(run, rng, count=1):
    live = _live_pids(run)
    victims = rng.sample(live, min(count, len(live)))
    for _, pid in victims:
        os.kill(pid, signal.SIGKILL)
    return time.time(), [name for name, _ in victims]


def _check(run):
    _check_epochs(run, EPOCHS)


def _check_epochs(run, epochs):
    finals = {}
    for name in run.markers("final.*.json"):
        with open(os.path.join(run.dir, name)) as handle:
            finals[name] = json.load(handle)
    assert finals, "no worker finished:\n" + run.log()
    assert len({tuple(f["params"]) for f in finals.values()}) == 1, f"ranks disagree: {finals}"
    rank0 = [f for f in finals.values() if f["rank"] == 0][0]
    assert rank0["committed"] == list(range(epochs)), rank0["committed"]
    for epoch in range(epochs):
        seen = rank0["seen"][str(epoch)]
        assert set(seen) == set(range(N)), f"epoch {epoch} lost samples {sorted(set(range(N)) - set(seen))}"


@pytest.mark.parametrize("trial", range(TRIALS))
def test_chaos_trial(tmp_path, trial):
    STARTED.add(trial)
    rng = random.Random(19_000 + trial)
    phase = PHASES[trial % len(PHASES)]
    run = ElasticRun(tmp_path, HOSTS, ["-np", "3", "--min-np", "1"],
                     {"CHAOS_EPOCHS": str(EPOCHS), "CHAOS_PACE": "0.05"}, script=WORKER)
    try:
        _wait(lambda: len(run.markers("pid.*")) >= 3, run, 60, "three workers")
        if phase == "init":
            time.sleep(rng.uniform(0.0, 1.0))
        else:
            _wait(lambda: bool(_committed(run)), run, 60, "a committed step")
            time.sleep(rng.uniform(0.0, 0.4))
        killed_at, victims = _kill(run, rng, 2 if phase == "two" else 1)
        if phase == "reset":
            _wait(lambda: "round 2:" in run.log(), run, 60, "the next round")
            victims += _kill(run, rng)[1]
        code = run.finish(timeout=90)
        assert code == 0, f"trial {trial} ({phase}, killed {victims}) failed:\n{run.log()}"
        _check(run)
        assert not _live_pids(run), "a worker outlived its job"
        # The next step committed by the new, smaller round (the killed hosts do not come back).
        after = sorted(float(line[4]) for line in _committed(run) if float(line[4]) > killed_at and int(line[3]) < 3)
        recovery = after[0] - killed_at if after else None
        driver = re.findall(r"recovery: ([0-9.]+) s", run.log())
        RECOVERIES[trial] = recovery
        print(f"trial {trial:2d} {phase:5s} killed {victims}: next commit "
              f"{'-' if recovery is None else f'{recovery:.2f} s'} after the kill; driver: {driver}")
    finally:
        run.close()


def test_a_worker_lost_while_the_first_round_connects_leads_to_a_new_round(tmp_path):
    # Seen from outside: the others waited 30 s for the mesh, raised HorovodInternalError from hvd.init() (outside
    # hvd.elastic.run) and the job failed. Now they give the round up as soon as the driver saw the failure.
    run = ElasticRun(tmp_path, HOSTS, ["-np", "3", "--min-np", "1"],
                     {"CHAOS_EPOCHS": "1", "CHAOS_SLOW_CONNECT": "127.0.0.2"}, script=WORKER)
    try:
        _wait(lambda: bool(run.markers("connecting.*")), run, 60, "the slow worker to be connecting")
        _wait(lambda: len(run.markers("meshing.*")) >= 2, run, 60, "the others inside hvd.init(), making the mesh")
        victim = run.markers("connecting.*")[0][len("connecting."):]
        killed = time.monotonic()
        os.kill(int(victim.rsplit(".", 1)[1]), signal.SIGKILL)
        assert run.finish(timeout=60) == 0, run.log()
        took = time.monotonic() - killed
        _check_epochs(run, 1)
        assert "round 2:" in run.log(), run.log()
        print(f"a worker killed while round 1 connected: the job finished {took:.1f} s later")
        # About 1.5 s (2-core VM); the survivors waiting for their start timeout would take 20 s.
        assert took < 6, f"{took:.1f} s: the survivors waited for their start timeout (20 s)?"
    finally:
        run.close()


def test_chaos_summary(request):
    """What it prints, asserted: every trial this process ran recovered, all of those selected (make test runs the
    module on one xdist worker: group "chaos"), and each kill was followed by a committed step within the bound."""
    if not STARTED:
        pytest.skip("no chaos trial ran in this process")
    selected = sum(1 for item in request.session.items if getattr(item, "originalname", "") == "test_chaos_trial")
    measured = [r for r in RECOVERIES.values() if r is not None]
    print(f"chaos: {len(RECOVERIES)}/{len(STARTED)} trials recovered ({selected} selected of {TRIALS}); kill -> next "
          f"committed step: median {statistics.median(measured) if measured else float('nan'):.2f} s, max "
          f"{max(measured, default=float('nan')):.2f} s over {len(measured)} trials that had steps left")
    assert sorted(RECOVERIES) == sorted(STARTED), f"trials {sorted(STARTED - set(RECOVERIES))} did not recover"
    assert len(STARTED) == selected, f"only {len(STARTED)} of the {selected} selected trials ran in this process"
    # A kill comes at most 0.4 s into training (3 epochs at 0.05 s a step): nearly every trial has steps left.
    assert len(measured) >= len(RECOVERIES) - 2, f"only {len(measured)} trials had a step to commit after the kill"
    assert max(measured, default=0.0) < RECOVERY_BOUND, f"a recovery took {max(measured):.2f} s: {RECOVERIES}"
