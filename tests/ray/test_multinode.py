"""RayExecutor on Ray's own multi-node test cluster (several raylets on this machine): packed and spread workers get
the local and cross ranks of the node Ray put them on, and collectives are right across nodes (tier ranks)."""

import numpy as np
import pytest

from ray_clusters import multinode_ray

ray = pytest.importorskip("ray")
from horovod.ray import RayExecutor  # noqa: E402

pytestmark = pytest.mark.ranks


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
