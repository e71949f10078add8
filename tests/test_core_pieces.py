"""The pieces the engine is assembled from, tested without processes: the allreduce choice, fusion packing, the
negotiated-data split, the transport layout, and the negotiation objects' choice and protocol."""

import os
import types

import numpy as np
import pytest

from horovod.algorithms import allreduce as algorithms
from horovod.algorithms.buffers import Buffers
from horovod.algorithms.group import Group
from horovod.common.types import OpType, ReduceOp, Response
from horovod.core import fusion
from horovod.core.negotiation import Batch, Negotiation, PeerNegotiation, StarFollower, StarRoot, for_loop
from horovod.core.negotiation import oversubscribed
from horovod.core.negotiation.inline import HeldData, collect
from horovod.common.types import Request
from horovod.core.decision import Contributors as C

pytestmark = pytest.mark.unit


def _group(shm_min=None, hierarchy=None, size=2):
    shm = types.SimpleNamespace(min_bytes=shm_min) if shm_min is not None else None
    return Group(tuple(range(size)), 0, None, shm, hierarchy)


@pytest.mark.parametrize("group, nbytes, expected", [
    (_group(), 4, algorithms.EXCHANGE),
    (_group(), 64 << 10, algorithms.EXCHANGE),
    (_group(), (64 << 10) + 4, algorithms.RING),
    (_group(shm_min=1024), 4, algorithms.EXCHANGE),         # below HOROVOD_SHM_MIN_BYTES: the connections
    (_group(shm_min=1024), 1024, algorithms.SHM),
    (_group(shm_min=0, hierarchy=object()), 1 << 20, algorithms.HIERARCHICAL),
])
def test_allreduce_choice(group, nbytes, expected):
    assert algorithms.choose(group, nbytes) == expected


def test_single_rank_allreduce_scales_as_every_rank_would():
    group = _group(size=1)
    buf = np.array([1.0, 2.0, 3.0], np.float32)
    algorithms.allreduce(group, buf, ReduceOp.AVERAGE, 2.0, 3.0, [3], Buffers())
    assert buf.tolist() == [6.0, 12.0, 18.0]


def _entry(array, output=None):
    return types.SimpleNamespace(array=array, output=output)


def test_fusion_packs_and_unpacks_a_batch_and_a_joined_rank_contributes_zeros():
    response = Response(OpType.ALLREDUCE, ("a", "b", "c"), "float16", ((2,), (3,), (1,)))
    entries = {"a": _entry(np.array([1, 2], np.float16)), "c": _entry(np.array([5], np.float16))}
    counts = fusion.counts(response)
    outputs = fusion.outputs(response, entries, np.dtype(np.float16))
    assert set(outputs) == {"a", "c"}
    buf, fused = fusion.pack(response, counts, entries, outputs, Buffers(), widen=True)
    assert fused and buf.dtype == np.float32 and buf.tolist() == [1, 2, 0, 0, 0, 5]
    buf *= 2
    fusion.unpack(response, counts, outputs, buf, widen=True)
    assert outputs["a"].tolist() == [2, 4] and outputs["c"].tolist() == [10] and outputs["a"].dtype == np.float16


def test_a_single_native_tensor_is_reduced_in_its_output():
    response = Response(OpType.ALLREDUCE, ("a",), "float32", ((3,),))
    source, output = np.arange(3, dtype=np.float32), np.zeros(3, np.float32)
    entries = {"a": _entry(source, output)}
    outputs = fusion.outputs(response, entries, np.dtype(np.float32))
    buf, fused = fusion.pack(response, fusion.counts(response), entries, outputs, Buffers(), widen=False)
    assert not fused and np.shares_memory(buf, output) and output.tolist() == [0, 1, 2]


def _allreduce(name, shape=(2,)):
    return Response(OpType.ALLREDUCE, (name,), "float32", (shape,))


def test_held_data_splits_a_batch_into_folded_and_ordinary_tensors():
    held = HeldData()
    held.hold(0, C(0), {"a": b"A0", "b": b"B0"})
    held.hold(0, C(1), {"a": b"A1"})                   # member 1 sent no data for b
    batches = held.batches(0, 2, [[_allreduce("a"), _allreduce("b")], [_allreduce("c")]])
    assert batches == [Batch([_allreduce("a")], [b"A0", b"A1"]), Batch([_allreduce("b")]),
                       Batch([_allreduce("c")])]
    assert held.batches(0, 2, [[_allreduce("b")]]) == [Batch([_allreduce("b")])], "held data is used once"


