"""Elastic jobs under the real horovodrun, with loopback addresses as hosts (tier: cli).

Membership changes are driven by editing the discovery script's output or killing a worker; every wait is for a
marker file or the launcher's exit, bounded. The tests taking ``world`` run on that many hosts (one slot each) at
each of horovod.testing.fixtures.world_sizes (2 and 3; 5 and 8 in make soak).
"""

import os
import signal

import pytest

pytestmark = pytest.mark.cli

N = 24  # samples per epoch in elastic_worker.py


def check_history(finals, epochs, n=N, workers=3):
    """Identical parameters everywhere; each epoch committed once, in order; each sample seen in each epoch (``n``
    samples, at most ``workers`` workers)."""
    assert finals, "no worker finished"
    params = {tuple(f["params"]) for f in finals.values()}
    assert len(params) == 1, f"ranks disagree: {finals}"
    rank0 = [f for f in finals.values() if f["rank"] == 0][0]
    assert rank0["committed"] == list(range(epochs))
    for epoch in range(epochs):
        seen = rank0["seen"][str(epoch)]
        assert set(seen) == set(range(n)), f"epoch {epoch} lost samples: {sorted(set(range(n)) - set(seen))}"
        # Only the padding of a last, uneven round repeats samples: less than one batch per worker.
        assert len(seen) - n < 2 * workers, f"epoch {epoch} repeated samples: {sorted(seen)}"
    return rank0


def hosts(n):
    return [f"127.0.0.{i + 1}" for i in range(n)]


def test_killed_worker_training_goes_on_and_its_host_returns_after_cooldown(elastic_run, world):
    if world < 2:
        pytest.skip("one host: no survivor to go on")
    last = hosts(world)[-1]     # its worker is killed
    n = max(N, 6 * world)       # three batches a worker: every worker reaches the hold at batch 2
    run = elastic_run(hosts(world), ["-np", str(world), "--min-np", "1", "--blacklist-cooldown-range", "1", "2"],
                      {"ELASTIC_TEST_HOLD": "1:2", "ELASTIC_TEST_WAIT": f"{world}@3", "ELASTIC_TEST_N": str(n)})
    held = run.wait_for("hold.*", count=world)
    victim = [name for name in held if name.startswith(f"hold.{last}.")][0]
    os.kill(int(victim.rsplit(".", 1)[1]), signal.SIGKILL)
    run.release()
    assert run.finish() == 0, run.log()
    finals = run.finals()
    rank0 = check_history(finals, 4, n=n, workers=world)
    assert rank0["sizes"] == {"0": world, "1": world - 1, "2": world - 1, "3": world}, rank0
    returned = [k for k in finals if k.startswith(f"{last}.")]
    assert returned and returned[0] != victim[len("hold."):], "the blacklisted host did not come back"
    assert f"host {last} is blacklisted for" in run.log()


def test_added_host_joins_receives_the_state_and_trains_then_a_removed_host_leaves(elastic_run):
    # One host, then two, then one: the smallest job that grows and shrinks (the sizes are the scenario).
    run = elastic_run(["127.0.0.1"], ["-np", "1", "--min-np", "1", "--max-np", "3"],
                      {"ELASTIC_TEST_WAIT": "2@1,1@2"})
    run.wait_for("waiting.2.*")
    run.set_hosts(["127.0.0.1", "127.0.0.2"])
    run.wait_for("waiting.1.*", count=2)
    run.set_hosts(["127.0.0.1"])
    assert run.finish() == 0, run.log()
    finals = run.finals()
    rank0 = check_history(finals, 4)
    assert rank0["sizes"] == {"0": 1, "1": 2, "2": 1, "3": 1}, rank0
    joined = [name for name in run.markers("batches.127.0.0.2.*")]
    assert joined, "the added host never trained"
    with open(os.path.join(run.dir, joined[0])) as handle:
        epochs = {line.split()[0] for line in handle}
    assert epochs == {"1"}, "the new worker did not start from the survivor's epoch"
    log = run.log()
    assert "hosts updated (added)" in log and "hosts updated (removed)" in log and "removed 127.0.0.2:0" in log
    assert "ended with" not in log, "a worker failed: the removal was not graceful"


def test_every_worker_failing_ends_the_job_with_the_reason(elastic_run, world):
    run = elastic_run(hosts(world), ["-np", str(world), "--min-np", "1"], {"ELASTIC_TEST_FAIL_AT": "1"})
    assert run.finish() == 1
    log = run.log()
    assert "failing on purpose" in log
    assert "every worker of the elastic job failed" in log or "every host of the elastic job is blacklisted" in log


@pytest.mark.parametrize("flags, message", [
    (["--reset-limit", "0"], "number of resets during elastic job exceeded limit: 0"),
    (["--min-np", "2", "--elastic-timeout", "1"], "Timed out waiting for minimum number of slots"),
])
def test_limits_end_the_job_with_their_message(elastic_run, flags, message):
    # Two hosts, one lost: a limit (resets, the minimum of two) is what ends the job, at any size alike.
    run = elastic_run(["127.0.0.1", "127.0.0.2"], ["-np", "2", *flags] + ([] if "--min-np" in flags else
                                                                           ["--min-np", "1"]),
                      {"ELASTIC_TEST_HOLD": "0:1"})
    held = run.wait_for("hold.*", count=2)
    os.kill(int([n for n in held if n.startswith("hold.127.0.0.2.")][0].rsplit(".", 1)[1]), signal.SIGKILL)
    run.release()
    assert run.finish() == 1
    assert message in run.log()


def _elastic_task(out_dir):
    import numpy as np

    import horovod.numpy as hvd
    from horovod import elastic
    hvd.init()
    state = elastic.ObjectState(lambda obj: hvd.broadcast_object(obj, 0), hvd.rank, step=0)

    @elastic.run
    def train(state):
        while state.step < 3:
            hvd.allreduce(np.ones(2), name="x")
            state.step += 1
            state.commit()
        return hvd.rank(), hvd.size(), state.step
    return train(state)


def test_horovod_run_with_min_np_runs_elastically(tmp_path, world):
    import horovod
    results = horovod.run(_elastic_task, args=(str(tmp_path),), np=world, min_np=1,
                          hosts=",".join(f"{host}:1" for host in hosts(world)))
    assert results == [(rank, world, 3) for rank in range(world)]


def _rank_from_env():
    from horovod.runner.common.util.env import get_env_rank_and_size
    return get_env_rank_and_size()


def test_elastic_run_without_init_returns_every_rank_in_rank_order(world):
    """A function that never calls hvd.init() (Horovod's test_elastic_run.py) reports under the rank it was started
    with: every rank's value comes back, in rank order (each used to publish under rank 0, leaving one)."""
    import horovod
    results = horovod.run(_rank_from_env, num_proc=world, min_num_proc=world, max_num_proc=world,
                          hosts=f"localhost:{world},127.0.0.1:{world}")
    assert results == [(rank, world) for rank in range(world)]
