"""Star negotiation: rank 0 coordinates, for jobs above 4 ranks or with more ranks than cores on a host.

Every rank sends its requests to rank 0 (a follower ahead of the cycle, unasked: its *early message*), whose
coordinator decides and replies with the batches to execute, cached responses as bits. Rank 0 starts a cycle (a GO
frame, or the reply itself for a follower whose message is already there) only when it can make something ready,
so a backward pass does not pay a cycle per gradient. The design and its measurements: docs/engine.md, "When a cycle
runs (star)".

:class:`StarNegotiation` is the engine's side of it (a mixin: the loop, its locks and its sets live on the engine).
"""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType, Response
from horovod.core.controller import IDLE, NEW, POLL_SECONDS, Message, decode_message, report_stalls
from horovod.core.response_cache import split_hits
from horovod.core.set_state import SetState

GO = ("go",)
ANNOUNCED_POLL_SECONDS = 0.01   # rank 0 looks again this often while a follower's early message waits for a cycle


def _is_early_message(frame) -> bool:
    return isinstance(frame, tuple) and len(frame) == 2 and frame[0] == "msg"


def _is_reply(frame) -> bool:
    return isinstance(frame, tuple) and len(frame) == 2 and isinstance(frame[1], list)


def _is_want(frame) -> bool:
    return isinstance(frame, tuple) and len(frame) == 2 and frame[0] == "want" and frame[1] == NEW


def _encode(response: Response, bit: Optional[int]):
    return response.to_wire() if bit is None else bit


