"""Peer negotiation: how the ranks of a small job agree on what to execute without a coordinator in the middle.

Every rank sends one frame per cycle to every other rank, with its messages for every process set it belongs to;
every member of a set runs the set's coordinator (a pure function of the messages) and so decides the same batches,
errors and cache bits as every other member, with no reply to wait for: a tensor is ready one network hop after its
last rank submitted it, where the star through rank 0 needs two. Small allreduces carry their data in the frame and
are folded by every member, with no data phase (:mod:`horovod.core.negotiation.inline`). The design and its
measurements: docs/engine.md.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from horovod.common.types import OpType
from horovod.core import buggify
from horovod.core.decision import Contributors, Decision, Message
from horovod.core.negotiation import inline
from horovod.core.negotiation.base import POLL_SECONDS, Loop, View
from horovod.core.negotiation.events import BEGIN, HEARD, Execute, Silent, send_to_each
from horovod.core.negotiation.frames import Msg, Peer
from horovod.core.negotiation.pump import Pumped, patience
from horovod.core.response_cache import split_hits
from horovod.core.set_state import SetState

__all__ = ["PeerProtocol", "PeerNegotiation"]

_EMPTY_MESSAGE = Message(False, (), ())
log = logging.getLogger("horovod")


def _is_urgent(frame: Peer, member_sets) -> bool:
    """A peer frame that needs an answer even from a rank with nothing pending: shutdown, a join, or requests for a
    process set this rank is not in (it cannot submit there, and that set's cycle waits for its frame)."""
    return any(set_id not in member_sets or msg.shutdown or any(r.op == OpType.JOIN for r in msg.requests)
               for set_id, msg in frame.messages.items())


class PeerProtocol:
    """Every rank sends its messages to every other rank, and every member of a set decides alike (a state machine:
    :mod:`horovod.core.negotiation.events`).

    A frame is due when this rank has requests (at once while a caller waits or polls, else after the batch
    spacing, so that a burst of gradients travels together), when a peer's frame waits and this rank has tensors
    it might complete (or the frame carries a shutdown or a join), and otherwise every poll interval while
    anything waits, for the stall checks. One frame per rank and cycle: a peer's next frame is read only after this
    cycle ran, so it never lands in the middle of the data phase.
    """

    name = "peer"
    every_member_coordinates = True
    expects = (Peer,)
    frames = 0      # (only the tree counts its frames)
    decides_at_once = True      # a turn sends nothing and reads nothing: the pump may ask decide() directly

    def __init__(self, view: View, patience: float):
        self.view = view
        self.patience = patience                        # seconds of a peer's silence before the transport hears
        self._others = tuple(p for p in range(view.size) if p != view.rank)
        self.presented = False                          # this rank's frame for the coming cycle is out
        self.listening: Tuple[int, ...] = self._others  # the peers whose next frame may be read, in order
        self.timeout: Optional[float] = None            # how long after `now` to look again if nothing happens
        self._inbox: Dict[int, Peer] = {}               # each peer's frame for the coming cycle
        self._inbox_since: Optional[float] = None
        self._frames: Dict[int, Peer] = {}              # ... and for the cycle that runs
        self._own: Dict[int, Message] = {}              # what this rank sent for it, by set id
        self._own_clock = 0.0
        self._queued_since: Optional[float] = None      # when this rank's queues became non-empty
        self._last_start = float("-inf")
        self._warned = False                            # the silence of this cycle's peers was reported
        self._told_at = 0.0                             # when it was last reported
        self._out: List = []
        self.held = inline.HeldData()

    def peers(self) -> Tuple[int, ...]:
        """Every peer this rank may listen to: every other rank."""
        return self._others

    def wake_on_wait(self) -> bool:
        """A waiting thread makes this rank's frame due at once (rank 0 always wakes, as it did under the star)."""
        return self.view.rank == 0 or not self.presented

    def forget(self, set_id: int) -> None:
        """Drop the data held for a removed set."""
        self.held.forget(set_id)

    def frame(self, peer: int, frame: Peer, now: float) -> List:
        """A peer's frame for the coming cycle: the last one the cycle waits for begins it where this rank's frame is
        out (else the driver's :meth:`woken`, once it delivered what arrived, decides)."""
        inbox = self._inbox
        inbox[peer] = frame
        if self._inbox_since is None:
            self._inbox_since = now
        out = self._out
        out.clear()
        if len(inbox) < len(self._others):
            self.listening = tuple(p for p in self._others if p not in inbox)
            return out
        self.listening = ()
        return self._begin(out) if self.presented else out

    def began(self, now: float) -> None:
        """The cycle began (this rank's frame sent): the poll interval counts from here."""
        self._last_start = now

    def woken(self, now: float) -> List:
        """Send this rank's frame when due; begin the cycle once every peer's frame for it is in."""
        out = self._out
        out.clear()
        timeout = None
        if not self.presented:
            timeout = self._frame_due(now)
            if buggify.ON and timeout is not None and timeout > 0 and buggify.fires("peer.frame_early"):
                timeout = 0.0       # due later, sent now: as a caller's wait would make it
            if timeout is not None and timeout <= 0:
                self._send_frame(now, out)
                timeout = None
        if self.presented and len(self._inbox) == len(self._others):
            return self._begin(out)
        if self.presented and self.patience > 0:
            timeout = self._liveness_bound(now, timeout, out)
        if buggify.ON:
            timeout = buggify.late(timeout, "peer.timer_late")
        self.timeout = timeout
        return out

    def _begin(self, out: List) -> List:
        """Every frame of the cycle is in, this rank's too: it begins (the next frames are the next cycle's)."""
        if self._warned:
            out.append(HEARD)
        self.presented = self._warned = False
        self._frames, self._inbox, self._inbox_since = self._inbox, {}, None
        self.listening, self.timeout = self._others, None
        out.append(BEGIN)
        return out

    def turn(self, state: SetState, shutdown: bool, now: float) -> List:
        """The cycle reached ``state``: decide at once, from the frames in."""
        out = self._out
        out.clear()
        out.append(Execute(self.decide(state, shutdown)))
        return out

    def _liveness_bound(self, now: float, timeout: Optional[float], out: List) -> Optional[float]:
        """A live peer answers a frame within a poll interval, idle or not; one that has not for half the
        transport's timeout is busy (a long call holding the GIL) or stuck, but alive: a lost host or process is the
        connection's to report (its liveness probes, or the closed socket). The transport is told every half
        timeout (:mod:`horovod.transport.patience`: one warning for the job, and a bound)."""
        tick = self.patience / 2
        silent_for = now - self._own_clock
        left = self._told_at + tick - now if self._warned else tick - silent_for
        if left > 0:
            return left if timeout is None else min(timeout, left)
        self._warned = True
        self._told_at = now
        out.append(Silent(self.listening[0], silent_for))
        return tick if timeout is None else min(timeout, tick)

    def _frame_due(self, now: float) -> Optional[float]:
        """In how long this rank's frame for the next cycle is due (<= 0: now; None: not yet)."""
        view = self.view
        sets = view.sets
        shutdown = view.shutting_down()
        if shutdown or any(state.queue for state in sets.values() if state.index >= 0):
            if self._queued_since is None:
                self._queued_since = now
            # Only for a caller waiting or polling now, not for a latency-bound past (waited stays set after a
            # driven cycle): a step that submits 200 gradients and then waits would send the first one from
            # whichever thread looks first, and take two cycles.
            waiters = view.waiters
            if waiters.blocked > 0 or waiters.polled or self._inbox or shutdown:
                if buggify.ON and not shutdown and buggify.held(
                        self, "peer.frame_held", self._queued_since + view.batch_spacing(), now):
                    return self._queued_since + view.batch_spacing() - now     # the last moment the spacing allows
                return 0.0
            return self._queued_since + view.batch_spacing() - now
        pending = any(state.entries for state in sets.values() if state.index >= 0)
        if self._inbox:
            member_sets = {set_id for set_id, state in sets.items() if state.index >= 0}
            if pending or any(_is_urgent(frame, member_sets) for frame in self._inbox.values()):
                return 0.0
            return self._inbox_since + POLL_SECONDS - now
        if pending:
            return self._last_start + POLL_SECONDS - now
        return None

    def _send_frame(self, now: float, out: List) -> None:
        """Send this rank's messages for the next cycle to every peer, with the data of small allreduces."""
        view = self.view
        own: Dict[int, Message] = {}
        msgs: Dict[int, Msg] = {}
        budget = inline.INLINE_FRAME_BYTES
        for set_id, state in view.sets.items():
            if state.index < 0:
                continue
            requests = state.drain()
            data: Dict[str, bytes] = {}
            if len(state.ranks) == view.size:       # (only where every peer is a member: the frame goes to all)
                data, budget = inline.collect(requests, state.entries, budget)
            hits, full = split_hits(state.cache, state.last_requests, requests)
            shutdown = view.shutting_down() if set_id == 0 else False
            if shutdown or hits or full:
                msgs[set_id] = msg = Msg(shutdown, tuple(hits), tuple(full), data)
                own[set_id] = msg.message
            if data:
                self.held.hold(set_id, Contributors(state.index), data)
        send_to_each(self._others, Peer(now, msgs).encode(), "peer.broadcast_slow", out)
        self._own, self._own_clock = own, now
        self.presented = True
        self._queued_since = None

    def decide(self, state: SetState, shutdown: bool) -> Decision:
        """This member's coordinator decides the set's batches from every member's message (the cycle's frames)."""
        messages = []
        clock = 0.0
        for position, rank in enumerate(state.ranks):
            if rank == self.view.rank:
                message, sent_at = self._own.get(state.id, _EMPTY_MESSAGE), self._own_clock
            else:
                message, sent_at = self._message(state, position, rank)
            if position == 0:
                clock = sent_at     # stall times by one clock, so that every member decides alike
            messages.append(message)
        batches, stop, reports, arrivals = state.coordinator.step(messages, clock)
        if batches and log.isEnabledFor(logging.DEBUG):
            log.debug("negotiated (peer) in set %d: %s", state.id, [n for b in batches for r in b for n in r.names])
        return Decision(self.held.batches(state.id, len(state.ranks), batches), stop,
                        reports if state.index == 0 else (), arrivals)    # every member decides; the first reports

    def _message(self, state: SetState, position: int, rank: int) -> Tuple[Message, float]:
        """The message of the member at ``position`` (global ``rank``) and its clock; its data is held."""
        frame = self._frames[rank]
        msg = frame.messages.get(state.id)
        if msg is None:
            return _EMPTY_MESSAGE, frame.clock
        if msg.data:
            self.held.hold(state.id, Contributors(position), msg.data)
        return msg.message, frame.clock


class PeerNegotiation(Pumped):
    """The peer protocol over a loop (the engine's, or a simulated rank's)."""

    def __init__(self, loop: Loop):
        super().__init__(loop, PeerProtocol(loop, patience(loop)))
