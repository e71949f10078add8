"""Horovod's Ray names that code written for Horovod builds on (issue 30 item 4): ``horovod.ray.runner.Coordinator``
and ``ray.remote(BaseHorovodWorker)``, the mixin pattern Horovod documents for making one's own worker actors.

The registration tests are pure bookkeeping (tier unit); the rest runs on one small local Ray cluster for the module:
Horovod's mixin check, then a job assembled by hand the way Horovod's own driver does it (actors, registration,
rendezvous, environment), whose workers allreduce at 2 and 3 ranks (tier ranks).
"""

import socket

import numpy as np
import pytest

from ray_clusters import local_ray

ray = pytest.importorskip("ray")
from horovod.ray import BaseHorovodWorker  # noqa: E402
from horovod.ray.runner import Coordinator, MiniSettings, RayExecutor  # noqa: E402


@pytest.mark.unit
def test_coordinator_registration_numbers_nodes_as_horovod():
    coord = Coordinator(MiniSettings())
    assert coord.world_size == 0 and coord.node_id_string == ""
    for i, host in enumerate(["a", "b", "c"]):
        for rank in range(12):
            if rank % 3 == i:
                coord.register(host, node_id=str(i), world_rank=rank)
    info = coord.finalize_registration()
    assert sorted(info) == list(range(12)) and coord.world_size == 12
    assert coord.node_id_string == "0:4,1:4,2:4" and coord.hostnames == {"a", "b", "c"}
    assert {v["HOROVOD_CROSS_SIZE"] for v in info.values()} == {3}
    assert {v["HOROVOD_CROSS_RANK"] for v in info.values()} == {0, 1, 2}
    assert {v["HOROVOD_LOCAL_SIZE"] for v in info.values()} == {4}
    assert {v["HOROVOD_LOCAL_RANK"] for v in info.values()} == {0, 1, 2, 3}
    assert info[4] == dict(HOROVOD_CROSS_RANK=1, HOROVOD_CROSS_SIZE=3, HOROVOD_LOCAL_RANK=1, HOROVOD_LOCAL_SIZE=4,
                           HOROVOD_RANK=4, HOROVOD_SIZE=12, HOROVOD_HOSTNAME=info[1]["HOROVOD_HOSTNAME"])
    assert len({v["HOROVOD_HOSTNAME"] for v in info.values()}) == 3


@pytest.mark.unit
@pytest.mark.parametrize("same_host", [True, False])
def test_coordinator_cross_ranks_of_unequal_nodes(same_host):
    coord = Coordinator(MiniSettings())
    for rank in range(12):
        node = "n1" if rank < 5 else "n2" if rank < 9 else "n3"
        coord.register("host1" if same_host else node, node_id=node, world_rank=rank)
    info = coord.finalize_registration()
    by_cross_size = {}
    for v in info.values():
        by_cross_size.setdefault(v["HOROVOD_CROSS_SIZE"], []).append(v["HOROVOD_CROSS_RANK"])
    assert {k: sorted(v) for k, v in by_cross_size.items()} == {1: [0], 2: [0, 1], 3: [0, 0, 0, 1, 1, 1, 2, 2, 2]}
    # Nodes on one machine are still separate hosts: workers meet over TCP between them, not shared memory.
    assert len({v["HOROVOD_HOSTNAME"] for v in info.values()}) == 3


@pytest.fixture(scope="module")
def cluster():
    with local_ray(3):
        yield


@pytest.mark.ranks
def test_mixin_actor_from_plain_ray_remote(cluster):
    class Test(BaseHorovodWorker):
        pass

    assert Test().hostname() == socket.gethostname()
    actor = ray.remote(BaseHorovodWorker).remote()
    try:
        ray.get(actor.update_env_vars.remote({"TEST": 1123123}), timeout=60)
        assert ray.get(actor.env_vars.remote(), timeout=60)["TEST"] == "1123123"
    finally:
        ray.kill(actor)


def _allreduce(_executable):
    import horovod.numpy as hvd
    hvd.init()
    total = hvd.allreduce(np.full(4, float(hvd.rank() + 1)), op=hvd.Sum, name="coordinated")
    out = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_size(), total.tolist())
    hvd.shutdown()
    return out


@pytest.mark.ranks
@pytest.mark.parametrize("world", [2, 3])
def test_job_assembled_with_the_coordinator(cluster, world):
    settings = RayExecutor.create_settings(timeout_s=30)
    remote_cls = ray.remote(BaseHorovodWorker)
    workers = [remote_cls.remote(world_rank=rank, world_size=world) for rank in range(world)]
    coord = Coordinator(settings)
    try:
        hosts = ray.get([w.hostname.remote() for w in workers], timeout=60)
        nodes = ray.get([w.node_id.remote() for w in workers], timeout=60)
        for rank, (host, node) in enumerate(zip(hosts, nodes)):
            coord.register(host, node, rank)
        for rank, env in coord.finalize_registration().items():
            workers[rank].update_env_vars.remote(env)
        job_env = coord.establish_rendezvous()
        assert {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"} <= set(job_env)
        assert job_env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(coord.global_rendezv_port)
        ray.get([w.update_env_vars.remote(job_env) for w in workers], timeout=60)
        results = ray.get([w.execute.remote(_allreduce) for w in workers], timeout=120)
    finally:
        for worker in workers:
            ray.kill(worker)
        coord.close()
    want = [float(sum(range(1, world + 1)))] * 4
    assert results == [(rank, world, rank, world, 1, want) for rank in range(world)]
