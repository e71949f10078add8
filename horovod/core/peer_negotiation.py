"""Peer negotiation: how the ranks of a small job agree on what to execute without a coordinator in the middle.

Every rank sends one frame per cycle to every other rank, with its messages for every process set it belongs to;
every member of a set runs the set's coordinator (a pure function of the messages) and so decides the same batches,
errors and cache bits as every other member, with no reply to wait for: a tensor is ready one network hop after its
last rank submitted it, where the star through rank 0 needs two. Small allreduces carry their data in the frame and
are folded by every member, with no data phase. The design and its measurements: docs/engine.md.

:class:`PeerNegotiation` is the engine's side of it (a mixin: the loop, its locks and its sets live on the engine).
"""

from __future__ import annotations

import select
import time
from typing import Dict, List, Optional, Tuple

from horovod.common.exceptions import HorovodConfigError, HorovodInternalError
from horovod.common.types import OpType, Response
from horovod.core.controller import POLL_SECONDS, Message, decode_message, report_stalls
from horovod.core.ops import INLINE_TENSOR_BYTES, inline_eligible
from horovod.core.response_cache import split_hits
from horovod.core.set_state import SetState


# The largest job that negotiates peer to peer when HOROVOD_NEGOTIATION is auto. Every rank sends a frame to every
# other rank per cycle, n(n-1) frames instead of the star's 2(n-1): for a few ranks one hop less matters more.
PEER_NEGOTIATION_MAX_RANKS = 4
_EMPTY_MESSAGE = Message(False, (), ())
# Small allreduces (ops.INLINE_TENSOR_BYTES each) travel inside peer frames, up to this many bytes per frame.
INLINE_FRAME_BYTES = 16 * 1024


def peer_negotiation(config, size: int, oversubscribed: bool = False) -> bool:
    """Whether a job of ``size`` ranks negotiates peer to peer (HOROVOD_NEGOTIATION; the same on every rank).

    ``auto`` also keeps the star where some host runs more ranks than it has cores: every frame is a wake-up, and
    there the peers' n(n-1) frames per cycle cost more than the hop they save (3-4 ranks on 2 cores: 1 MiB 5-10 %
    slower, the 200-tensor step 5 % slower).

    Raises:
        HorovodConfigError: peer negotiation asked for together with autotune.
    """
    mode = config.negotiation
    if mode == "peer" and config.autotune:
        # Autotune changes the fusion threshold on rank 0 alone, and under peer negotiation every rank plans.
        raise HorovodConfigError("HOROVOD_NEGOTIATION=peer cannot run with HOROVOD_AUTOTUNE (autotune tunes on "
                                 "rank 0 alone); use auto or star")
    return size > 1 and (mode == "peer" or (
        mode == "auto" and size <= PEER_NEGOTIATION_MAX_RANKS and not config.autotune and not oversubscribed))


def oversubscribed(transport) -> bool:
    """Whether some host runs more of the job's ranks than it has cores (from every rank's rendezvous record, so
    every rank answers alike)."""
    hostnames = getattr(transport, "hostnames", None) or []
    cores = getattr(transport, "cores", None) or []
    if len(cores) != len(hostnames):
        return False
    ranks: Dict[str, int] = {}
    least: Dict[str, int] = {}
    for host, count in zip(hostnames, cores):
        ranks[host] = ranks.get(host, 0) + 1
        least[host] = min(least.get(host, count), count)
    return any(ranks[host] > least[host] for host in ranks)


def _is_peer_frame(frame) -> bool:
    """("p", the sender's clock, {set id: message}): one rank's messages for one cycle."""
    return isinstance(frame, tuple) and len(frame) == 3 and frame[0] == "p" and isinstance(frame[1], float) \
        and isinstance(frame[2], dict)


def _is_urgent(frame, member_sets) -> bool:
    """A peer frame that needs an answer even from a rank with nothing pending: shutdown, a join, or requests for a
    process set this rank is not in (it cannot submit there, and that set's cycle waits for its frame)."""
    try:
        return any(set_id not in member_sets or message[0] or any(r[1] == OpType.JOIN for r in message[2])
                   for set_id, message in frame[2].items())
    except (TypeError, IndexError, AttributeError):
        return True     # malformed: the cycle decodes it and reports the error
def _inline_data(data, rank: int) -> Dict[str, bytes]:
    if not (isinstance(data, dict) and all(isinstance(k, str) and isinstance(v, bytes) for k, v in data.items())):
        raise HorovodInternalError(f"malformed tensor data in rank {rank}'s negotiation frame")
    return data


