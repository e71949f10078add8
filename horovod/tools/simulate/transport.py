"""The simulated transport: a rank's end of its connections over the world's network.

The engine's control frames travel as their real wire bytes, each connection delivering its frames once and in
order (as TCP does) whatever the network below copies or reorders, and a broken connection is reported as the real
transport reports it. The simulation runs no data phase, so the contract's byte-moving members refuse: a call to
one is a bug in the model, not a cost to charge.
"""

from __future__ import annotations

from collections import deque
from typing import Dict, NoReturn, Set

from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.core.negotiation import frames
from horovod.transport.base import NO_PATIENCE, Transport

__all__ = ["SimTransport"]


def _contributions(frame) -> int:
    """Small allreduces' inputs a star message or a tree's subtree message carries to rank 0."""
    if type(frame) is frames.Msg:
        return len(frame.data)
    return sum(len(data) for _, data in frame.datas) if type(frame) is frames.Up else 0


class SimTransport(Transport):
    """:class:`horovod.transport.base.Transport` over the world's network, for ``rank`` (a
    :class:`~horovod.tools.simulate.rank.SimRank`): control frames only."""

    timeout = 0.0       # no patience warnings: a silent peer is the fault model's to break
    liveness = 0.0      # a lost peer is the fault model's too (``SimRank.connection_closed``)
    secret = b""        # no shared memory is made (the job disables it)
    job_token = "simulated"
    patience = NO_PATIENCE

    def __init__(self, rank):
        self._rank = rank
        self.rank, self.size = rank.rank, rank.size
        world = rank.world      # every rank's host and its cores, as the rendezvous records give them
        self.hostnames = [f"host{world.host_of(r)}" for r in range(self.size)]
        self.cores = [len(world.hosts[world.host_of(r)].free) for r in range(self.size)]
        self.inbox: Dict[int, deque] = {}
        self._sent: Dict[int, int] = {}        # peer -> frames sent on the connection (the next one's number)
        self._next: Dict[int, int] = {}        # peer -> the number of the next frame to deliver
        self._early: Dict[int, Dict[int, bytes]] = {}   # peer -> frames that overtook one still missing, by number
        self.copies_dropped = self.overtaken = 0      # frames the network copied, frames that came too early
        self.closed: Dict[int, int] = {}       # peer -> the rank whose loss broke the connection
        self.peers: Set[int] = set()           # connections this rank holds
        self.frames_in = self.frames_out = self.bytes_in = self.bytes_out = 0
        self._closed = False

    def fileno(self, peer: int) -> int:
        """The connection to ``peer`` (opened now if it was not)."""
        self._open(peer)
        return peer

    def _open(self, peer: int) -> None:
        if peer not in self.peers:
            self.peers.add(peer)
            self._rank.job.connected(self.rank, peer)

    def send_obj(self, peer: int, message) -> None:
        """Send one control frame: its real bytes, timed by the world."""
        rank = self._rank
        self._check(peer)
        payload = wire.encode(message)
        self._open(peer)
        self.frames_out += 1
        self.bytes_out += len(payload)
        rank.charge(rank.world.cpu.frame + len(payload) * rank.world.cpu.byte)
        seq = self._sent.get(peer, 0)
        self._sent[peer] = seq + 1
        rank.job.send(rank.rank, peer, seq, payload, rank.clock())

    def arrived(self, peer: int, seq: int, payload: bytes) -> bool:
        """Frame ``seq`` from ``peer`` reached this rank's end of the connection: queued in order, held until the
        frames before it arrive, or dropped as a copy; whether the connection has more to read now."""
        expected = self._next.get(peer, 0)
        early = self._early.setdefault(peer, {})
        if seq < expected or seq in early:
            self.copies_dropped += 1
            return False
        early[seq] = payload
        self.overtaken += seq > expected
        queue = self.inbox.setdefault(peer, deque())
        while expected in early:
            queue.append(early.pop(expected))
            expected += 1
        self._next[peer] = expected
        return bool(queue)

    def recv_obj(self, peer: int):
        """The next control frame from ``peer``, decoded and checked as the real transport does."""
        rank = self._rank
        queue = self.inbox.get(peer)
        while not queue:
            self._check(peer)
            rank.wait({peer}, None)
            queue = self.inbox.get(peer)
        payload = queue.popleft()
        self.frames_in += 1
        self.bytes_in += len(payload)
        rank.charge(rank.world.cpu.frame + len(payload) * rank.world.cpu.byte)
        raw = wire.decode(payload)
        if rank.world.cpu.fold and rank.negotiation.name in ("star", "tree"):
            # Rank 0 holds the contributions a message carries and folds them before it replies; a relay reads its
            # children's and sends them on with its own message.
            rank.charge(rank.world.cpu.fold * _contributions(frames.decode(raw, peer)))
        return raw

    def check_open(self, peer: int) -> None:
        """Raise if the connection to ``peer`` broke."""
        self._check(peer)

    def fail(self, peer: int, exc: BaseException) -> HorovodInternalError:
        """The error for ``peer``'s connection failing with ``exc``; every later call raises too."""
        self._closed = True
        return HorovodInternalError(f"rank {self.rank}: connection to rank {peer} failed: {exc}")

    def fail_own(self, account: str) -> None:
        """Nothing to post: the fault model tells the survivors whom they lost (``SimRank.connection_closed``)."""

    def waiting(self, peer: int, silent_for: float) -> None:
        """Never told: with ``timeout`` 0 a silent peer is waited on for good."""

    def resumed(self) -> None:
        """Never told, as :meth:`waiting` is not."""

    def quiesce(self, peer: int) -> None:
        """Nothing is ever queued behind the caller's back: frames leave as they are sent."""

    def close(self) -> None:
        """Every later call raises."""
        self._closed = True

    def connection(self, peer: int) -> NoReturn:
        """No socket: the simulation moves no data."""
        self._no_data()

    def duplex(self) -> NoReturn:
        """No data phase: the simulated execution completes a batch's handles without moving its bytes."""
        self._no_data()

    def send(self, peer: int, data) -> NoReturn:
        """No data phase (see :meth:`duplex`)."""
        self._no_data()

    def isend(self, peer: int, view: memoryview) -> NoReturn:
        """No data phase (see :meth:`duplex`)."""
        self._no_data()

    def recv_into(self, peer: int, view: memoryview) -> NoReturn:
        """No data phase (see :meth:`duplex`)."""
        self._no_data()

    def _no_data(self) -> NoReturn:
        raise NotImplementedError(f"rank {self.rank}: the simulation moves control frames only, never data")

    def _check(self, peer: int) -> None:
        if self._closed:
            raise HorovodInternalError(f"rank {self.rank}: the transport was closed")
        lost = self.closed.get(peer)
        if lost is not None:
            raise HorovodInternalError(f"rank {self.rank}: connection to rank {peer} broke: rank {lost} was lost")
