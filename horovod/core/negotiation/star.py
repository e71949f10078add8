"""Star negotiation: rank 0 coordinates, for jobs above 4 ranks or with more ranks than cores on a host.

Every rank sends its requests to rank 0 (a follower ahead of the cycle, unasked: its *early message*), whose
coordinator decides and replies with the batches to execute, cached responses as bits. Rank 0 starts a cycle (a GO
frame, or the reply itself for a follower whose message is already there) only when it can make something ready,
so a backward pass does not pay a cycle per gradient. Rank 0 plays :class:`StarRoot`, every other rank
:class:`StarFollower`. The design and its measurements: docs/engine.md, "When a cycle runs (star)".
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Set, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType
from horovod.core import buggify
from horovod.core.decision import Contributors, Decision, Message
from horovod.core import fusion
from horovod.core.negotiation import inline
from horovod.core.negotiation.base import IDLE, NEW, POLL_SECONDS, Batch, Loop, Negotiation
from horovod.core.negotiation.frames import GO, WANT_NOW, Go, Msg, Reply, Want, receive
from horovod.core.response_cache import split_hits
from horovod.core.set_state import SetState

log = logging.getLogger("horovod")

__all__ = ["StarNegotiation", "StarRoot", "StarFollower", "ANNOUNCED_POLL_SECONDS", "decode_reply",
           "message_and_data"]

ANNOUNCED_POLL_SECONDS = 0.01   # rank 0 looks again this often while a follower's early message waits for a cycle
_WANT_WIRE = Want(WANT_NOW).encode()
_GO_WIRE = GO.encode()
_GO_ONLY = (Go,)
_GO_OR_REPLY = (Go, Reply)


def decode_reply(state: SetState, reply: Reply, sender: int) -> Decision:
    """A coordinator's reply as the batches to execute (cached responses looked up by their bits).

    Raises:
        HorovodInternalError: the reply names a bit this rank's cache does not hold.
    """
    cache = state.cache
    try:
        batches = [[cache.response(r) if type(r) is int else r for r in batch] for batch in reply.batches]
    except KeyError as exc:
        raise HorovodInternalError(f"rank {sender}'s negotiation reply names a response this rank's cache does "
                                   f"not hold: {exc}") from None
    results = reply.results
    if results is None:
        return Decision([Batch(batch) for batch in batches], reply.stop)
    return Decision([Batch(batch, None, folded) for batch, folded in zip(batches, results)], reply.stop)


def message_and_data(state: SetState, shutdown: bool, relay: bool) -> Msg:
    """This rank's message for ``state`` (cached requests as bits) and, with ``relay``, its small allreduces' data."""
    requests = state.drain()
    hits, full = split_hits(state.cache, state.last_requests, requests)
    return Msg(shutdown, tuple(hits), tuple(full), _relayed(state, requests) if relay else {})


def _relayed(state: SetState, requests) -> Dict[str, bytes]:  # the data of ``requests`` a star message may carry
    return inline.collect(requests, state.entries, inline.relayed_budget(len(state.ranks)))[0]


def _bit_or_response(response, bit: Optional[int]):
    return response if bit is None else bit


class StarNegotiation(Negotiation):
    """What both roles of the star do per set: the set's first rank decides and replies, the others ask."""

    name = "star"

    def __init__(self, loop: Loop):
        super().__init__(loop)
        self.held = inline.HeldData()    # small allreduces' data that came with the messages (a set's first rank)

    def negotiate(self, state: SetState, shutdown: bool) -> Decision:
        """One set's negotiation: its first rank decides and replies, the others send their message and read the
        reply."""
        if state.coordinator is not None:
            return self._coordinate(state, shutdown)
        sent, reply = self._answered(state)
        transport = self.loop.transport
        coordinator = state.ranks[0]
        if not sent:
            transport.send_obj(coordinator, message_and_data(state, shutdown, state.id == 0).encode())
        if reply is None:
            reply = receive(transport, coordinator, Reply)
        return decode_reply(state, reply, coordinator)

    def _coordinate(self, state: SetState, shutdown: bool) -> Decision:
        requests = state.drain()
        hits, full = split_hits(state.cache, state.last_requests, requests)
        messages = [Message(shutdown, tuple(hits), tuple(full))]
        if state.id == 0:    # rank 0's own small allreduces' data, held with the others'
            self.held.hold(0, Contributors(0), _relayed(state, requests))
        for position, peer in enumerate(state.ranks[1:], 1):
            messages.append(self._hold(state, position, self._recv_message(state, peer)))
        batches, stop, reports, arrivals = state.coordinator.step(messages, self.loop.clock())
        if batches and log.isEnabledFor(logging.DEBUG):
            log.debug("negotiated (star) in set %d: %s", state.id, [n for b in batches for r in b for n in r.names])
        decided, reply = self._reply_with_data(state, stop, batches)
        wire = reply.encode()
        if buggify.ON:
            buggify.send_each(self.loop.transport, state.ranks[1:], wire, "star.reply_slow")
        else:
            for peer in state.ranks[1:]:
                self.loop.transport.send_obj(peer, wire)
        return Decision(decided, stop, reports, arrivals)

    def _reply_with_data(self, state: SetState, stop: bool, batches) -> Tuple[List[Batch], Reply]:
        """The decided batches, those whose every member's data is held split off and folded here, and the reply
        that tells the others (cached responses as bits, the results of the folded batches)."""
        decided = self.held.batches(state.id, len(state.ranks), batches)
        results: List[Optional[bytes]] = [None] * len(decided)
        for i, batch in enumerate(decided):
            if batch.contributions is not None:
                results[i] = inline.fold(fusion.merge(batch.responses), batch.contributions, partial=batch.partial,
                                         members=len(state.ranks)).tobytes()
                decided[i] = Batch(batch.responses, None, results[i])
        cached_bit = state.cache.cached_bit
        items = [[_bit_or_response(r, cached_bit(r)) for r in batch.responses] for batch in decided]
        return decided, Reply(stop, items, results if any(r is not None for r in results) else None)

    def _hold(self, state: SetState, position: int, msg: Msg) -> Message:
        """``msg``'s message; the allreduce data it carries is held for folding (global set only)."""
        if msg.data and state.id == 0:
            self.held.hold(state.id, Contributors(position), msg.data)
        return msg.message

    def forget(self, set_id: int) -> None:
        """Drop the data held for a removed set."""
        self.held.forget(set_id)

    def _recv_message(self, state: SetState, peer: int) -> Msg:
        """The next negotiation message from ``peer``, skipping cycle requests that this cycle already answers."""
        while True:
            frame = receive(self.loop.transport, peer, Msg, Want)
            if type(frame) is Msg:
                return frame

    def _answered(self, state: SetState) -> Tuple[bool, Optional[Reply]]:
        """Whether this rank's message for ``state`` went out before the cycle (its early message), and the reply
        that came with the cycle start, if one did."""
        return False, None


