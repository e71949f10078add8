"""Small allreduces whose data travels inside negotiation frames (no data phase of their own).

Under peer negotiation every member folds the contributions itself; under star and tree rank 0 folds them and its
reply carries the results. What must hold is: the results match numpy, every rank gets the same bits, and a batch for which some member sent no data (its frame was full, it joined, it sent the request in
an earlier frame without data) takes the ordinary path with the same answer.
"""

import numpy as np
import pytest

from horovod.testing import spawn_ranks
from horovod.testing.fixtures import world_sizes

NEGOTIATIONS = ("peer", "star", "tree")
# The sizes each negotiation meets in make test (the tree's relays need 14 ranks); --world-sizes (make soak) runs
# every negotiation at those sizes instead.
DEFAULT_CASES = [("peer", 2), ("peer", 3), ("star", 3), ("star", 5), ("tree", 3), ("tree", 14)]
CASES = [(negotiation, n) for n in world_sizes(default=()) for negotiation in NEGOTIATIONS] or DEFAULT_CASES


def _inputs(rank, count, seed):
    return np.random.default_rng(seed * 10 + rank).standard_normal(count).astype(np.float32)


def _small_and_large():
    import numpy as np
    import horovod.numpy as hvd
    from horovod.runtime import basics
    from horovod.core import execution
    from horovod.core.negotiation import inline
    folded = []

    def counted(fold):
        def count(response, *args):
            folded.extend(response.names)
            return fold(response, *args)
        return count
    execution.allreduce_contributions = counted(execution.allreduce_contributions)
    execution.allreduce_folded = counted(execution.allreduce_folded)
    inline.INLINE_FRAME_BYTES = 4096     # 4 tensors of 1 KiB a frame: a burst of 40 cannot fit
    hvd.init()
    me = hvd.rank()
    engine = basics.engine()
    out = {"negotiation": engine.negotiation.name, "folded": folded}
    # Floats whose sum depends on the order of addition: every rank must still hold the same bits.
    for count in (1, 7, 200, 4000):          # 4000 floats (16 KB) are too big to travel with the negotiation
        out[f"sum{count}"] = hvd.allreduce(_inputs(me, count, count), op=hvd.Sum, name=f"sum{count}").tobytes()
    out["avg"] = hvd.allreduce(_inputs(me, 5, 1), op=hvd.Average, name="avg").tobytes()
    out["scaled"] = hvd.allreduce(_inputs(me, 5, 2), op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                                  name="scaled").tobytes()
    out["max"] = hvd.allreduce(np.array([me, -me, 7], np.int64), op=hvd.Max, name="max").tolist()
    out["int_avg"] = hvd.allreduce(np.array([me * 3 + 1, 10], np.int32), op=hvd.Average, name="int_avg").tolist()
    in_place = np.full(3, float(me + 1))
    hvd.allreduce_(in_place, op=hvd.Product, name="prod")
    out["prod"] = in_place.tolist()
    # 3 tensors of 1 KiB fit in one frame and fuse into one batch; 40 do not fit, and ranks submit them in
    # different orders, so parts of their batch lack some member's data and take the ordinary path.
    for label, count in (("few", 3), ("many", 40)):
        order = list(range(count)) if me % 2 == 0 else list(reversed(range(count)))
        handles = {i: hvd.allreduce_async(np.full(256, float(i + me), np.float32), op=hvd.Sum, name=f"{label}{i}")
                   for i in order}
        out[label] = [handles[i].result().tolist() for i in range(count)]
    # Submitted early by one rank and late by the others: the data waits for the tensor to become ready.
    if me == 0:
        early = hvd.allreduce_async(np.arange(4.0), op=hvd.Sum, name="early")
        hvd.barrier()
        out["early"] = early.result().tolist()
    else:
        hvd.barrier()
        out["early"] = hvd.allreduce(np.arange(4.0), op=hvd.Sum, name="early").tolist()
    hvd.shutdown()
    return out


@pytest.mark.ranks
@pytest.mark.parametrize("negotiation,size", CASES)
def test_allreduces_that_travel_with_the_negotiation_match_numpy_and_agree_bitwise(negotiation, size):
    # Under star and tree negotiation the data goes to rank 0 with the messages (up the tree) and the results rank 0
    # folded come back with the reply. At 14 ranks under the tree ranks 1-4 relay, and fold their subtrees' on the
    # way up (rank 4 ranks 4 and 13; rank 1 those and 1, 5, 6).
    results = spawn_ranks(_small_and_large, size, timeout=120, env={"HOROVOD_NEGOTIATION": negotiation})
    assert all(out["negotiation"] == negotiation for out in results)
    for out in results:
        folded = set(out["folded"])
        assert {"allreduce.sum1", "allreduce.sum7", "allreduce.sum200", "allreduce.avg", "allreduce.prod"} <= folded
        assert "allreduce.sum4000" not in folded
        assert {f"allreduce.few{i}" for i in range(3)} <= folded
        assert sum(f"allreduce.many{i}" in folded for i in range(40)) < 40, "every batch found its data"
    for key in ("sum1", "sum7", "sum200", "sum4000", "avg", "scaled"):
        assert len({out[key] for out in results}) == 1, f"{key}: ranks hold different bits"
    for count in (1, 7, 200, 4000):
        got = np.frombuffer(results[0][f"sum{count}"], np.float32)
        np.testing.assert_allclose(got, sum(_inputs(r, count, count) for r in range(size)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.frombuffer(results[0]["avg"], np.float32),
                               sum(_inputs(r, 5, 1) for r in range(size)) / size, rtol=1e-5)
    np.testing.assert_allclose(np.frombuffer(results[0]["scaled"], np.float32),
                               sum(_inputs(r, 5, 2) * 0.5 for r in range(size)) * 3.0, rtol=1e-5)
    for out in results:
        assert out["max"] == [size - 1, 0, 7]
        assert out["int_avg"] == [int(sum(r * 3 + 1 for r in range(size)) / size), 10]
        assert out["prod"] == [float(np.prod(np.arange(1, size + 1)))] * 3
        for label, count in (("few", 3), ("many", 40)):
            assert out[label] == [[float(size * i + sum(range(size)))] * 256 for i in range(count)]
        assert out["early"] == [0.0, float(size), 2.0 * size, 3.0 * size]


def _joined_partner():
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == hvd.size() - 1:
        last = hvd.join()
        value = None
    else:
        value = hvd.allreduce(np.array([5.0, 1.0]), op=hvd.Sum, name="alone").tolist()
        last = hvd.join()
    hvd.shutdown()
    return value, last


@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", NEGOTIATIONS)
@pytest.mark.parametrize("size", [n for n in world_sizes() if n > 1])     # one rank has no partner
def test_a_joined_rank_sends_no_data_and_contributes_zeros(negotiation, size):
    # The last rank joins at once; the others allreduce without it, then join: one of them joins last.
    results = spawn_ranks(_joined_partner, size, timeout=60, env={"HOROVOD_NEGOTIATION": negotiation})
    assert [value for value, _ in results[:-1]] == [[5.0 * (size - 1), size - 1.0]] * (size - 1)
    lasts = {last for _, last in results}
    assert len(lasts) == 1 and lasts.pop() in range(size - 1), results
