"""Horovod on Ray's own multi-node test cluster (several raylets on this machine), one cluster for the module.

Static: packed and spread workers get the local and cross ranks of the node Ray put them on, and collectives are
right across nodes. Elastic (last, as it kills a worker and adds a node): a worker actor killed with ``ray.kill``
mid-epoch, then a node added mid-job (tier ranks). The elastic job trains ``EPOCHS`` epochs of three averaged steps; each epoch adds ``3 * (epoch + 1)`` to every parameter
whatever the number of workers, so the final parameters and the list of committed epochs show that no committed
epoch was lost or repeated. Workers leave markers in a directory the test watches (bounded waits).
"""

import os
import threading
import time

import numpy as np
import pytest

from ray_clusters import add_node, multinode_ray

ray = pytest.importorskip("ray")
from horovod.ray import ElasticRayExecutor, RayExecutor  # noqa: E402

pytestmark = [pytest.mark.ranks, pytest.mark.serial]

EPOCHS = 5
KILL_EPOCH = 1
GROW_EPOCH = 3


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with multinode_ray(2, 2) as made:
        yield made


def placement_and_collectives():
    import os
    import horovod.numpy as hvd
    hvd.init()
    r, s = hvd.rank(), hvd.size()
    total = hvd.allreduce(np.arange(4, dtype=np.float64) * (r + 1), op=hvd.Sum)
    gathered = hvd.allgather(np.array([r], dtype=np.int64))
    return dict(rank=r, host=os.environ["HOROVOD_HOSTNAME"], local=(hvd.local_rank(), hvd.local_size()),
                cross=(hvd.cross_rank(), hvd.cross_size()), total=total.tolist(), gathered=gathered.tolist())


def _run(**kwargs):
    extra = kwargs.pop("extra_env_vars", None)
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=30), **kwargs)
    try:
        ex.start(extra_env_vars=extra)
        return ex.run(placement_and_collectives)
    finally:
        ex.shutdown()


def _check_sums(results):
    size = len(results)
    for r in results:
        assert r["total"] == (np.arange(4) * sum(range(1, size + 1))).tolist()
        assert r["gathered"] == list(range(size))


def test_discovery_is_horovods_dict_and_test_discovery_holds_nodes_back():
    """RayHostDiscovery answers Horovod's {hostname: slots} (so Horovod users' subclasses filter it unchanged);
    TestDiscovery (horovod.ray.elastic_v2, Horovod's name) takes nodes away and gives them back within its bounds."""
    from horovod.ray.elastic_v2 import ElasticAdapter, ElasticParams, RayHostDiscovery, TestDiscovery
    found = RayHostDiscovery(cpus_per_slot=1).find_available_hosts_and_slots()
    assert isinstance(found, dict) and sorted(found.values()) == [2, 2]     # the head has no CPUs
    assert ElasticParams(min_workers=2).adapter is ElasticAdapter
    test = TestDiscovery(min_hosts=1, max_hosts=2, change_frequency_s=0, verbose=False, seed=3)
    seen = [len(test.find_available_hosts_and_slots()) for _ in range(20)]
    assert set(seen) == {1, 2} and all(1 <= n <= 2 for n in seen)
    with pytest.raises(NotImplementedError, match="_graceful"):
        TestDiscovery(1, 2, 5, _graceful=False)


def test_packed_workers_share_one_node():
    results = _run(num_workers=2)
    assert len({r["host"] for r in results}) == 1
    assert [r["local"] for r in results] == [(0, 2), (1, 2)]
    assert [r["cross"] for r in results] == [(0, 1), (0, 1)]
    _check_sums(results)


def test_spread_one_worker_per_node():
    results = _run(num_hosts=2, num_workers_per_host=1)
    assert len({r["host"] for r in results}) == 2
    assert [r["local"] for r in results] == [(0, 1), (0, 1)]
    assert [r["cross"] for r in results] == [(0, 2), (1, 2)]
    _check_sums(results)


@pytest.mark.parametrize("hierarchical", ["0", "1"], ids=["flat", "hierarchical"])
def test_two_nodes_two_workers_each(hierarchical):
    results = _run(num_hosts=2, num_workers_per_host=2,
                   extra_env_vars={"HOROVOD_HIERARCHICAL_ALLREDUCE": hierarchical})
    hosts = [r["host"] for r in results]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]       # ranks numbered node by node
    assert [r["local"] for r in results] == [(0, 2), (1, 2)] * 2
    assert [r["cross"] for r in results] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    _check_sums(results)


# -- elastic ------------------------------------------------------------------------------------------------------

def _touch(out, name, text=""):
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, os.path.join(out, name))


