"""Adasum by vector halving and distance doubling: equal to the recursive formula, the same bits on every rank, and
no more data on the wire than a ring allreduce (counted on an in-memory transport: tier unit), then through the
engine on real ranks (tier ranks) and hierarchically across two host identities (tier cli)."""

import os
import sys
import textwrap

import numpy as np
import pytest

from horovod.algorithms import adasum, ring
from horovod.algorithms.group import Group
from horovod.testing.memory_transport import run_threads as _run_threads
from horovod.testing import spawn_ranks
from horovod.testing.fixtures import run_horovodrun


def _inputs(n, counts, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    bufs = [rng.standard_normal(sum(counts)).astype(dtype) for _ in range(n)]
    bufs[0][:counts[0]] = 0.0          # a zero-norm tensor on one rank: its coefficient stays 1
    return bufs


COUNTS = [7, 1000, 1, 33, 2049, 0, 512]


@pytest.mark.unit
@pytest.mark.parametrize("n", [2, 4, 8])
def test_vhdd_equals_recursive_reference_and_agrees_bitwise(n):
    bufs = _inputs(n, COUNTS)
    bounds = list(np.cumsum([0] + COUNTS))
    expected = adasum.adasum_reduce([b.copy() for b in bufs], bounds)

    def run(group):
        buf = bufs[group.index].copy()
        adasum.vhdd_allreduce(group, buf, bounds, np.empty(buf.size // 2 + 1))
        return buf
    results, _ = _run_threads(n, run)
    np.testing.assert_allclose(results[0], expected, rtol=1e-12, atol=1e-12)
    for r in range(1, n):
        assert results[r].tobytes() == results[0].tobytes(), f"rank {r} differs from rank 0"


@pytest.mark.unit
def test_vhdd_float32_close_to_reference():
    bufs = _inputs(4, COUNTS, np.float32, seed=3)
    bounds = list(np.cumsum([0] + COUNTS))
    expected = adasum.adasum_reduce([b.astype(np.float64) for b in bufs], bounds)

    def run(group):
        buf = bufs[group.index].copy()
        adasum.vhdd_allreduce(group, buf, bounds, np.empty(buf.size // 2 + 1, np.float32))
        return buf
    results, _ = _run_threads(4, run)
    np.testing.assert_allclose(results[0], expected, rtol=1e-4, atol=1e-5)
    assert all(r.tobytes() == results[0].tobytes() for r in results)


@pytest.mark.unit
@pytest.mark.parametrize("total", [1 << 16, (1 << 16) + 5])
def test_vhdd_moves_no_more_data_than_a_ring_at_four_ranks(total):
    n, counts = 4, [total // 3, total - total // 3]
    bufs = _inputs(n, counts)
    bounds = list(np.cumsum([0] + counts))
    _, adasum_sent = _run_threads(n, lambda g: adasum.vhdd_allreduce(g, bufs[g.index].copy(), bounds,
                                                                       np.empty(total // 2 + 1)))
    _, ring_sent = _run_threads(n, lambda g: ring.ring_allreduce(g, bufs[g.index].copy(), np.add,
                                                                 np.empty(total // n + 1)))
    # norms: 3 float64 per tensor, summed over 2 ranks at distance 1 (one exchange), 4 at distance 2 (two)
    control = 3 * 8 * len(counts) * (1 + 2)
    # per rank within one element of the ring's split (the halves round differently), the busiest rank no worse
    assert max(a - control for a in adasum_sent) <= max(ring_sent), (adasum_sent, ring_sent)
    assert sum(adasum_sent) - n * control == sum(ring_sent) == 2 * (n - 1) * total * 8


@pytest.mark.unit
def test_vhdd_refuses_three_ranks():
    with pytest.raises(NotImplementedError, match="power-of-two"):     # Horovod's exception for it
        adasum.vhdd_allreduce(Group((0, 1, 2), 0, None), np.ones(4), [0, 4], np.empty(3))


def _engine_adasum():
    import horovod.numpy as hvd
    hvd.init()
    try:
        rng = np.random.default_rng(hvd.rank() + 10)
        tensors = [rng.standard_normal(c) for c in (5, 300, 4096 + 3)]
        out = hvd.grouped_allreduce(tensors, op=hvd.Adasum, name="ada")
        big = rng.standard_normal(1 << 17)
        return [t for t in tensors], [o for o in out], big, hvd.allreduce(big, op=hvd.Adasum, name="big")
    finally:
        hvd.shutdown()


@pytest.mark.ranks
@pytest.mark.parametrize("transport", [{"HOROVOD_SHM_DISABLE": "1"}, {}], ids=["tcp", "default"])
def test_engine_adasum_at_four_ranks_matches_reference(transport):
    results = spawn_ranks(_engine_adasum, 4, timeout=120, env=transport)
    for k in range(3):
        expected = adasum.adasum_reduce([r[0][k] for r in results], [0, results[0][0][k].size])
        for rank, r in enumerate(results):
            np.testing.assert_allclose(r[1][k], expected, rtol=1e-12, atol=1e-12, err_msg=f"rank {rank}")
    expected = adasum.adasum_reduce([r[2] for r in results], [0, results[0][2].size])
    for r in results:
        np.testing.assert_allclose(r[3], expected, rtol=1e-12, atol=1e-12)
        assert r[3].tobytes() == results[0][3].tobytes()


HIERARCHICAL_JOB = textwrap.dedent("""
    import numpy as np
    import horovod.numpy as hvd
    from horovod.algorithms import adasum
    hvd.init()
    r, s = hvd.rank(), hvd.size()
    inputs = [np.random.default_rng(q).standard_normal(10007) for q in range(s)]
    out = hvd.allreduce(inputs[r], op=hvd.Adasum, name="h")
    host_sums = [inputs[0] + inputs[1], inputs[2] + inputs[3]]
    expected = adasum.adasum_reduce(host_sums, [0, 10007])
    assert np.allclose(out, expected, rtol=1e-12, atol=1e-12), abs(out - expected).max()
    print("ADASUM OK", r)
    hvd.shutdown()
""")


@pytest.mark.cli
def test_hierarchical_adasum_sums_within_hosts_then_combines_hosts(tmp_path):
    (tmp_path / "job.py").write_text(HIERARCHICAL_JOB)
    proc = run_horovodrun(["-np", "4", "-H", "localhost:2,127.0.0.1:2", "--hierarchical-allreduce",
                           sys.executable, str(tmp_path / "job.py")], timeout=120,
                          env={"HOROVOD_SHM_MIN_BYTES": "0", "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ADASUM OK") == 4