def test_held_data_of_a_failed_tensor_or_a_removed_set_is_dropped():
    held = HeldData()
    held.hold(1, C(0), {"a": b"A0"})
    held.hold(1, C(1), {"a": b"A1"})
    error = Response(OpType.ERROR, ("a",), error="mismatch")
    assert held.batches(1, 2, [[error]]) == [Batch([error])]
    assert held.batches(1, 2, [[_allreduce("a")]]) == [Batch([_allreduce("a")])]
    held.hold(2, C(0), {"x": b"X"})
    held.forget(2)
    assert held.batches(2, 1, [[_allreduce("x")]]) == [Batch([_allreduce("x")])]


def test_a_relay_folds_what_its_whole_subtree_sent_and_rank_0_folds_a_few_contributions_to_the_same_sums():
    from horovod.core.negotiation.inline import fold, fold_subtree
    from horovod.core.negotiation.tree import subtree_size
    rng = np.random.default_rng(3)
    size = 13                   # rank 1 relays for ranks 4, 5 and 6, leaves (their children would start at 13)
    inputs = {r: rng.standard_normal(3).astype(np.float32) for r in range(size)}
    scaled = Request("s", OpType.ALLREDUCE, "float32", (3,), ReduceOp.AVERAGE, prescale=0.5)
    summed = Request("t", OpType.ALLREDUCE, "float32", (3,))
    datas = [(C(r), {"s": inputs[r].tobytes(), "t": inputs[r].tobytes()}) for r in (1, 4, 5, 6)]
    datas[2][1]["odd"] = b"xy"          # a name the relay did not send: passed on as it came
    del datas[3][1]["t"]                # rank 6 sent no data for t: t cannot be folded, it passes on
    up = fold_subtree(1, subtree_size(1, size), {"s": scaled, "t": summed}, datas)
    assert up[0][0] == C(1, 4) and up[0][0].folded and set(up[0][1]) == {"s"}
    assert dict(up[1:]) == {C(1): {"t": datas[0][1]["t"]}, C(4): {"t": datas[1][1]["t"]},
                            C(5): {"t": datas[2][1]["t"], "odd": b"xy"}}
    assert all(type(key) is C and not key.folded for key, _ in up[1:])
    # Every rank of the subtree sent every name: each folds to its own sum, in one go where the tensors are alike
    # (t and u) and by kind where not (s).
    other = Request("u", OpType.ALLREDUCE, "float32", (2,))
    for names in (("t", "u"), ("s", "t", "u")):
        whole = [(C(r), {"s": inputs[r].tobytes(), "t": inputs[r][::-1].tobytes(), "u": inputs[r][:2].tobytes()})
                 for r in (1, 4, 5, 6)]
        whole = [(r, {name: data[name] for name in names}) for r, data in whole]
        ((key, sums),) = fold_subtree(1, 4, {"s": scaled, "t": summed, "u": other}, whole)
        assert key == C(1, 4) and list(sums) == list(names)
        for name, part, factor in (("s", slice(None), 0.5), ("t", slice(None, None, -1), 1.0), ("u", slice(2), 1.0)):
            if name in names:
                np.testing.assert_allclose(np.frombuffer(sums[name], np.float32),
                                           sum(inputs[r][part] * factor for r in (1, 4, 5, 6)), rtol=1e-6)
    # Rank 0 holds its own, rank 1's folded subtree and ranks 2-3's (leaves here, standing in for their subtrees).
    held = HeldData()
    held.hold(0, C(0), {"s": inputs[0].tobytes()})
    held.hold(0, up[0][0], up[0][1])
    for r in (2, 3):
        held.hold(0, C(r), {"s": inputs[r].tobytes()})
    response = Response(OpType.ALLREDUCE, ("s",), "float32", ((3,),), ReduceOp.AVERAGE, 0.5)
    (batch,) = held.batches(0, 7, [[response]])
    assert batch.partial == (False, True, False, False) and len(batch.contributions) == 4
    got = fold(response, batch.contributions, partial=batch.partial, members=7)
    want = sum(inputs[r] * 0.5 for r in range(7)) / 7
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # A subtree short of a rank is not complete: the tensor takes the ordinary path.
    held.hold(0, C(0), {"s": b""})
    held.hold(0, C(1, 3), {"s": b""})
    assert held.batches(0, 7, [[response]]) == [Batch([response])]


