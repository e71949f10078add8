"""A name resubmitted with a changed shape gets the new shape's result (issue 47, item 6): the response cache may
stand in for a request only when it equals the cached one.

Tier unit: the cache's own rule (a response travels as its bit only when it equals the cached one). Tier ranks: two
real ranks under each negotiation submit ``x`` with one shape until it is cached, then another, then the first
again, small (data with the negotiation) and large; an allgather's and a broadcast's shapes change the same way.
"""

import numpy as np
import pytest

from horovod.common.types import OpType, Response
from horovod.core.response_cache import ResponseCache
from horovod.testing import spawn_ranks


def _allreduce(shape):
    return Response(OpType.ALLREDUCE, ("x",), "float64", (shape,))


@pytest.mark.unit
def test_a_response_travels_as_its_bit_only_while_it_equals_the_cached_one():
    cache = ResponseCache(4)
    cache.record([_allreduce((2,))])
    bit = cache.bit("x")
    assert cache.cached_bit(_allreduce((2,))) == bit          # an equal response, not the same object: the bit
    assert cache.cached_bit(_allreduce((3,))) is None         # the shape changed: the whole response
    assert cache.cached_bit(Response(OpType.ALLREDUCE, ("x",), "float32", ((2,),))) is None
    changed = _allreduce((3,))
    cache.record([changed])                                   # every rank records it after executing it
    assert cache.bit("x") == bit and cache.response(bit) is changed and cache.cached_bit(_allreduce((3,))) == bit


ALLREDUCE_LENGTHS = (2, 2, 2, 3, 3, 2, 2000, 2000, 3000, 3000, 2)
ALLGATHER_ROWS = (1, 1, 1, 2, 2, 1)
BROADCAST_LENGTHS = (2, 2, 2, 3, 3, 2)


def _same_names_changing_shapes():
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    me = hvd.rank()
    out = {"allreduce": [], "allgather": [], "broadcast": []}
    for length in ALLREDUCE_LENGTHS:
        out["allreduce"].append(hvd.allreduce(np.arange(length, dtype=np.float64) + me, op=hvd.Sum, name="x"))
    for rows in ALLGATHER_ROWS:
        out["allgather"].append(hvd.allgather(np.full((rows + me, 2), float(me)), name="g"))
    for length in BROADCAST_LENGTHS:
        out["broadcast"].append(hvd.broadcast(np.arange(length, dtype=np.float64) * (me + 1), root_rank=0, name="b"))
    hvd.shutdown()
    return out


@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", ["peer", "star", "tree"])
def test_a_name_resubmitted_with_another_shape_gets_the_new_shapes_result(negotiation):
    results = spawn_ranks(_same_names_changing_shapes, 2, timeout=60, env={"HOROVOD_NEGOTIATION": negotiation})
    for rank, out in enumerate(results):
        for length, got in zip(ALLREDUCE_LENGTHS, out["allreduce"], strict=True):
            np.testing.assert_array_equal(got, 2 * np.arange(length) + 1, err_msg=f"rank {rank}, allreduce {length}")
        for rows, got in zip(ALLGATHER_ROWS, out["allgather"], strict=True):
            want = np.concatenate([np.full((rows, 2), 0.0), np.full((rows + 1, 2), 1.0)])
            np.testing.assert_array_equal(got, want, err_msg=f"rank {rank}, allgather of {rows} rows")
        for length, got in zip(BROADCAST_LENGTHS, out["broadcast"], strict=True):
            np.testing.assert_array_equal(got, np.arange(length), err_msg=f"rank {rank}, broadcast {length}")