class StarRoot(StarNegotiation):
    """Rank 0: starts a cycle when one can make a tensor ready, and coordinates the global set."""

    def __init__(self, loop: Loop):
        super().__init__(loop)
        self._followers: Dict[int, int] = {}        # connection fd -> rank
        self._early: Dict[int, Msg] = {}            # followers' global-set messages, by rank, until the cycle
        self._early_names: Dict[int, Set[str]] = {}  # the names each early message announces, until the cycle
        self._early_urgent = False                  # an early message carries a join or shutdown
        self._wanted = IDLE                         # the most urgent cycle request read from a follower
        self._last_start = float("-inf")            # when the last cycle started
        self._waiting_since: Optional[float] = None  # when rank 0 last found work pending, after the last cycle

    def start(self) -> None:
        """Listen to every follower."""
        self._followers = {self.loop.transport.fileno(p): p for p in range(1, self.loop.size)}

    def await_cycle(self) -> None:
        """Wait until a cycle can make a tensor ready, then start it.

        A tensor becomes ready when its last rank submits it, so a cycle starts when a name that rank 0 itself just
        submitted, or that a follower just announced (its early message), has now been submitted by every rank of
        the global set; at once for anything rank 0 cannot look into (other process sets, shutdown, a join). While
        ranks merely wait for each other nothing is exchanged: during a backward pass every gradient would
        otherwise cost a cycle on every rank, which on a busy CPU is time taken from the computation. A slow poll
        (at least ``HOROVOD_CYCLE_TIME``) still runs while anything is pending, for stall checks.
        """
        loop = self.loop
        while not self._due():
            pass
        loop.wake.drain()
        self._last_start = self.loop.clock()
        for peer in range(1, loop.size):
            # A rank whose message is here learns of the cycle from the reply itself: one frame and wake-up less.
            if peer not in self._early:
                loop.transport.send_obj(peer, _GO_WIRE)
        self._wanted = IDLE
        self._waiting_since = None
        self._early_names.clear()
        self._early_urgent = False

    def _due(self) -> bool:
        """Sleep once until something changes; True when the cycle starts now."""
        loop = self.loop
        if self._wanted == NEW or self._cycle_is_useful():
            # While nobody blocks on a result (a backward pass submitting gradients as it goes), cycles
            # are spaced by HOROVOD_CYCLE_TIME so that tensors fuse; a caller waiting or polling now starts one at
            # once. (Not one that waited in the last cycle: a step that submits 200 gradients and then waits would
            # start a cycle for its first gradient, and take two.)
            spacing = self._last_start + loop.batch_spacing() - self.loop.clock()
            if loop.waiters.blocked > 0 or loop.waiters.polled or spacing <= 0 or \
                    buggify.ON and buggify.fires("star.cycle_early"):
                return True
            loop.select([loop.wake.reader], buggify.late(spacing, "star.timer_late") if buggify.ON else spacing)
            loop.wake.drain()
            return False
        timeout = None
        if self._early_names:
            # A follower that has sent its message stays silent until the cycle: requests it made since
            # are only seen by polling, soon (rank 0's own new requests start a cycle at once, above).
            timeout = self._last_start + max(loop.cycle_time, ANNOUNCED_POLL_SECONDS) - self.loop.clock()
        elif loop.work() != IDLE or loop.sets[0].coordinator.waiting():
            # Counted from when the wait began, not from the last cycle: a step longer than the interval would
            # otherwise start a cycle the moment rank 0 submits, before any other rank could.
            now = self.loop.clock()
            if self._waiting_since is None:
                self._waiting_since = now
            timeout = max(self._last_start, self._waiting_since) + max(loop.cycle_time, POLL_SECONDS) - now
        if timeout is not None and (timeout <= 0 or buggify.ON and buggify.fires("star.cycle_early")):
            return True     # (buggify: before every name it waits for is announced, or the poll is due)
        timeout = buggify.late(timeout, "star.timer_late") if buggify.ON else timeout
        for fd in loop.select([loop.wake.reader] + list(self._followers), timeout):
            if fd is loop.wake.reader:
                loop.wake.drain()
            else:
                self._wanted = max(self._wanted, self._expect_want(self._followers[fd]))
        return False

    def _cycle_is_useful(self) -> bool:
        """Could a cycle started now make something ready (or must it run regardless)?"""
        loop = self.loop
        if loop.shutting_down() or self._early_urgent:
            return True
        for set_id, state in loop.sets.items():
            if set_id != 0 and state.index >= 0 and state.queue:
                return True
        state = loop.sets[0]
        if loop.size == 1:
            return bool(state.queue)
        queued = list(state.queue)
        if queued and self._early_names:
            return True     # our new requests may complete what a silent follower submitted after its message
        if any(r.op == OpType.JOIN for r in queued):
            return True
        if not self._early_names and state.coordinator.quiet():
            return False    # no other rank's submission is known: nothing can be ready (checked per wake-up)
        return self._completes([r.name for r in queued], state)

    def _completes(self, candidates: List[str], state: SetState) -> bool:
        """Whether some queued or announced name has now been submitted by every rank of the global set."""
        early, entries, coordinator = self._early_names, state.entries, state.coordinator
        for names in early.values():
            candidates.extend(names)
        for name in candidates:
            if name not in entries and not coordinator.has(name, 0):
                continue
            for index in range(1, self.loop.size):
                announced = early.get(index)
                if not ((announced is not None and name in announced) or coordinator.has(name, index)):
                    break
            else:
                return True
        return False

    def _recv_message(self, state: SetState, peer: int):
        if state.id == 0 and peer in self._early:
            return self._early.pop(peer)
        return super()._recv_message(state, peer)

    def _expect_want(self, peer: int) -> int:
        """Read what an idle rank sent: a cycle request, or its global-set message for the next cycle."""
        frame = receive(self.loop.transport, peer, Msg, Want)
        if type(frame) is Msg:
            if peer in self._early:
                raise HorovodInternalError(f"rank {peer} sent two messages for one cycle")
            self._early[peer] = frame
            self._announce(peer, frame)
            return IDLE
        return NEW

    def _announce(self, peer: int, message: Msg) -> None:
        """Note the names a follower's early message carries, for :meth:`_cycle_is_useful`."""
        cache = self.loop.sets[0].cache
        try:
            names = {cache.name(bit) for bit in message.hits}
        except KeyError:
            names = set()
            self._early_urgent = True   # a bit this cache lacks: the cycle reports it (Coordinator.step)
        names.update(r.name for r in message.requests)
        self._early_names[peer] = names
        self._early_urgent = self._early_urgent or message.shutdown or any(
            r.op == OpType.JOIN for r in message.requests)


