"""The pump (horovod.core.negotiation.pump) against a scripted protocol: what it waits on, what it reads and in
which order, what it performs; the real protocols run over it in every multi-process test."""

import pytest

from horovod.common.exceptions import HorovodInternalError
from horovod.core.decision import Decision
from horovod.core.negotiation.events import BEGIN, HEARD, Execute, Send, Silent, Stall
from horovod.core.negotiation.frames import Peer
from horovod.core.negotiation.pump import Pumped

pytestmark = pytest.mark.unit

WAKE = object()


class _Loop:
    """A loop whose waits return what the test scripted, and a transport that records."""

    def __init__(self, readable):
        self.rank = 0
        self.readable = list(readable)     # one list of descriptors per wait
        self.waits = []
        self.wake = self
        self.reader = WAKE
        self.transport = self
        self.drained = 0
        self.sent, self.told = [], []
        self.time = 0.0

    # the loop
    def clock(self):
        self.time += 1.0
        return self.time

    def select(self, fds, timeout):
        self.waits.append((fds, timeout))
        return self.readable.pop(0)

    def drain(self):
        self.drained += 1

    # the transport
    def fileno(self, peer):
        return 100 + peer

    def recv_obj(self, peer):
        return Peer(float(peer), {}).encode()

    def send_obj(self, peer, wire):
        self.sent.append((peer, wire))

    def waiting(self, peer, seconds):
        self.told.append((peer, seconds))

    def resumed(self):
        self.told.append("resumed")


class _Scripted:
    """A protocol that listens to peers 1-3 and begins once it has frames from two of them."""

    name = "scripted"
    every_member_coordinates = False
    decides_at_once = False
    expects = (Peer,)

    def __init__(self):
        self.presented = False
        self.listening = (1, 2, 3)
        self.timeout = None
        self.got, self.calls = [], []

    def peers(self):
        return (1, 2, 3)

    def wake_on_wait(self):
        return True

    def forget(self, set_id):
        pass

    def woken(self, now):
        self.calls.append(("woken", now))
        if len(self.got) >= 2:
            return [Silent(3, 1.5), HEARD, BEGIN]
        self.timeout = 0.25
        return [Send((1, 2), ("peer", 0.0, {})), Stall(0.0)] if not self.got else []

    def frame(self, peer, frame, now):
        self.got.append(peer)
        self.listening = tuple(p for p in self.listening if p != peer)
        return self.turn(None, False, now)      # (in a cycle, the third frame decides)

    def began(self, now):
        self.calls.append(("began", now))

    def turn(self, state, shutdown, now):
        return [] if len(self.got) < 3 else [Execute(Decision([], False, (), ()))]


def test_the_pump_waits_on_what_the_protocol_listens_to_reads_each_readable_peer_once_and_performs_in_order():
    # The first wait: peer 2 and a stale peer 7 readable, with a wake-up; peer 2's is read, 7 is no peer of ours
    # and is never read. The second: peer 2 again (not listened to any more: left for the next cycle) and peer 1.
    loop = _Loop([[WAKE, 102], [102, 101]])
    protocol = _Scripted()
    pumped = Pumped(loop, protocol)
    pumped.start()
    pumped.await_cycle()
    assert protocol.got == [2, 1]
    assert loop.waits == [([WAKE, 101, 102, 103], pytest.approx(0.25)), ([WAKE, 101, 103], pytest.approx(0.25))]
    assert loop.drained == 1 and [peer for peer, _ in loop.sent] == [1, 2]
    assert loop.told == [(3, 1.5), "resumed"]
    assert protocol.calls[-1][0] == "began"


def test_negotiate_reads_the_listened_peer_until_the_protocol_decides():
    loop = _Loop([])
    protocol = _Scripted()
    protocol.got = [1, 2]
    protocol.listening = (3,)
    pumped = Pumped(loop, protocol)
    pumped.start()
    decision = pumped.negotiate(type("S", (), {"id": 0})(), False)
    assert decision.batches == [] and protocol.got == [1, 2, 3]


def test_a_protocol_that_neither_decides_nor_listens_is_a_bug_named_as_one():
    protocol = _Scripted()
    protocol.listening = ()
    pumped = Pumped(_Loop([]), protocol)
    with pytest.raises(HorovodInternalError, match="neither decided nor waits"):
        pumped.negotiate(type("S", (), {"id": 4})(), False)