def test_only_small_allreduces_travel_in_frames_within_the_budget():
    small = Request("s", OpType.ALLREDUCE, "float32", (4,))
    avg16 = Request("h", OpType.ALLREDUCE, "float16", (4,))          # widened: the ordinary path
    big = Request("b", OpType.ALLREDUCE, "float32", (1024,))
    entries = {"s": _entry(np.ones(4, np.float32)), "h": _entry(np.ones(4, np.float16)),
               "b": _entry(np.ones(1024, np.float32))}
    data, left = collect([small, avg16, big], entries, 100)
    assert set(data) == {"s"} and left == 84
    assert collect([small], entries, 8) == ({}, 8)


def test_the_transport_layout_is_declared_and_checked():
    from horovod.transport.tcp import TcpTransport
    transport = TcpTransport(0, 2, b"secret", 1.0, job_token="job.mesh.1")
    assert transport.job_token == "job.mesh.1" and transport.hostnames == [] and transport.cores == []
    assert not oversubscribed(transport) and not oversubscribed(None)
    transport.set_layout(["a", "a"], [1, 1])
    assert oversubscribed(transport)
    with pytest.raises(ValueError, match="for 2 ranks"):
        transport.set_layout(["a"], [1])


class _Loop:
    def __init__(self, rank, size):
        self.rank, self.size, self.transport = rank, size, None


@pytest.mark.parametrize("env, rank, size, kind", [
    ({}, 0, 2, PeerNegotiation), ({}, 1, 4, PeerNegotiation), ({}, 0, 5, StarRoot), ({}, 3, 5, StarFollower),
    ({"HOROVOD_NEGOTIATION": "star"}, 1, 2, StarFollower), ({}, 0, 1, StarRoot)])
def test_each_rank_runs_one_protocol_object(env, rank, size, kind):
    from horovod.common.config import load_config
    negotiation = for_loop(_Loop(rank, size), load_config(env))
    assert type(negotiation) is kind and isinstance(negotiation, Negotiation)
    assert negotiation.every_member_coordinates is (kind is PeerNegotiation)
    assert not negotiation.presented


def _resting(handback, ended=lambda: False):
    """A thread resting on ``handback`` (as the engine thread does while a caller drives); returns it once resting."""
    import threading
    thread = threading.Thread(target=handback.rest, args=(ended,), daemon=True)
    thread.start()
    while not handback.resting and thread.is_alive():
        thread.join(0.001)
    return thread


def test_the_engine_thread_rests_while_a_caller_drives_and_wakes_only_when_needed():
    from horovod.core.waiters import Handback
    spacing = [60.0]
    handback = Handback(seconds=60.0, spacing=lambda: spacing[0])   # (no test waits 60 s: every wake-up is explicit)
    handback.taken()
    thread = _resting(handback)
    handback.left(work_left=False)
    handback.submitted()                # within a batch spacing of the caller letting go: it will drive again
    handback.taken()
    thread.join(0.05)
    assert thread.is_alive() and handback.resting
    handback.left(work_left=True)       # leaves work behind: the engine thread takes over
    thread.join(5)
    assert not thread.is_alive()

    handback.taken()
    thread = _resting(handback)
    handback.left(work_left=False)
    spacing[0] = 0.0                    # a submission a batch spacing after the caller let go: the engine paces it
    handback.submitted()
    thread.join(5)
    assert not thread.is_alive()

    ended = []
    handback.taken()
    thread = _resting(handback, lambda: bool(ended))
    ended.append(True)
    handback.wake()                     # the loop ended (or a caller waits without driving)
    thread.join(5)
    assert not thread.is_alive()


def test_a_rest_ends_after_its_interval_when_nothing_wakes_it():
    from horovod.core.waiters import Handback
    handback = Handback(seconds=0.01, spacing=lambda: 60.0)
    handback.taken()
    thread = _resting(handback)
    handback.left(work_left=False)
    thread.join(5)                      # (its interval passes with no caller driving: it stops resting)
    assert not thread.is_alive()


def test_spin_follows_horovod_spin_us_and_never_when_ranks_outnumber_cores():
    from horovod.common.config import load_config
    from horovod.transport import shm
    cores = os.cpu_count() or 1
    assert shm.spin_seconds(1) == shm.SPIN_SECONDS == pytest.approx(load_config({}).spin_us * 1e-6)
    assert shm.spin_seconds(1, 0) == 0.0 and shm.spin_seconds(1, 50) == pytest.approx(50e-6)
    assert shm.spin_seconds(cores + 1, 200) == 0.0
    assert load_config({"HOROVOD_SPIN_US": "0"}).spin_us == 0
