"""A small numpy training job for the elastic integration tests (run by horovodrun).

Markers under OUT (the tests wait for these, bounded):
    pid.<host>.<slot>.<pid>          written at start
    hold.<host>.<slot>.<pid>         reached HOLD=<epoch>:<batch>; waits for OUT/release
    waiting.<n>.<host>.<slot>        waiting (committing) until the job has n workers (WAIT=<n>@<epoch>,...)
    batches.<host>.<slot>.<pid>      one line per batch this process trained
    final.<host>.<slot>.<pid>.json   params and history at the end (rank 0 adds the committed epochs and indices)
FAIL_AT=<epoch>: every worker raises there.
"""

import json
import os
import sys
import time

import numpy as np

import horovod.numpy as hvd
from horovod import elastic

OUT = os.environ["ELASTIC_TEST_OUT"]
EPOCHS = int(os.environ.get("ELASTIC_TEST_EPOCHS", "4"))
N = int(os.environ.get("ELASTIC_TEST_N", "24"))
BATCH = 2
HOST = os.environ["HOROVOD_HOSTNAME"]
SLOT = os.environ["HOROVOD_LOCAL_RANK"]
ME = f"{HOST}.{SLOT}.{os.getpid()}"
HOLD = os.environ.get("ELASTIC_TEST_HOLD")
WAITS = dict(reversed(w.split("@")) for w in os.environ.get("ELASTIC_TEST_WAIT", "").split(",") if w)
FAIL_AT = os.environ.get("ELASTIC_TEST_FAIL_AT")


def touch(name, text=""):
    tmp = os.path.join(OUT, f".{name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, os.path.join(OUT, name))


def wait_for(path, what, limit=60.0):
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ME}: {what} did not happen within {limit}s")
        time.sleep(0.02)


touch(f"pid.{ME}")
hvd.init()
sampler = elastic.ElasticIndexSampler(N, shuffle=True, seed=7)
state = elastic.ObjectState(lambda obj: hvd.broadcast_object(obj, 0), hvd.rank, epoch=0, params=np.zeros(4),
                            sampler=sampler.state_dict(), seen={}, committed=[], sizes={})


@elastic.run
def train(state):
    while state.epoch < EPOCHS:
        want = WAITS.get(str(state.epoch))
        deadline = time.monotonic() + 60
        while want is not None and hvd.size() != int(want):
            touch(f"waiting.{want}.{HOST}.{SLOT}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ME}: the job never reached {want} workers")
            time.sleep(0.05)
            state.commit()  # raises HostsUpdatedInterrupt once the driver changed the hosts
        if FAIL_AT is not None and state.epoch == int(FAIL_AT):
            raise ValueError(f"{ME}: failing on purpose in epoch {state.epoch}")
        sampler.load_state_dict(state.sampler)
        indices = sampler.indices()
        for start in range(0, len(indices), BATCH):
            batch = indices[start:start + BATCH]
            if HOLD == f"{state.epoch}:{start // BATCH}":
                touch(f"hold.{ME}")
                wait_for(os.path.join(OUT, "release"), "release")
            grad = hvd.allreduce(np.array([sum(batch), len(batch), state.epoch, 1.0]), name="grad")
            everyone = hvd.allgather(np.array(batch, dtype=np.int64), name="seen")
            state.params = state.params + 0.01 * grad
            sampler.record_batch(start // BATCH, BATCH)
            state.sampler = sampler.state_dict()
            state.seen.setdefault(state.epoch, []).extend(int(i) for i in everyone)
            with open(os.path.join(OUT, f"batches.{ME}"), "a") as handle:
                handle.write(f"{state.epoch} {hvd.rank()} {hvd.size()}\n")
            state.commit()
        state.sizes[state.epoch] = hvd.size()
        state.committed.append(state.epoch)
        state.epoch += 1
        sampler.set_epoch(state.epoch)
        state.sampler = sampler.state_dict()
        state.commit()


train(state)
touch(f"final.{ME}.json", json.dumps({"rank": hvd.rank(), "size": hvd.size(), "params": state.params.tolist(),
                                     "committed": state.committed, "seen": state.seen, "sizes": state.sizes}))
print(f"{ME} done as rank {hvd.rank()} of {hvd.size()}", flush=True)
sys.exit(0)
