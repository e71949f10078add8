"""Negotiation, response cache and fusion planning: pure logic, no processes.

The coordinator cases marked with the argument ``world`` hold at any number of ranks and run at each of
horovod.testing.fixtures.world_sizes (2 and 3; 5 and 8 in make soak); the others spell out one exchange between
two or three ranks, message by message.
"""

import pytest

from horovod.common.types import OpType, ReduceOp, Request, Response
from horovod.core import fusion
from horovod.core.coordinator import Coordinator
from horovod.core.decision import Message
from horovod.core.response_cache import ResponseCache, split_hits

pytestmark = pytest.mark.unit


def req(name, shape=(4,), dtype="float32", op=OpType.ALLREDUCE, **kw):
    return Request(name, op, dtype, shape, **kw)


def msg(*requests, hits=(), shutdown=False):
    return Message(shutdown, tuple(hits), tuple(requests))


def coordinator(size=2, threshold=1 << 20, capacity=16, **kw):
    return Coordinator(list(range(size)), ResponseCache(capacity), threshold, **kw)


def names(batches):
    return [[n for r in b for n in r.names] for b in batches]


def test_ready_only_when_every_rank_submitted(world):
    c = coordinator(world)
    late = world // 2      # a rank in the middle submits last
    batches, stop, _, _ = c.step([msg() if r == late else msg(req("a")) for r in range(world)], now=0.0)
    assert batches == [] and not stop
    batches, _, _, _ = c.step([msg(req("a")) if r == late else msg() for r in range(world)], now=0.1)
    assert names(batches) == [["a"]]


def test_ranks_may_submit_in_any_order_and_ready_tensors_fuse(world):
    c = coordinator(world)
    orders = [msg(req("a"), req("b")) if r % 2 == 0 else msg(req("b"), req("a")) for r in range(world)]
    batches, _, _, _ = c.step(orders, now=0.0)
    assert names(batches) == [["a", "b"]]


def test_fusion_respects_threshold_dtype_and_op():
    c = coordinator(2, threshold=32)
    reqs = [req("a", (4,)), req("b", (4,)), req("c", (4,)), req("d", (4,), dtype="float64"),
            req("e", (4,), reduce_op=ReduceOp.MAX)]
    batches, _, _, _ = c.step([msg(*reqs), msg(*reqs)], now=0.0)
    assert names(batches) == [["a", "b"], ["c"], ["d"], ["e"]]


def test_zero_threshold_disables_fusion():
    responses = [Response(OpType.ALLREDUCE, (n,), "float32", ((4,),)) for n in "abc"]
    assert len(fusion.plan_batches(responses, [-1] * 3, 0)) == 3


def test_groups_stay_together_and_wait_for_each_other():
    c = coordinator(2, threshold=8)
    g = dict(group=7, payload=(2,))
    batches, _, _, _ = c.step([msg(req("x1", **g)), msg(req("x1", **g))], now=0.0)
    assert batches == []
    batches, _, _, _ = c.step([msg(req("x2", **g)), msg(req("x2", **g))], now=0.0)
    assert names(batches) == [["x1", "x2"]]    # one batch although larger than the threshold


@pytest.mark.parametrize("field,kwargs,text", [
    ("shape", dict(shape=(5,)), "shape"),
    ("dtype", dict(dtype="float64"), "data type"),
    ("op", dict(reduce_op=ReduceOp.MAX), "reduce op"),
    ("prescale", dict(prescale=2.0), "prescale factor"),
])
def test_mismatch_names_tensor_field_and_ranks(field, kwargs, text, world):
    if world < 2:
        pytest.skip("one rank: nothing to mismatch with")
    c = coordinator(world)
    odd = world - 1        # the last rank differs
    batches, _, _, _ = c.step([msg(req("t", **kwargs)) if r == odd else msg(req("t")) for r in range(world)], 0.0)
    (response,), = batches
    assert response.op == OpType.ERROR
    assert "'t'" in response.error and text in response.error
    assert "rank 0" in response.error and f"rank {odd}" in response.error