class PeerNegotiation:
    """The peer protocol's steps, run by the engine's loop (see Engine._run_steps)."""

    def _peer_step(self) -> bool:
        """Peer negotiation, every rank: send this cycle's messages to every other rank when due, then run the cycle
        once every rank's have arrived; True when the job shuts down.

        Every member of a set runs the set's coordinator over the same messages (and the clock of the set's first
        rank), so all decide the same batches without a reply: a tensor is ready one network hop after its last
        rank submitted it instead of two, and the rank that submits last negotiates at once. A frame is due when
        this rank has requests (at once while a caller waits, else after the batch spacing, so that a burst of
        gradients travels together), when a peer's frame waits and this rank has tensors it might complete (or the
        frame carries a shutdown or a join), and otherwise every poll interval while anything waits, for the
        stall checks. One frame per rank and cycle: a peer's next frame is read only after this cycle ran, so it
        never lands in the middle of the data phase.
        """
        peers = self._peer_fds
        while True:
            timeout = None
            if not self._presented:
                now = time.monotonic()
                timeout = self._frame_due(now)
                if timeout is not None and timeout <= 0:
                    self._send_frame(now)
                    timeout = None
            if self._presented and len(self._inbox) == self.size - 1:
                break
            waiting = [fd for fd, peer in peers.items() if peer not in self._inbox]
            if self._presented and self.transport.timeout > 0:
                # A live peer answers a frame within a poll interval, idle or not: one silent for the transport's
                # timeout is hung or cut off (an idle star follower would never be asked). What already arrived is
                # read first: this process may have been the one paused.
                left = self._own_clock + self.transport.timeout - time.monotonic()
                if left <= 0:
                    arrived = select.select(waiting, [], [], 0)[0]
                    if not arrived:
                        raise self.transport.silent(peers[waiting[0]])
                timeout = max(left, 0.0) if timeout is None else min(timeout, max(left, 0.0))
            for fd in self._select([self._wake_r] + waiting, timeout):
                if fd is self._wake_r:
                    self._drain_wake()
                    continue
                peer = peers[fd]
                if peer in self._inbox:
                    continue    # read by a caller that ran the loop meanwhile (the list was made before)
                frame = self.transport.recv_obj(peer)
                if not _is_peer_frame(frame):
                    raise HorovodInternalError(f"rank {self.rank} expected rank {peer}'s negotiation frame, got "
                                               f"{frame!r:.100} (is HOROVOD_NEGOTIATION the same on every rank?)")
                self._inbox[peer] = frame
                if self._inbox_since is None:
                    self._inbox_since = time.monotonic()
        self._presented = False
        self._frames, self._inbox, self._inbox_since = self._inbox, {}, None
        self._polled = False
        self._last_start = time.monotonic()
        self._waited_before, self._waited = self._waited, self._blocked > 0
        return self._cycle()

    def _frame_due(self, now: float) -> Optional[float]:
        """Peer negotiation: in how long this rank's frame for the next cycle is due (<= 0: now; None: not yet)."""
        if self._shutdown or any(state.queue for state in self._sets.values() if state.index >= 0):
            if self._queued_since is None:
                self._queued_since = now
            # Only for a caller waiting or polling now, not for a latency-bound past (_waited stays set after a
            # driven cycle): a step that submits 200 gradients and then waits would send the first one from
            # whichever thread looks first, and take two cycles.
            if self._blocked > 0 or self._polled or self._inbox or self._shutdown:
                return 0.0
            return self._queued_since + self._batch_spacing() - now
        pending = any(state.entries for state in self._sets.values() if state.index >= 0)
        if self._inbox:
            member_sets = {set_id for set_id, state in self._sets.items() if state.index >= 0}
            if pending or any(_is_urgent(frame, member_sets) for frame in self._inbox.values()):
                return 0.0
            return self._inbox_since + POLL_SECONDS - now
        if pending:
            return self._last_start + POLL_SECONDS - now
        return None

    def _send_frame(self, now: float) -> None:
        """Send this rank's messages for the next cycle to every peer.

        Small allreduces carry their data along: every member then holds every contribution once the tensor is
        ready, and folds them itself (as the exchange allreduce would, in rank order) without a data phase.
        """
        own: Dict[int, Message] = {}
        wire: Dict[int, tuple] = {}
        budget = INLINE_FRAME_BYTES
        for set_id, state in self._sets.items():
            if state.index < 0:
                continue
            requests = state.drain()
            data: Dict[str, bytes] = {}
            # (Only where every peer is a member: the frame goes to every rank.)
            entries = state.entries
            for request in requests if len(state.ranks) == self.size else ():
                entry = entries.get(request.name)
                array = entry.array if entry is not None else None
                # The size first: a training step's 200 gradients mostly fail it, and it costs an attribute read.
                if array is not None and array.nbytes <= min(budget, INLINE_TENSOR_BYTES) \
                        and inline_eligible(request):
                    data[request.name] = array.tobytes()
                    budget -= array.nbytes
            hits, full = split_hits(state.cache, state.last_requests, requests)
            shutdown = self._shutdown if set_id == 0 else False
            if shutdown or hits or full:
                own[set_id] = Message(shutdown, tuple(hits), tuple(full))
                wire[set_id] = (shutdown, hits, [r.to_wire() for r in full], data)
            if data:
                state.hold_inline(state.index, data)
        frame = ("p", now, wire)
        for peer in self._peer_fds.values():
            self.transport.send_obj(peer, frame)
        self._own, self._own_clock = own, now
        self._presented = True
        self._queued_since = None

    def _decide(self, state: SetState) -> Tuple[bool, List[List[Response]]]:
        """Peer negotiation: this member's coordinator decides the set's batches from every member's message."""
        messages = []
        clock = 0.0
        for position, rank in enumerate(state.ranks):
            if rank == self.rank:
                message, sent_at = self._own.get(state.id, _EMPTY_MESSAGE), self._own_clock
            else:
                frame = self._frames[rank]
                data = frame[2].get(state.id)
                if data is not None and not (isinstance(data, tuple) and len(data) in (3, 4)):
                    raise HorovodInternalError(f"malformed negotiation message {data!r:.200} from rank {rank}")
                message, sent_at = (_EMPTY_MESSAGE if data is None else decode_message(data[:3])), frame[1]
                if data is not None and len(data) > 3 and data[3]:
                    state.hold_inline(position, _inline_data(data[3], rank))
            if position == 0:
                clock = sent_at     # stall times by one clock, so that every member decides alike
            messages.append(message)
        batches, stop, reports = state.coordinator.step(messages, clock)
        if state.index == 0:
            report_stalls(reports)
        if self.timeline is not None:
            self.timeline.negotiated(state.id, state.coordinator.arrivals, batches)
        return stop, batches
