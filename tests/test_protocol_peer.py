"""The peer negotiation as a state machine, driven through its events alone: no socket, no thread, no clock.

Three ranks' protocols are joined by a list that carries their Send actions; the test says what time it is. Every
rule of docs/engine.md's peer negotiation is checked where it decides: when a frame is due, what a rank listens to,
when a cycle begins, that every member decides alike and how a silent peer is reported.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from horovod.common.config import load_config
from horovod.common.types import OpType, Request
from horovod.core.negotiation.base import BATCH_SPACING_SECONDS, POLL_SECONDS
from horovod.core.negotiation.events import BEGIN, HEARD, Execute, Send, Silent
from horovod.core.negotiation.frames import decode
from horovod.core.negotiation.peer import PeerProtocol
from horovod.core.ops import Entry
from horovod.core.set_state import ProcessSets
from horovod.core.waiters import Waiters

pytestmark = pytest.mark.unit


class _View:
    """What the engine lends a protocol, with nothing that does I/O."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self._sets = ProcessSets(rank, None, load_config({}), None, True)
        self._sets.add(0, range(size))
        self.sets = self._sets.by_id
        self.waiters = Waiters()
        self.stopping = False

    def shutting_down(self):
        return self.stopping

    def batch_spacing(self):
        return BATCH_SPACING_SECONDS

    def submit(self, name, value):
        array = np.full(4, value, dtype=np.float32)
        request = Request(name, OpType.ALLREDUCE, "float32", (4,))
        state = self.sets[0]
        state.entries[name] = Entry(request, array, None, SimpleNamespace(), 0)
        state.queue.append(request)


class _Net:
    """Three ranks and the frames in flight between them."""

    def __init__(self, size=3, patience=0.0):
        self.views = [_View(rank, size) for rank in range(size)]
        self.protocols = [PeerProtocol(view, patience) for view in self.views]
        self.in_flight = []     # (sender, receiver, wire)
        self.sent = []

    def perform(self, rank, actions):
        """Carry the Sends; return the other actions, in order."""
        rest = []
        for action in list(actions):
            if type(action) is Send:
                self.in_flight += [(rank, peer, action.wire) for peer in action.peers]
                self.sent.append(rank)
            else:
                rest.append(action)
        return rest

    def woken(self, rank, now):
        return self.perform(rank, self.protocols[rank].woken(now))

    def deliver(self, now):
        """Hand every frame in flight to its receiver, as a driver would (each receiver then looks again)."""
        flying, self.in_flight = self.in_flight, []
        for sender, receiver, wire in flying:
            protocol = self.protocols[receiver]
            assert sender in protocol.listening, (sender, receiver, protocol.listening)
            assert self.perform(receiver, protocol.frame(sender, decode(wire, sender, *protocol.expects), now)) == []

    def decide(self, now):
        decisions = []
        for rank, protocol in enumerate(self.protocols):
            protocol.began(now)
            [execute] = protocol.turn(self.views[rank].sets[0], False, now)
            assert type(execute) is Execute
            decisions.append(execute.decision)
        return decisions


def _names(decision):
    return [[n for r in batch.responses for n in r.names] for batch in decision.batches]


def test_a_waiting_caller_makes_the_frame_due_at_once_and_otherwise_the_spacing_gathers_a_burst():
    net = _Net()
    view, protocol = net.views[1], net.protocols[1]
    view.submit("a", 1.0)
    assert net.woken(1, 5.0) == [] and net.in_flight == []
    assert protocol.deadline == pytest.approx(5.0 + BATCH_SPACING_SECONDS) and not protocol.presented
    view.submit("b", 2.0)       # (the burst's first request started the spacing)
    assert net.woken(1, 5.004) == [] and protocol.deadline == pytest.approx(5.0 + BATCH_SPACING_SECONDS)
    assert net.woken(1, 5.0 + BATCH_SPACING_SECONDS) == []
    assert protocol.presented and [(s, r) for s, r, _ in net.in_flight] == [(1, 0), (1, 2)]
    assert protocol.deadline is None        # (no patience: nothing to wait for but the peers' frames)

    net = _Net()
    view, protocol = net.views[2], net.protocols[2]
    view.submit("a", 1.0)
    view.waiters.blocked = 1
    assert net.woken(2, 5.0) == [] and protocol.presented and len(net.in_flight) == 2


def test_three_ranks_begin_together_and_every_member_decides_alike_with_every_contribution():
    net = _Net()
    for rank, view in enumerate(net.views):
        view.submit("a", float(rank + 1))
        view.waiters.blocked = 1
        assert net.woken(rank, 1.0) == []
    net.deliver(1.001)
    assert all(protocol.listening == () for protocol in net.protocols)
    assert [net.woken(rank, 1.002) for rank in range(3)] == [[BEGIN]] * 3
    decisions = net.decide(1.002)
    assert all(_names(d) == [["a"]] for d in decisions)
    for decision in decisions:
        [batch] = decision.batches
        values = [np.frombuffer(c, dtype=np.float32)[0] for c in batch.contributions]
        assert values == [1.0, 2.0, 3.0]        # every rank's data, by position, folded by every member
    assert [p.listening for p in net.protocols] == [(1, 2), (0, 2), (0, 1)]    # the next cycle's frames


def test_a_peer_whose_frame_is_in_is_not_listened_to_until_the_cycle_ran():
    net = _Net()
    for rank in (0, 1):
        net.views[rank].submit("a", 1.0)
        net.views[rank].waiters.blocked = 1
        net.woken(rank, 0.0)
    net.deliver(0.001)
    assert net.protocols[2].listening == ()             # both frames are in: the next ones belong to a later cycle
    assert net.protocols[0].listening == (2,) and net.protocols[1].listening == (2,)
    # Rank 2 has nothing pending and the frames are not urgent: it answers them after the poll interval.
    assert net.woken(2, 0.002) == [] and not net.protocols[2].presented
    assert net.protocols[2].deadline == pytest.approx(0.001 + POLL_SECONDS)
    assert net.woken(2, 0.001 + POLL_SECONDS) == [BEGIN] and len(net.in_flight) == 2
    net.deliver(0.06)
    assert [net.woken(rank, 0.06) for rank in (0, 1)] == [[BEGIN]] * 2
    assert [_names(d) for d in net.decide(0.06)] == [[]] * 3    # rank 2 never submitted "a": nothing is ready


def test_a_shutdown_from_one_peer_is_answered_at_once_by_a_rank_with_nothing_pending():
    net = _Net()
    net.views[0].stopping = True
    net.woken(0, 0.0)
    net.deliver(0.0)
    assert net.woken(1, 0.0) == [] and net.protocols[1].presented


def test_a_silent_peer_is_told_to_the_transport_every_half_timeout_and_heard_again():
    net = _Net(size=2, patience=4.0)
    view, protocol = net.views[0], net.protocols[0]
    view.submit("a", 1.0)
    view.waiters.blocked = 1
    assert net.woken(0, 10.0) == [] and protocol.deadline == pytest.approx(12.0)
    assert net.woken(0, 11.0) == [] and protocol.deadline == pytest.approx(12.0)
    assert net.woken(0, 12.0) == [Silent(1, 2.0)] and protocol.deadline == pytest.approx(14.0)
    assert net.woken(0, 13.0) == []                                    # once per half timeout
    assert net.woken(0, 14.0) == [Silent(1, 4.0)]
    net.views[1].submit("a", 2.0)
    net.views[1].waiters.blocked = 1
    net.woken(1, 14.5)
    net.deliver(14.5)
    assert net.woken(0, 14.5) == [HEARD, BEGIN]