def test_broadcast_root_mismatch():
    c = coordinator(2)
    b = dict(op=OpType.BROADCAST)
    batches, _, _, _ = c.step([msg(req("t", root_rank=0, **b)), msg(req("t", root_rank=1, **b))], now=0.0)
    assert "root rank" in batches[0][0].error


def test_allgather_carries_first_dims_and_checks_trailing():
    c = coordinator(2)
    ag = dict(op=OpType.ALLGATHER)
    batches, _, _, _ = c.step([msg(req("g", (2, 3), **ag)), msg(req("g", (5, 3), **ag))], now=0.0)
    assert batches[0][0].sizes == ((2, 5),)
    batches, _, _, _ = c.step([msg(req("h", (2, 3), **ag)), msg(req("h", (2, 4), **ag))], now=0.0)
    assert "trailing dimensions" in batches[0][0].error


def test_alltoall_splits_matrix():
    c = coordinator(2)
    a = dict(op=OpType.ALLTOALL)
    batches, _, _, _ = c.step([msg(req("a", (3,), splits=(1, 2), **a)), msg(req("a", (2,), splits=(2, 0), **a))], 0.0)
    assert batches[0][0].sizes == ((1, 2), (2, 0))


def test_join_makes_allreduce_ready_and_rejects_allgather():
    c = coordinator(2)
    batches, _, _, _ = c.step([msg(req("j", op=OpType.JOIN)), msg(req("a"), req("g", (1,), op=OpType.ALLGATHER))], 0.0)
    flat = [r for b in batches for r in b]
    assert flat[0].names == ("a",) and flat[0].error is None
    assert flat[1].op == OpType.ERROR and "not supported with Join" in flat[1].error
    batches, _, _, _ = c.step([msg(), msg(req("j", op=OpType.JOIN))], 0.0)
    assert batches[-1][0].op == OpType.JOIN and batches[-1][0].last_joined == 1


def test_shutdown_flag_from_any_rank(world):
    for flagged in range(world):
        c = coordinator(world)
        _, stop, _, _ = c.step([msg(shutdown=r == flagged) for r in range(world)], 0.0)
        assert stop, flagged


def test_stall_report_names_missing_ranks_and_shutdown_time_fails_tensor(world):
    if world < 2:
        pytest.skip("one rank: nobody to wait for")
    c = coordinator(world, stall_warning=5.0, stall_shutdown=10.0)
    missing = tuple(range(1, world, 2))     # the odd ranks never submit
    c.step([msg() if r in missing else msg(req("s")) for r in range(world)], now=0.0)
    _, _, reports, _ = c.step([msg()] * world, now=6.0)
    assert [(r.name, r.missing_ranks) for r in reports] == [("s", missing)]
    batches, _, _, _ = c.step([msg()] * world, now=11.0)
    assert batches[0][0].op == OpType.ERROR and "stalled" in batches[0][0].error


def test_cache_hits_travel_as_bits_and_decode_identically():
    c = coordinator(2)
    worker_cache = ResponseCache(16)
    last = {}
    r = req("w")
    batches, _, _, _ = c.step([msg(r), msg(r)], 0.0)
    executed = [x for b in batches for x in b]
    c.cache.record(executed)
    worker_cache.record(executed)
    last["w"] = r
    hits, full = split_hits(worker_cache, last, [r, req("new")])
    assert hits == [worker_cache.bit("w")] and [f.name for f in full] == ["new"]
    chits, _ = split_hits(c.cache, last, [r])
    batches, _, _, _ = c.step([msg(hits=chits), msg(hits=hits)], 0.0)
    assert names(batches) == [["w"]]
    assert worker_cache.cached_bit(batches[0][0]) == c.cache.cached_bit(batches[0][0]) is not None


def test_changed_request_is_a_miss():
    cache = ResponseCache(4)
    r = req("w")
    cache.record([Response(OpType.ALLREDUCE, ("w",), "float32", ((4,),))])
    hits, full = split_hits(cache, {"w": r}, [req("w", (8,))])
    assert hits == [] and len(full) == 1