class StarNegotiation:
    """The star protocol's steps, run by the engine's loop (see Engine._run_steps)."""

    def _drive_step(self) -> bool:
        """Rank 0: wait until a cycle can make a tensor ready, then run it; True when the job shuts down.

        A tensor becomes ready when its last rank submits it, so a cycle starts when a name that rank 0 itself just
        submitted, or that a follower just announced (its early message), has now been submitted by every rank of
        the global set; at once for anything rank 0 cannot look into (other process sets, shutdown, a join). While
        ranks merely wait for each other nothing is exchanged: during a backward pass every gradient would
        otherwise cost a cycle on every rank, which on a busy CPU is time taken from the computation. A slow poll
        (at least ``HOROVOD_CYCLE_TIME``) still runs while anything is pending, for stall checks.
        """
        fds = self._peer_fds
        while True:
            if self._wanted == NEW or self._cycle_is_useful():
                # While nobody blocks on a result (a backward pass submitting gradients as it goes), cycles
                # are spaced by HOROVOD_CYCLE_TIME so that tensors fuse; a waiting caller starts one at once.
                spacing = self._last_start + self._batch_spacing() - time.monotonic()
                if self._blocked > 0 or self._waited or self._waited_before or spacing <= 0:
                    break
                self._select([self._wake_r], spacing)
                self._drain_wake()
                continue
            timeout = None
            if self._early_names:
                # A follower that has sent its message stays silent until the cycle: requests it made since
                # are only seen by polling, soon (rank 0's own new requests start a cycle at once, above).
                timeout = self._last_start + max(self.cycle_time, ANNOUNCED_POLL_SECONDS) - time.monotonic()
            elif self._work() != IDLE or self._sets[0].coordinator.waiting():
                timeout = self._last_start + max(self.cycle_time, POLL_SECONDS) - time.monotonic()
            if timeout is not None and timeout <= 0:
                break
            readable = self._select([self._wake_r] + list(fds), timeout)
            for fd in readable:
                if fd is self._wake_r:
                    self._drain_wake()
                else:
                    self._wanted = max(self._wanted, self._expect_want(fds[fd]))
        self._drain_wake()
        self._last_start = time.monotonic()
        # Somebody waited for results since the previous cycle started: a blocking (latency-bound) caller,
        # whose next request should not wait for the cycle time either.
        self._waited_before, self._waited = self._waited, self._blocked > 0
        for peer in range(1, self.size):
            # A rank whose message for this cycle is already here learns that the cycle started from the
            # global set's reply itself: one frame (and one wake-up on that rank) less per cycle.
            if peer not in self._early:
                self.transport.send_obj(peer, GO)
        self._wanted = IDLE
        self._early_names.clear()
        self._early_urgent = False
        return self._cycle()

    def _cycle_is_useful(self) -> bool:
        """Rank 0: could a cycle started now make something ready (or must it run regardless)?"""
        if self._shutdown or self._early_urgent:
            return True
        for set_id, state in self._sets.items():
            if set_id != 0 and state.index >= 0 and state.queue:
                return True
        state = self._sets[0]
        coordinator = state.coordinator
        if self.size == 1:
            return bool(state.queue)
        queued = list(state.queue)
        if queued and self._early_names:
            return True     # our new requests may complete what a silent follower submitted after its message
        if any(r.op == OpType.JOIN for r in queued):
            return True
        if not self._early_names and coordinator.quiet():
            return False    # no other rank's submission is known: nothing can be ready (checked per wake-up)
        candidates = [r.name for r in queued]
        for names in self._early_names.values():
            candidates.extend(names)
        if not candidates:
            return False
        early, entries = self._early_names, state.entries
        for name in candidates:
            if name not in entries and not coordinator.has(name, 0):
                continue
            for index in range(1, self.size):
                announced = early.get(index)
                if not ((announced is not None and name in announced) or coordinator.has(name, index)):
                    break
            else:
                return True
        return False

    def _follow_step(self) -> bool:
        """Other ranks: announce new requests to rank 0 (or ask it for a cycle), run the cycle when told to.

        Returns after one cycle: True when the job shuts down.
        """
        coordinator_fd = self._coordinator_fd
        while True:
            timeout = None
            # After the early message nothing more may be sent until the cycle starts: rank 0 may already be
            # executing, and a frame arriving then would land in the middle of the data phase.
            if not self._presented and self._work() == NEW:
                if self._presentable():
                    timeout = self._present(time.monotonic())
                elif self._asked != NEW:
                    # Work rank 0 cannot see (another set, shutdown): a cycle now.
                    self.transport.send_obj(0, ("want", NEW))
                    self._asked = NEW
            readable = self._select([self._wake_r, coordinator_fd], timeout)
            if self._wake_r in readable:
                self._drain_wake()
            if coordinator_fd in readable:
                frame = self.transport.recv_obj(0)
                if frame != GO:
                    if not (self._presented and _is_reply(frame)):
                        raise HorovodInternalError(f"rank {self.rank} expected a cycle start from rank 0, got "
                                                   f"{frame!r:.100}")
                    self._reply = frame      # the answer to the message we presented: the cycle has started
                self._asked = IDLE
                self._waited_before, self._waited = self._waited, self._blocked > 0
                return self._cycle()

    def _presentable(self) -> bool:
        """A follower: only global-set requests wait, which its early message can carry."""
        return bool(self._sets[0].queue) and not self._shutdown and not any(
            state.queue for set_id, state in self._sets.items() if set_id != 0)

    def _present(self, now: float) -> Optional[float]:
        """A follower: send the global set's message for the next cycle if it is due, else say in how long.

        Sent right away instead of asking for a cycle and then sending it: one network hop less, and rank 0 sees
        which names it completes. While nobody here waits for results, requests are gathered for the batch spacing
        first, so that the message (and the cycle it completes) carries a burst of gradients rather than one.
        """
        if self._queued_since is None:
            self._queued_since = now
        timeout = self._queued_since + self._batch_spacing() - now
        if self._blocked > 0 or self._waited or self._waited_before or timeout <= 0:
            self.transport.send_obj(0, ("msg", self._message(self._sets[0], self._shutdown)))
            self._presented = True
            self._queued_since = None
            return None
        return timeout

    def _recv_message(self, state: SetState, peer: int):
        """The next negotiation message from ``peer``, skipping cycle requests that this cycle already answers."""
        if state.id == 0 and peer in self._early:
            return self._early.pop(peer)
        while True:
            frame = self.transport.recv_obj(peer)
            if _is_early_message(frame):
                return frame[1]
            if not _is_want(frame):
                return frame

    def _expect_want(self, peer: int) -> int:
        """Read what an idle rank sent: a cycle request, or its global-set message for the next cycle."""
        frame = self.transport.recv_obj(peer)
        if _is_early_message(frame):
            if peer in self._early:
                raise HorovodInternalError(f"rank {peer} sent two messages for one cycle")
            self._early[peer] = frame[1]
            self._announce(peer, frame[1])
            return IDLE
        if not _is_want(frame):
            raise HorovodInternalError(f"rank 0 expected a cycle request from rank {peer}, got {frame!r:.100}")
        return frame[1]

    def _announce(self, peer: int, message) -> None:
        """Note the names a follower's early message carries, for :meth:`_cycle_is_useful`."""
        try:
            shutdown, hits, requests = message
            cache = self._sets[0].cache
            names = {cache.name(bit) for bit in hits}
            names.update(r[0] for r in requests)
            urgent = bool(shutdown) or any(r[1] == OpType.JOIN for r in requests)
        except (TypeError, ValueError, KeyError, IndexError):
            urgent, names = True, set()     # malformed: the cycle decodes it and reports the error
        self._early_names[peer] = names
        self._early_urgent = self._early_urgent or urgent

    @staticmethod
    def _message(state: SetState, shutdown: bool) -> tuple:
        hits, full = split_hits(state.cache, state.last_requests, state.drain())
        return (shutdown, hits, [r.to_wire() for r in full])

    def _negotiate_star(self, state: SetState, shutdown: bool) -> Tuple[bool, List[List[Response]]]:
        """One set's negotiation: rank 0 decides and replies, the others send their message and read the reply."""
        transport = self.transport
        if state.coordinator is not None:
            hits, full = split_hits(state.cache, state.last_requests, state.drain())
            messages = [Message(shutdown, tuple(hits), tuple(full))]
            for peer in state.ranks[1:]:
                messages.append(decode_message(self._recv_message(state, peer)))
            now = time.monotonic()
            batches, stop, reports = state.coordinator.step(messages, now)
            report_stalls(reports)
            if self.timeline is not None:
                self.timeline.negotiated(state.id, state.coordinator.arrivals, batches)
            cached_bit = state.cache.cached_bit
            encoded = [[_encode(r, cached_bit(r)) for r in batch] for batch in batches]
            for peer in state.ranks[1:]:
                transport.send_obj(peer, (stop, encoded))
            return stop, batches
        coordinator = state.ranks[0]
        reply = None
        if state.id == 0 and self._presented:
            self._presented = False          # this cycle answers the message we sent while idle
            reply, self._reply = self._reply, None
        else:
            transport.send_obj(coordinator, self._message(state, shutdown))
        if reply is None:
            reply = transport.recv_obj(coordinator)
        if not _is_reply(reply):
            raise HorovodInternalError(f"malformed negotiation reply {reply!r:.200}")
        try:
            batches = [[state.cache.response(r) if isinstance(r, int) else Response.from_wire(r) for r in batch]
                       for batch in reply[1]]
        except (KeyError, ValueError, TypeError) as exc:
            raise HorovodInternalError(f"undecodable negotiation reply: {exc}") from None
        return bool(reply[0]), batches
