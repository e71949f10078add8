"""Shared-memory segments for the ranks of one host.

Each rank of a group owns one segment (a file in ``/dev/shm`` mapped by every rank of the group); collectives write
into their own segment and read their peers' directly, so bytes between ranks of one host never cross a socket.
Segments are unlinked as soon as every peer has mapped them, so nothing is left behind in ``/dev/shm`` even when a
process is killed.

Barriers use a flag per rank at the head of its segment: a rank publishes its barrier count, then waits until every
peer's count caught up, spinning for a few tens of microseconds (the common case when ranks have cores of their own)
and then sleeping in short ``select`` waits on the peers' sockets, so that waiting ranks leave the CPU to the others
when ranks outnumber cores, and a peer that dies (its socket closes) is noticed at once. Flags rely on stores becoming
visible in program order (x86's memory model); elsewhere barriers exchange 1-byte messages over TCP instead.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import platform
import select
import time
from typing import List, Optional, Sequence

import numpy as np

from horovod.common.exceptions import HorovodInternalError

SHM_DIR = "/dev/shm"
HEADER_BYTES = 4096            # the barrier flag lives here; data starts page-aligned after it
SPIN_SECONDS = 50e-6
POLL_SECONDS = 200e-6
_FLAG_BARRIERS = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def job_token(secret: bytes, scope: str) -> str:
    """A name prefix private to one job (derived from its secret), so jobs never map each other's segments."""
    return hashlib.sha256(secret + scope.encode()).hexdigest()[:16]


class ShmSegments:
    """One growable segment per rank of a group; ``view(i)`` maps rank ``i``'s segment as bytes."""

    def __init__(self, transport, ranks: Sequence[int], index: int, prefix: str, min_bytes: int = 64 * 1024):
        self.transport = transport
        self.min_bytes = min_bytes
        self.ranks = tuple(ranks)
        self.index = index
        self.prefix = prefix
        self.capacity = 0
        self._generation = 0
        self._maps: List[Optional[mmap.mmap]] = [None] * len(self.ranks)
        self._views: List[np.ndarray] = []
        self._flags: List[np.ndarray] = []
        self._epoch = 0
        self._token = bytearray(1)
        self.timeout = getattr(transport, "timeout", 30.0) or 30.0

    # -- synchronisation --------------------------------------------------------------------------------------------

    def barrier(self) -> None:
        """Wait until every rank of the group reached this point."""
        if not (_FLAG_BARRIERS and self._flags):
            return self._socket_barrier()
        self._epoch += 1
        epoch = self._epoch
        self._flags[self.index][0] = epoch
        peers = [f for i, f in enumerate(self._flags) if i != self.index]
        spin_until = time.perf_counter() + SPIN_SECONDS
        while time.perf_counter() < spin_until:
            if all(f[0] >= epoch for f in peers):
                return
        self._sleep_until(epoch, peers)

    def _sleep_until(self, epoch: int, peers: List[np.ndarray]) -> None:
        watched = {self.transport.fileno(r): r for i, r in enumerate(self.ranks) if i != self.index}
        deadline = time.monotonic() + self.timeout
        while not all(f[0] >= epoch for f in peers):
            readable = select.select(list(watched), [], [], POLL_SECONDS)[0] if watched else []
            if not watched:
                time.sleep(POLL_SECONDS)
            for fd in readable:
                # A closed socket means a dead peer; pending bytes are the peer's next message, for later.
                if self.transport.peer_closed(watched[fd]):
                    raise HorovodInternalError(f"rank {watched[fd]} closed its connection during a shared-memory "
                                               f"barrier; that rank probably died")
                del watched[fd]
            if time.monotonic() > deadline:
                late = [r for i, r in enumerate(self.ranks) if i != self.index and self._flags[i][0] < epoch]
                raise HorovodInternalError(f"ranks {late} did not reach a shared-memory barrier within "
                                           f"{self.timeout:g} s (HOROVOD_GLOO_TIMEOUT_SECONDS)")

    def _socket_barrier(self) -> None:
        """Dissemination barrier over the group's connections: ceil(log2 n) rounds of 1-byte exchanges."""
        n = len(self.ranks)
        distance = 1
        while distance < n:
            to = self.ranks[(self.index + distance) % n]
            frm = self.ranks[(self.index - distance) % n]
            pending = self.transport.isend(to, memoryview(b"\x01"))
            self.transport.recv_into(frm, memoryview(self._token))
            pending.wait()
            distance *= 2

    # -- segments ---------------------------------------------------------------------------------------------------

    def _path(self, position: int, generation: int) -> str:
        return os.path.join(SHM_DIR, f"{self.prefix}-{self.ranks[position]}-{generation}")

    def ensure(self, nbytes: int) -> None:
        """Grow every segment to at least ``nbytes`` (collective: every rank calls it with the same size)."""
        if nbytes <= self.capacity:
            return
        capacity = max(nbytes, 2 * self.capacity, 1 << 20)
        capacity = (capacity + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        size = capacity + HEADER_BYTES
        self._generation += 1
        own = self._path(self.index, self._generation)
        try:
            fd = os.open(own, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, size)
                mine = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            raise HorovodInternalError(f"cannot create shared memory segment {own} of {capacity} bytes: {exc}. "
                                       f"Set HOROVOD_SHM_DISABLE=1 to use TCP between local ranks") from None
        try:
            self._socket_barrier()              # every segment exists
            maps: List[mmap.mmap] = []
            for position in range(len(self.ranks)):
                if position == self.index:
                    maps.append(mine)
                    continue
                fd = os.open(self._path(position, self._generation), os.O_RDWR)
                try:
                    maps.append(mmap.mmap(fd, size))
                finally:
                    os.close(fd)
            self._socket_barrier()              # every rank mapped every segment
        finally:
            try:
                os.unlink(own)
            except OSError:
                pass
        self.close()
        self._maps = maps
        self._views = [np.frombuffer(m, dtype=np.uint8, offset=HEADER_BYTES) for m in maps]
        self._flags = [np.frombuffer(m, dtype=np.int64, count=1) for m in maps]
        self._flags[self.index][0] = self._epoch
        self._socket_barrier()                  # every flag holds the current count before anyone uses it
        self.capacity = capacity

    def view(self, position: int) -> np.ndarray:
        return self._views[position]

    def close(self) -> None:
        self._views = []
        self._flags = []
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass      # a result still views it; the mapping goes when that array does
        self._maps = [None] * len(self.ranks)
        self.capacity = 0