def test_cache_lru_eviction_is_deterministic_and_capacity_zero_disables():
    def fill(cache):
        for n in ["a", "b", "c", "a", "d"]:
            cache.record([Response(OpType.ALLREDUCE, (n,), "float32", ((1,),))])
        return {n: cache.bit(n) for n in "abcd"}
    one, two = ResponseCache(3), ResponseCache(3)
    assert fill(one) == fill(two)
    assert one.bit("b") is None and one.bit("d") == 1   # b was least recently used; d reuses its bit
    off = ResponseCache(0)
    fill(off)
    assert len(off) == 0


def test_errors_and_barriers_are_not_cached():
    cache = ResponseCache(4)
    cache.record([Response(OpType.ERROR, ("e",), error="x"), Response(OpType.BARRIER, ("b",))])
    assert len(cache) == 0


class _Ranks:
    """Each rank's side of the cache protocol (its cache and last full requests) around one coordinator."""

    def __init__(self, size=2, **kw):
        self.c = coordinator(size, **kw)
        self.caches = [self.c.cache] + [ResponseCache(16) for _ in range(size - 1)]
        self.last = [{} for _ in range(size)]

    def step(self, per_rank, now=0.0):
        messages = []
        for i, requests in enumerate(per_rank):
            hits, full = split_hits(self.caches[i], self.last[i], list(requests))
            messages.append(msg(*full, hits=hits))
        batches, stop, reports, _ = self.c.step(messages, now)
        executed = [r for b in batches for r in b]
        for cache in self.caches:
            cache.record(executed)
        return batches, reports


def test_steady_state_bits_take_the_fast_track_and_stay_correct():
    ranks = _Ranks(2)
    ranks.step([[req("w")], [req("w")]])
    ranks.step([[req("w")], [req("w")]])          # both hits now: the fast track
    assert ranks.c._fast == {}
    batches, _ = ranks.step([[req("w")], []])
    assert batches == [] and ranks.c._fast == {"w": [0]}
    batches, _ = ranks.step([[], [req("w")]])
    assert names(batches) == [["w"]] and batches[0][0] == Response(OpType.ALLREDUCE, ("w",), "float32", ((4,),),
                                                                    ReduceOp.SUM)


def test_a_repeated_step_reuses_its_fusion_plan_until_something_changes():
    ranks = _Ranks(2, threshold=32)
    step = [req(n) for n in "abcd"]                        # 16 bytes each: two batches of two
    ranks.step([step, step])
    first, _ = ranks.step([step, step])                    # the fast track, planned
    first[0].append("scribbled on by the caller")          # what is returned is the caller's to keep
    again, _ = ranks.step([step, step])                    # same responses, same order: the plan is reused
    assert names(again) == [["a", "b"], ["c", "d"]] and again == [first[0][:2], first[1]]
    ranks.c.fusion_threshold = 64                          # autotune moved the threshold: plan again
    assert names(ranks.step([step, step])[0]) == [["a", "b", "c", "d"]]
    assert names(ranks.step([step[1:], step[1:]])[0]) == [["b", "c", "d"]]


def test_bits_standing_for_different_requests_after_a_mismatch_still_fail():
    ranks = _Ranks(2)
    ranks.step([[req("w")], [req("w")]])
    batches, _ = ranks.step([[req("w", (4,))], [req("w", (8,))]])     # the mismatch: cache keeps the old response
    assert batches[0][0].op == OpType.ERROR
    # Each rank repeats its own request: both travel as bits, but they stand for different shapes.
    batches, _ = ranks.step([[req("w", (4,))], [req("w", (8,))]])
    assert batches[0][0].op == OpType.ERROR and "shape" in batches[0][0].error


def test_full_request_joining_a_fast_track_name_moves_it_to_validation():
    ranks = _Ranks(2)
    ranks.step([[req("w")], [req("w")]])
    ranks.step([[req("w")], []])                      # rank 0's bit waits on the fast track
    batches, _ = ranks.step([[], [req("w", (8,))]])   # rank 1 changed the shape: a full request
    assert batches[0][0].op == OpType.ERROR and "shape" in batches[0][0].error and ranks.c._fast == {}