def elastic_training(out, grow=True):
    import horovod.numpy as hvd
    from horovod import elastic
    hvd.init()
    state = elastic.ObjectState(lambda obj: hvd.broadcast_object(obj, 0), hvd.rank, epoch=0, params=np.zeros(3),
                                committed=[], sizes=[])

    @elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            deadline = time.monotonic() + 60
            while grow and state.epoch == GROW_EPOCH and hvd.size() < 4:     # wait for the node the test adds
                if hvd.rank() == 0:
                    _touch(out, "grow")
                assert time.monotonic() < deadline, "the job never grew to 4 workers"
                time.sleep(0.05)
                state.commit()                                     # raises HostsUpdatedInterrupt once it grew
            for step in range(3):
                grad = hvd.allreduce(np.ones(3) * (state.epoch + 1), name="grad")
                state.params = state.params + grad
                if state.epoch == KILL_EPOCH and step == 1 and hvd.rank() == 1 and \
                        not os.path.exists(os.path.join(out, "kill")):
                    _touch(out, "kill", ray.get_runtime_context().get_actor_name())
                    time.sleep(60)                                 # the test kills this actor meanwhile
            state.committed = state.committed + [state.epoch]
            state.sizes = state.sizes + [hvd.size()]
            state.epoch += 1
            state.commit()
        everyone = hvd.allgather_object(state.params.tolist())
        return dict(rank=hvd.rank(), size=hvd.size(), params=state.params.tolist(), committed=state.committed,
                    sizes=state.sizes, everyone=everyone, host=os.environ["HOROVOD_HOSTNAME"])
    return train(state)


def _wait_for(path, timeout, what, job):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert job.is_alive(), f"the job ended before {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def _kill_then_grow(cluster, out, job):
    """In the main thread (Ray adds nodes only there) while the job runs in ``job``."""
    events = []
    _wait_for(os.path.join(out, "kill"), 120, "rank 1 to reach the kill point", job)
    with open(os.path.join(out, "kill")) as handle:
        name = handle.read()
    ray.kill(ray.get_actor(name))
    events.append(("killed", name))
    _wait_for(os.path.join(out, "grow"), 120, "the job to wait for a new node", job)
    events.append(("node", add_node(cluster, 2)))
    return events


def _run_in_thread(target):
    outcome = {}

    def body():
        try:
            outcome["results"] = target()
        except BaseException as exc:  # noqa: BLE001 — re-raised by the test
            outcome["error"] = exc
    thread = threading.Thread(target=body, name="elastic-job", daemon=True)
    thread.start()
    return thread, outcome


def test_killed_worker_shrinks_then_new_node_grows(cluster, tmp_path):
    """RayExecutor(min_workers=...): 4 workers on 2 nodes; ray.kill of rank 1 mid-epoch drops its node (blacklisted),
    2 workers go on from the last commit; a node added while they wait is used (4 workers again)."""
    out = str(tmp_path)
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=30), min_workers=2, max_workers=4, elastic_timeout=60)
    ex.start()
    job, outcome = _run_in_thread(lambda: ex.run(elastic_training, args=[out]))
    try:
        events = _kill_then_grow(cluster, out, job)
    finally:
        job.join(timeout=180)
    assert not job.is_alive(), "the elastic job did not end"
    if "error" in outcome:
        raise outcome["error"]
    results = outcome["results"]
    assert [e[0] for e in events] == ["killed", "node"]
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    expected = [3.0 * sum(e + 1 for e in range(EPOCHS))] * 3
    for r in results:
        assert r["committed"] == list(range(EPOCHS))           # no committed epoch lost or repeated
        assert r["params"] == expected and r["everyone"] == [expected] * 4
        assert r["size"] == 4
    sizes = results[0]["sizes"]
    assert sizes[0] == 4 and sizes[KILL_EPOCH] == 2 and sizes[-1] == 4, sizes
    killed_host = "-".join(events[0][1].split("-")[3:5])
    assert all(killed_host != r["host"] for r in results)   # the killed worker's node is blacklisted


def test_killed_worker_is_replaced_on_a_free_node(cluster, tmp_path):
    """ElasticRayExecutor: with a third node free, the killed worker's node is replaced at once (4 workers
    throughout), training going on from the last commit."""
    out = str(tmp_path)
    if sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")) < 3:
        add_node(cluster, 2)
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, elastic_timeout=60, timeout_s=30)
    ex = ElasticRayExecutor(settings, cpus_per_slot=1)
    ex.start()
    job, outcome = _run_in_thread(lambda: ex.run(lambda: elastic_training(out, grow=False)))
    try:
        _wait_for(os.path.join(out, "kill"), 120, "rank 1 to reach the kill point", job)
        with open(os.path.join(out, "kill")) as handle:
            ray.kill(ray.get_actor(handle.read()))
    finally:
        job.join(timeout=180)
    assert not job.is_alive(), "the elastic job did not end"
    if "error" in outcome:
        raise outcome["error"]
    results = outcome["results"]
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    expected = [3.0 * sum(e + 1 for e in range(EPOCHS))] * 3
    for r in results:
        assert r["committed"] == list(range(EPOCHS)) and r["params"] == expected and r["everyone"] == [expected] * 4
    assert results[0]["sizes"] == [4] * EPOCHS
