"""The peer negotiation as a state machine, driven through its events alone: no socket, no thread, no clock.

Three ranks' protocols are joined by a list that carries their Send actions; the test says what time it is. Every
rule of docs/engine.md's peer negotiation is checked where it decides: when a frame is due, what a rank listens to,
when a cycle begins, that every member decides alike and how a silent peer is reported.
"""

import numpy as np
import pytest
from protocol_harness import Net, View, names

from horovod.core.negotiation.base import BATCH_SPACING_SECONDS, POLL_SECONDS
from horovod.core.negotiation.events import BEGIN, HEARD, Silent
from horovod.core.negotiation.peer import PeerProtocol

pytestmark = pytest.mark.unit


def _net(size=3, patience=0.0):
    views = [View(rank, size, True) for rank in range(size)]
    return Net([PeerProtocol(view, patience) for view in views], views)


def _deliver(net, now):
    """Every frame in flight, delivered; what each rank did besides sending."""
    done = [net.deliver(rank, now) for rank in range(len(net.protocols))]
    assert net.in_flight == []
    return done


def _decide(net, now):
    for protocol in net.protocols:
        protocol.began(now)
    return [net.turn(rank, now) for rank in range(len(net.protocols))]


def test_a_waiting_caller_makes_the_frame_due_at_once_and_otherwise_the_spacing_gathers_a_burst():
    net = _net()
    view, protocol = net.views[1], net.protocols[1]
    view.submit("a", 1.0)
    assert net.woken(1, 5.0) == [] and net.in_flight == []
    assert protocol.timeout == pytest.approx(BATCH_SPACING_SECONDS) and not protocol.presented
    view.submit("b", 2.0)       # (the burst's first request started the spacing)
    assert net.woken(1, 5.004) == [] and protocol.timeout == pytest.approx(BATCH_SPACING_SECONDS - 0.004)
    assert net.woken(1, 5.0 + BATCH_SPACING_SECONDS) == []
    assert protocol.presented and [(s, r) for s, r, _ in net.in_flight] == [(1, 0), (1, 2)]
    assert protocol.timeout is None        # (no patience: nothing to wait for but the peers' frames)

    net = _net()
    view, protocol = net.views[2], net.protocols[2]
    view.submit("a", 1.0)
    view.waiters.blocked = 1
    assert net.woken(2, 5.0) == [] and protocol.presented and len(net.in_flight) == 2


def test_three_ranks_begin_together_and_every_member_decides_alike_with_every_contribution():
    net = _net()
    for rank, view in enumerate(net.views):
        view.submit("a", float(rank + 1))
        view.waiters.blocked = 1
        assert net.woken(rank, 1.0) == []
    # The last frame a rank waits for, its own sent, begins the cycle.
    assert _deliver(net, 1.001) == [[BEGIN]] * 3
    decisions = _decide(net, 1.002)
    assert all(names(d) == [["a"]] for d in decisions)
    for decision in decisions:
        [batch] = decision.batches
        values = [np.frombuffer(c, dtype=np.float32)[0] for c in batch.contributions]
        assert values == [1.0, 2.0, 3.0]        # every rank's data, by position, folded by every member
    assert [p.listening for p in net.protocols] == [(1, 2), (0, 2), (0, 1)]    # the next cycle's frames


def test_a_peer_whose_frame_is_in_is_not_listened_to_until_the_cycle_ran():
    net = _net()
    for rank in (0, 1):
        net.views[rank].submit("a", 1.0)
        net.views[rank].waiters.blocked = 1
        net.woken(rank, 0.0)
    assert _deliver(net, 0.001) == [[], [], []]         # (rank 2's frame is not out: nobody begins)
    assert net.protocols[2].listening == ()             # both frames are in: the next ones belong to a later cycle
    assert net.protocols[0].listening == (2,) and net.protocols[1].listening == (2,)
    # Rank 2 has nothing pending and the frames are not urgent: it answers them after the poll interval.
    assert net.woken(2, 0.002) == [] and not net.protocols[2].presented
    assert net.protocols[2].timeout == pytest.approx(POLL_SECONDS - 0.001)
    assert net.woken(2, 0.001 + POLL_SECONDS) == [BEGIN] and len(net.in_flight) == 2
    assert _deliver(net, 0.06) == [[BEGIN], [BEGIN], []]
    assert [names(d) for d in _decide(net, 0.06)] == [[]] * 3    # rank 2 never submitted "a": nothing is ready


def test_a_shutdown_from_one_peer_is_answered_at_once_by_a_rank_with_nothing_pending():
    net = _net()
    net.views[0].stopping = True
    net.woken(0, 0.0)
    _deliver(net, 0.0)
    assert net.woken(1, 0.0) == [] and net.protocols[1].presented


def test_a_silent_peer_is_told_to_the_transport_every_half_timeout_and_heard_again():
    net = _net(size=2, patience=4.0)
    view, protocol = net.views[0], net.protocols[0]
    view.submit("a", 1.0)
    view.waiters.blocked = 1
    assert net.woken(0, 10.0) == [] and protocol.timeout == pytest.approx(2.0)
    assert net.woken(0, 11.0) == [] and protocol.timeout == pytest.approx(1.0)
    assert net.woken(0, 12.0) == [Silent(1, 2.0)] and protocol.timeout == pytest.approx(2.0)
    assert net.woken(0, 13.0) == []                                    # once per half timeout
    assert net.woken(0, 14.0) == [Silent(1, 4.0)]
    net.views[1].submit("a", 2.0)
    net.views[1].waiters.blocked = 1
    net.woken(1, 14.5)
    assert _deliver(net, 14.5) == [[HEARD, BEGIN], [BEGIN]]