def test_fast_track_tensor_stalls_are_reported_and_a_join_completes_it():
    ranks = _Ranks(2, stall_warning=5.0)
    ranks.step([[req("w")], [req("w")]])
    ranks.step([[req("w")], []], now=1.0)
    _, reports = ranks.step([[], []], now=7.0)
    assert [(r.name, r.missing_ranks) for r in reports] == [("w", (1,))]
    batches, _ = ranks.step([[], [req("join", op=OpType.JOIN)]], now=8.0)
    assert names(batches)[0] == ["w"] and batches[0][0].error is None


def test_peer_negotiation_members_decide_alike_from_the_same_messages():
    # Under peer negotiation every member runs the set's coordinator; identical input must give identical output,
    # including cache bits, fusion plans, errors, stalls (one clock) and the fast track.
    members = [coordinator(size=3, threshold=64, stall_warning=1.0, stall_shutdown=2.0) for _ in range(3)]
    caches = [c.cache for c in members]
    sequence = [
        [msg(req("a"), req("b")), msg(req("b")), msg(req("a"), req("b"), req("c"))],
        [msg(req("c")), msg(req("a"), req("c", shape=(5,))), msg()],
        [msg(req("x")), msg(), msg()],
    ]
    for clock, messages in enumerate(sequence * 3):
        outputs = []
        for member, cache in zip(members, caches):
            batches, stop, reports, _ = member.step(messages, float(clock))
            cache.record([r for b in batches for r in b])
            outputs.append(([[r.to_wire() for r in b] for b in batches], stop,
                            [(s.name, s.missing_ranks) for s in reports]))
        assert outputs[0] == outputs[1] == outputs[2]
    assert caches[0]._names == caches[1]._names == caches[2]._names


@pytest.mark.parametrize("env, size, peer", [
    ({}, 2, True), ({}, 4, True), ({}, 5, False), ({}, 1, False), ({"HOROVOD_NEGOTIATION": "star"}, 2, False),
    ({"HOROVOD_NEGOTIATION": "peer"}, 8, True), ({"HOROVOD_AUTOTUNE": "1"}, 2, False)])
def test_negotiation_mode_follows_size_and_settings(env, size, peer):
    from horovod.common.config import load_config
    from horovod.core.engine import Engine
    engine = Engine(load_config(env), 0, size, None)
    try:
        assert (engine.negotiation.name == "peer") is peer
        assert engine.negotiation.every_member_coordinates is peer
    finally:
        engine.wake.close()


def test_auto_negotiation_keeps_the_star_where_a_host_is_oversubscribed():
    import types
    from horovod.common.config import load_config
    from horovod.core.negotiation import oversubscribed, peer_negotiation
    two_hosts = types.SimpleNamespace(hostnames=["a", "a", "b", "b"], cores=[2, 2, 8, 8])
    crowded = types.SimpleNamespace(hostnames=["a", "a", "a", "b"], cores=[2, 2, 2, 8])
    assert not oversubscribed(two_hosts) and oversubscribed(crowded)
    assert peer_negotiation(load_config({}), 4, oversubscribed(two_hosts))
    assert not peer_negotiation(load_config({}), 4, oversubscribed(crowded))
    assert peer_negotiation(load_config({"HOROVOD_NEGOTIATION": "peer"}), 4, oversubscribed(crowded))


def test_unknown_or_contradictory_negotiation_mode_is_a_clear_error():
    from horovod.common.config import load_config
    from horovod.common.exceptions import HorovodConfigError
    from horovod.core.negotiation import peer_negotiation
    with pytest.raises(HorovodConfigError, match="HOROVOD_NEGOTIATION='ring': use auto, peer, star"):
        load_config({"HOROVOD_NEGOTIATION": "ring"})
    assert load_config({"HOROVOD_NEGOTIATION": " Peer "}).negotiation == "peer"
    with pytest.raises(HorovodConfigError, match="cannot run with HOROVOD_AUTOTUNE"):
        peer_negotiation(load_config({"HOROVOD_NEGOTIATION": "peer", "HOROVOD_AUTOTUNE": "1"}), 2)