class StarFollower(StarNegotiation):
    """Every other rank: announces its global-set requests to rank 0 (or asks for a cycle) and waits for the start."""

    def __init__(self, loop: Loop):
        super().__init__(loop)
        self._coordinator_fd: Optional[int] = None
        self._reply: Optional[Reply] = None         # the global set's reply that started this cycle
        self._asked = IDLE                          # what this rank asked rank 0 for since the last cycle
        self._asked_at: Optional[float] = None      # when this rank began waiting for rank 0 to start a cycle
        self._told = 0                              # how often that wait was reported to the transport
        self._queued_since: Optional[float] = None  # when the global set's queue became non-empty

    def start(self) -> None:
        """Listen to rank 0."""
        self._coordinator_fd = self.loop.transport.fileno(0)

    def wake_on_wait(self) -> bool:
        """A waiting thread makes the early message due at once."""
        return not self.presented and bool(self.loop.sets[0].queue)

    def await_cycle(self) -> None:
        """Announce new requests to rank 0 (or ask it for a cycle); return when rank 0 starts the cycle.

        Raises:
            HorovodInternalError: rank 0 sent something other than a cycle start.
        """
        loop = self.loop
        coordinator_fd = self._coordinator_fd
        while True:
            timeout = None
            # After the early message nothing more may be sent until the cycle starts: rank 0 may already be
            # executing, and a frame arriving then would land in the middle of the data phase.
            if not self.presented and loop.work() == NEW:
                if self._presentable():
                    timeout = self._present(self.loop.clock())
                elif self._asked != NEW:
                    # Work rank 0 cannot see (another set, shutdown): a cycle now.
                    loop.transport.send_obj(0, _WANT_WIRE)
                    self._asked = NEW
            timeout = self._patience(timeout)
            timeout = buggify.late(timeout, "star.timer_late") if buggify.ON else timeout
            readable = loop.select([loop.wake.reader, coordinator_fd], timeout)
            if loop.wake.reader in readable:
                loop.wake.drain()
            if coordinator_fd in readable:
                if self._told:
                    loop.transport.resumed()
                self._asked_at, self._told = None, 0
                # The reply to the message we presented starts the cycle too.
                frame = receive(loop.transport, 0, *(_GO_OR_REPLY if self.presented else _GO_ONLY))
                if type(frame) is Reply:
                    self._reply = frame
                self._asked = IDLE
                return

    def _patience(self, timeout: Optional[float]) -> Optional[float]:
        """Tell the transport of rank 0's silence every half timeout once asked for a cycle (it answers within a
        poll interval while its engine runs)."""
        if not (self.presented or self._asked == NEW):
            return timeout
        tick = self.loop.transport.timeout / 2
        if tick <= 0:
            return timeout
        now = self.loop.clock()
        if self._asked_at is None:
            self._asked_at = now
        silent = now - self._asked_at
        if silent >= (self._told + 1) * tick:
            self._told += 1
            self.loop.transport.waiting(0, silent)
        left = (self._told + 1) * tick - silent
        return left if timeout is None else min(timeout, left)

    def _presentable(self) -> bool:
        """Only global-set requests wait, which the early message can carry."""
        sets = self.loop.sets
        return bool(sets[0].queue) and not self.loop.shutting_down() and not any(
            state.queue for set_id, state in sets.items() if set_id != 0)

    def _present(self, now: float) -> Optional[float]:
        """Send the global set's message for the next cycle if it is due, else say in how long.

        Sent right away instead of asking for a cycle and then sending it: one network hop less, and rank 0 sees
        which names it completes. While nobody here waits for results, requests are gathered for the batch spacing
        first, so that the message (and the cycle it completes) carries a burst of gradients rather than one.
        """
        loop = self.loop
        if self._queued_since is None:
            self._queued_since = now
        timeout = self._queued_since + loop.batch_spacing() - now
        if loop.waiters.blocked > 0 or loop.waiters.polled or timeout <= 0:
            if buggify.ON and buggify.held(self, "star.message_held", self._queued_since + loop.batch_spacing(), now):
                return timeout          # to the last moment the spacing allows
            loop.transport.send_obj(0, message_and_data(loop.sets[0], loop.shutting_down(), True).encode())
            self.presented = True
            self._queued_since = None
            return None
        return timeout

    def _answered(self, state: SetState) -> Tuple[bool, Optional[Reply]]:
        if state.id == 0 and self.presented:
            self.presented = False          # this cycle answers the message we sent while idle
            reply, self._reply = self._reply, None
            return True, reply
        return False, None
