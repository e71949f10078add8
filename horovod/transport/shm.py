"""Shared-memory segments for the ranks of one host.

Each rank of a group owns one segment (a file in ``/dev/shm`` mapped by every rank of the group); collectives write
into their own segment and read their peers' directly, so bytes between ranks of one host never cross a socket.
Segments are unlinked as soon as every peer has mapped them, so nothing is left behind in ``/dev/shm`` even when a
process is killed. Synchronisation uses the group's TCP connections (a dissemination barrier of 1-byte messages):
waiting ranks sleep in the kernel instead of spinning, which matters when ranks outnumber cores, and a dead peer is
noticed as on any other wait.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from typing import List, Optional, Sequence

import numpy as np

from horovod.common.exceptions import HorovodInternalError

SHM_DIR = "/dev/shm"
_HEADER = 4096    # a page before the data: the barrier counter, and page-aligned data after it
SPIN_SECONDS = 0.0002   # how long a barrier spins on shared memory before it sleeps in a receive


def spin_seconds(local_ranks: int) -> float:
    """How long a waiting rank may spin: only while every local rank has a core of its own."""
    return SPIN_SECONDS if local_ranks <= (os.cpu_count() or 1) else 0.0


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def job_token(secret: bytes, scope: str) -> str:
    """A name prefix private to one job (derived from its secret), so jobs never map each other's segments."""
    return hashlib.sha256(secret + scope.encode()).hexdigest()[:16]


class ShmSegments:
    """One growable segment per rank of a group; ``view(i)`` maps rank ``i``'s segment as bytes."""

    def __init__(self, transport, ranks: Sequence[int], index: int, prefix: str, min_bytes: int = 64 * 1024,
                 spin_seconds: float = 0.0, may_spin=None):
        self.transport = transport
        self.spin_seconds = spin_seconds
        self.may_spin = may_spin      # called per barrier: spinning is only cheap while the caller's threads wait
        self.min_bytes = min_bytes
        self.ranks = tuple(ranks)
        self.index = index
        self.prefix = prefix
        self.capacity = 0
        self._generation = 0
        self._maps: List[Optional[mmap.mmap]] = [None] * len(self.ranks)
        self._views: List[np.ndarray] = []
        self._token = bytearray(1)
        self._flags: List[np.ndarray] = []   # per segment: the number of barriers its rank has entered
        self._epoch = 0
        self._half = 0            # which half the next chunk of a halved collective uses
        self._settled = True      # no peer can still be reading our segments

    # -- synchronisation --------------------------------------------------------------------------------------------

    def barrier(self) -> None:
        """Every rank of the group has called ``barrier`` as often as this one.

        The bytes exchanged over the group's connections are the barrier (they also notice a dead peer). While
        ranks do not outnumber cores and the process has nothing else to run (its callers wait for results), a rank
        first spins briefly on its peers' counters in shared memory: once a counter moved, that peer's byte has been
        sent, so the receive below returns at once instead of sleeping, and a sleep and wake-up costs more than the
        whole exchange on a virtual machine. During a training step the cores compute, and nobody spins.
        """
        n = len(self.ranks)
        if n == 1:
            return
        if self._flags:
            self._flagged_barrier(n)
            return
        distance = 1
        while distance < n:
            to = self.ranks[(self.index + distance) % n]
            frm = self.ranks[(self.index - distance) % n]
            pending = self.transport.isend(to, memoryview(b"\x01"))
            self.transport.recv_into(frm, memoryview(self._token))
            pending.wait()
            distance *= 2

    def _flagged_barrier(self, n: int) -> None:
        # Every rank counts its barriers in its segment's header, whether or not it spins itself.
        peers = [p for p in range(n) if p != self.index]
        pending = [self.transport.isend(self.ranks[p], memoryview(b"\x01")) for p in peers]
        for p in pending:
            p.wait()
        self._epoch += 1
        epoch = self._epoch
        self._flags[self.index][0] = epoch      # after our bytes are on their way
        if self.spin_seconds > 0 and (self.may_spin is None or self.may_spin()):
            deadline = time.perf_counter() + self.spin_seconds
            for p in peers:
                flag = self._flags[p]
                while flag[0] < epoch and time.perf_counter() < deadline:
                    pass
        for p in peers:
            self.transport.recv_into(self.ranks[p], memoryview(self._token))

    def next_half(self) -> int:
        """The half of every segment the next chunk uses; halves alternate across collectives too."""
        half, self._half = self._half, self._half ^ 1
        return half

    def unsettle(self) -> None:
        """A collective ended without a closing barrier: peers may still read its last chunk."""
        self._settled = False

    def settle(self) -> None:
        """Before a collective that writes whole segments: everybody finished reading the previous one."""
        if not self._settled:
            self.barrier()
            self._settled = True

    # -- segments ---------------------------------------------------------------------------------------------------

    def _path(self, position: int, generation: int) -> str:
        return os.path.join(SHM_DIR, f"{self.prefix}-{self.ranks[position]}-{generation}")

    def ensure(self, nbytes: int) -> None:
        """Grow every segment to at least ``nbytes`` (collective: every rank calls it with the same size)."""
        if nbytes <= self.capacity:
            return
        capacity = max(nbytes, 2 * self.capacity, 1 << 20)
        capacity = (capacity + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        size = capacity + _HEADER
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
            self.barrier()                      # every segment exists
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
            self.barrier()                      # every rank mapped every segment
        finally:
            try:
                os.unlink(own)
            except OSError:
                pass
        self.close()
        self._maps = maps
        self._flags = [np.frombuffer(m, dtype=np.uint64, count=1) for m in maps]
        self._views = [np.frombuffer(m, dtype=np.uint8, offset=_HEADER) for m in maps]
        self._epoch = 0
        self._settled = True      # ``ensure`` synchronised every rank before the old segments went
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
