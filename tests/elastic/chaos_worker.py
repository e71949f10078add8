"""The worker of the chaos trials (tests/elastic/test_chaos.py): a small paced numpy training job.

Markers under ELASTIC_TEST_OUT: ``pid.<host>.<slot>.<pid>`` at start, ``commit.<host>.<slot>.<pid>`` (one line
``<epoch> <batch> <rank> <size> <time>`` per committed step), ``final.<host>.<slot>.<pid>.json`` at the end; with
``CHAOS_SLOW_CONNECT``, ``connecting.<...>`` from the slow worker and ``meshing.<...>`` from the others as they make
the mesh.
"""

import json
import os
import time

import numpy as np

import horovod.numpy as hvd
from horovod import elastic

OUT = os.environ["ELASTIC_TEST_OUT"]
EPOCHS = int(os.environ.get("CHAOS_EPOCHS", "3"))
PACE = float(os.environ.get("CHAOS_PACE", "0.05"))
N = 24
BATCH = 2
ME = f"{os.environ['HOROVOD_HOSTNAME']}.{os.environ['HOROVOD_LOCAL_RANK']}.{os.getpid()}"


def touch(name, text=""):
    tmp = os.path.join(OUT, f".{name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, os.path.join(OUT, name))


touch(f"pid.{ME}")
if os.environ.get("CHAOS_SLOW_CONNECT"):
    from horovod.runtime import basics
    connect = basics.connect

    if os.environ["CHAOS_SLOW_CONNECT"] == os.environ["HOROVOD_HOSTNAME"]:
        # This worker has its place in the round but dawdles before it connects (the test kills it there), while
        # the others wait for it inside hvd.init().
        def slow_connect(*args, **kwargs):
            if not os.path.exists(os.path.join(OUT, "slowed")):
                touch("slowed")
                touch(f"connecting.{ME}")
                time.sleep(30)
            return connect(*args, **kwargs)
        basics.connect = slow_connect
    else:
        def marked_connect(*args, **kwargs):
            touch(f"meshing.{ME}")       # the test kills the slow worker once the others are this far
            return connect(*args, **kwargs)
        basics.connect = marked_connect
hvd.init()
sampler = elastic.ElasticIndexSampler(N, shuffle=True, seed=3)
state = elastic.ObjectState(lambda obj: hvd.broadcast_object(obj, 0), hvd.rank, epoch=0, params=np.zeros(4),
                            sampler=sampler.state_dict(), seen={}, committed=[])


@elastic.run
def train(state):
    while state.epoch < EPOCHS:
        sampler.load_state_dict(state.sampler)
        indices = sampler.indices()
        for start in range(0, len(indices), BATCH):
            batch = indices[start:start + BATCH]
            time.sleep(PACE)        # the step's own computation
            grad = hvd.allreduce(np.array([sum(batch), len(batch), state.epoch, 1.0]), name="grad")
            everyone = hvd.allgather(np.array(batch, dtype=np.int64), name="seen")
            state.params = state.params + 0.01 * grad
            sampler.record_batch(start // BATCH, BATCH)
            state.sampler = sampler.state_dict()
            state.seen.setdefault(str(state.epoch), []).extend(int(i) for i in everyone)
            state.commit()
            with open(os.path.join(OUT, f"commit.{ME}"), "a") as handle:
                handle.write(f"{state.epoch} {start // BATCH} {hvd.rank()} {hvd.size()} {time.time()}\n")
        state.committed.append(state.epoch)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.sampler = sampler.state_dict()
        state.commit()


train(state)
touch(f"final.{ME}.json", json.dumps({"rank": hvd.rank(), "size": hvd.size(), "params": state.params.tolist(),
                                     "committed": state.committed, "seen": state.seen}))
