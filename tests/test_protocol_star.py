"""The star negotiation as state machines, rank 0 and its followers driven through their events alone.

Each rule of docs/engine.md's "When a cycle runs (star)" is checked where it decides: a follower's early message (at
once for a waiting caller, after the batch spacing otherwise), a cycle request for work rank 0 cannot see, rank 0
starting a cycle only when a name completes, GO only to followers whose message is not in, the reply itself
starting the cycle for the others, each set's round, and the silence report.
"""

import pytest
from protocol_harness import Net, View, folded as _folded, kinds as _kinds, names

from horovod.core.negotiation.base import BATCH_SPACING_SECONDS, POLL_SECONDS
from horovod.core.negotiation.events import BEGIN, DRAIN, HEARD, Silent
from horovod.core.negotiation.frames import Go, Msg, Reply, Want
from horovod.core.negotiation.star import StarFollowerProtocol, StarRootProtocol

pytestmark = pytest.mark.unit


def _star(size=3, patience=0.0, sets=()):
    views = [View(rank, size, False, sets) for rank in range(size)]
    protocols = [StarRootProtocol(views[0], patience)] + [StarFollowerProtocol(v, patience) for v in views[1:]]
    return Net(protocols, views)


def test_when_every_rank_waits_the_early_messages_complete_a_name_and_the_reply_alone_starts_the_cycle():
    net = _star()
    for rank, view in enumerate(net.views):
        view.submit("a", float(rank + 1))
        view.waiters.blocked = 1
    assert net.woken(1, 0.0) == [] and net.woken(2, 0.0) == []
    assert _kinds(net) == [(1, 0, "Msg"), (2, 0, "Msg")]          # early messages, unasked
    assert net.protocols[1].expects == (Go, Reply) and net.protocols[1].listening == (0,)
    assert net.deliver(0, 0.001) == []
    assert net.woken(0, 0.001) == [DRAIN, BEGIN] and net.in_flight == []    # no GO: both messages are in
    root = net.turn(0, 0.001)
    assert names(root) == [["a"]] and _folded(root) == [6.0] * 4
    assert _kinds(net) == [(0, 1, "Reply"), (0, 2, "Reply")]
    for rank in (1, 2):
        assert net.deliver(rank, 0.002) == [BEGIN]                 # the reply to its message starts its cycle
        follower = net.turn(rank, 0.002)                           # ... and answers its round: nothing read
        assert names(follower) == [["a"]] and _folded(follower) == [6.0] * 4
    # A cycle ends listening to nobody: a thread that slept through a caller's cycles reads nothing until the next
    # woken (horovod/core/negotiation/events.py).
    assert [p.listening for p in net.protocols] == [(), (), ()]


def test_rank_0_starts_no_cycle_for_a_name_only_it_submitted_and_polls_for_stall_checks():
    net = _star()
    net.views[0].submit("a", 1.0)
    net.views[0].waiters.blocked = 1
    assert net.woken(0, 3.0) == [] and net.in_flight == []
    assert net.protocols[0].listening == (1, 2)
    assert net.protocols[0].timeout == pytest.approx(POLL_SECONDS)
    assert net.woken(0, 3.0 + POLL_SECONDS) == [DRAIN, BEGIN]      # the poll: GO to every follower
    assert _kinds(net) == [(0, 1, "Go"), (0, 2, "Go")]


def test_a_follower_gathers_a_burst_for_the_spacing_unless_a_caller_waits():
    net = _star()
    view, follower = net.views[1], net.protocols[1]
    view.submit("a", 1.0)
    assert net.woken(1, 2.0) == [] and net.in_flight == []
    assert follower.timeout == pytest.approx(BATCH_SPACING_SECONDS) and not follower.presented
    assert net.woken(1, 2.0 + BATCH_SPACING_SECONDS) == [] and _kinds(net) == [(1, 0, "Msg")]
    assert follower.presented and follower.timeout is None


def test_work_rank_0_cannot_see_is_asked_for_once_and_the_cycle_runs_every_set_in_its_round():
    net = _star(sets=[(1, (0, 1))])
    net.views[1].submit("b", 5.0, set_id=1)
    net.views[1].waiters.blocked = 1
    assert net.woken(1, 0.0) == [] and _kinds(net) == [(1, 0, "Want")]
    assert net.woken(1, 0.001) == [] and len(net.in_flight) == 1      # asked once
    net.views[0].submit("b", 7.0, set_id=1)
    assert net.deliver(0, 0.001) == []
    assert net.woken(0, 0.001) == [DRAIN, BEGIN]
    assert _kinds(net) == [(0, 1, "Go"), (0, 2, "Go")]
    for rank in (1, 2):
        assert net.deliver(rank, 0.002) == [BEGIN]
    # Set 0: nothing submitted; everyone's empty message goes to rank 0, which replies.
    started = {rank: net.start(rank, 0.002) for rank in (1, 2)}
    assert _kinds(net) == [(1, 0, "Msg"), (2, 0, "Msg")]
    assert names(net.turn(0, 0.002)) == [] and net.protocols[0].listening == ()   # (it read both: now nobody)
    assert [names(net.finish(rank, started[rank], 0.002)) for rank in (1, 2)] == [[], []]
    # Set 1 (ranks 0 and 1): rank 0 coordinates, rank 1 sends its message and reads the reply.
    started = net.start(1, 0.003, set_id=1)
    root = net.turn(0, 0.003, set_id=1)
    assert names(root) == [["b"]] and root.batches[0].folded is None     # (only the global set's data rides along)
    assert names(net.finish(1, started, 0.003)) == [["b"]] and net.in_flight == []


def test_rank_0_refuses_a_second_message_for_one_cycle():
    from horovod.common.exceptions import HorovodInternalError
    net = _star()
    root = net.protocols[0]
    message = Msg(False, (), (), {})
    root.frame(1, message, 0.0)
    with pytest.raises(HorovodInternalError, match="rank 1 sent two messages for one cycle"):
        root.frame(1, message, 0.0)
    assert root.frame(2, Want(1), 0.0) == []


def test_a_follower_tells_the_transport_of_rank_0s_silence_every_half_timeout_and_of_its_answer():
    net = _star(size=2, patience=4.0)
    net.views[1].submit("a", 1.0)
    net.views[1].waiters.blocked = 1
    assert net.woken(1, 10.0) == [] and net.protocols[1].timeout == pytest.approx(2.0)
    assert net.woken(1, 12.0) == [Silent(0, 2.0)]
    assert net.woken(1, 13.0) == []
    net.in_flight.append((0, 1, Go().encode()))
    assert net.deliver(1, 13.5) == [HEARD, BEGIN]
