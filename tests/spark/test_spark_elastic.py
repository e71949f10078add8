"""horovod.spark.run_elastic on a real local Spark cluster: the Python worker of one rank's Spark task is killed
mid-epoch; Spark starts the task again, the job re-forms and training finishes from the last commit."""

import os
import signal
import threading
import time

import numpy as np
import pytest

from horovod.testing.fixtures import live_processes
from spark_helpers import bounded, no_active_spark_jobs

pytestmark = pytest.mark.ranks

EPOCHS = 5
STEPS = 6
KILL_AT = (2, 3)  # (epoch, step) where rank 1 asks to be killed, once


def elastic_train(out):
    import horovod.numpy as hvd
    from horovod import elastic
    hvd.init()
    state = elastic.ObjectState(lambda obj: hvd.broadcast_object(obj, 0), hvd.rank, epoch=0,
                                params=np.zeros(3), committed=[])

    @elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            for step in range(STEPS):
                if (state.epoch, step) == KILL_AT and hvd.rank() == 1 and not os.path.exists(f"{out}/asked"):
                    open(f"{out}/asked", "w").close()
                    with open(f"{out}/.victim", "w") as handle:  # the agent: Spark's Python worker of this task
                        handle.write(f"{os.getppid()} {os.getpid()}")
                    os.replace(f"{out}/.victim", f"{out}/victim")
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:  # killed with its agent (parent-death signal)
                        time.sleep(0.05)
                    raise RuntimeError("the agent was not killed within 60s")
                grad = hvd.allreduce(np.array([state.epoch, step, 1.0]), op=hvd.Sum, name="grad")
                state.params = state.params + 0.01 * grad
            state.committed = state.committed + [state.epoch]
            state.epoch += 1
            state.commit()

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "params": state.params.tolist(), "committed": state.committed,
            "host": os.environ["HOROVOD_HOSTNAME"]}


def _kill_victim(out, killed, stop):
    path = os.path.join(out, "victim")
    while not os.path.exists(path):
        if stop.wait(0.05):
            return
    agent, worker = (int(v) for v in open(path).read().split())
    os.kill(agent, signal.SIGKILL)
    killed.extend([agent, worker])


@pytest.mark.slow
def test_killed_python_worker_mid_epoch_training_resumes_from_the_last_commit(spark, tmp_path):
    import horovod.spark
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=_kill_victim, args=(str(tmp_path), killed, stop), daemon=True)
    killer.start()
    try:
        results = bounded(spark, lambda: horovod.spark.run_elastic(
            elastic_train, args=(str(tmp_path),), num_proc=2, min_num_proc=2, start_timeout=120,
            elastic_timeout=120), 400)
    finally:
        stop.set()
        killer.join(5)
    assert len(killed) == 2, "the victim never asked to be killed"
    assert [r["rank"] for r in results] == [0, 1] and all(r["size"] == 2 for r in results)
    for r in results:
        assert r["committed"] == list(range(EPOCHS))  # no committed epoch lost or repeated
    np.testing.assert_array_equal(results[0]["params"], results[1]["params"])
    expected = sum(0.01 * np.array([2.0 * e, 2.0 * s, 2.0]) for e in range(EPOCHS) for s in range(STEPS))
    np.testing.assert_allclose(results[0]["params"], expected)  # the lost partial epoch left no trace
    assert any(r["host"].endswith(".1") for r in results)  # the replacement is the task's second attempt
    assert live_processes(killed) == []
    assert no_active_spark_jobs(spark)
