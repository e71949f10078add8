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
from typing import List, Optional, Sequence

import numpy as np

from horovod.common.exceptions import HorovodInternalError

SHM_DIR = "/dev/shm"


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
        self._token = bytearray(1)

    # -- synchronisation --------------------------------------------------------------------------------------------

    def barrier(self) -> None:
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
        self._generation += 1
        own = self._path(self.index, self._generation)
        try:
            fd = os.open(own, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, capacity)
                mine = mmap.mmap(fd, capacity)
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
                    maps.append(mmap.mmap(fd, capacity))
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
        self._views = [np.frombuffer(m, dtype=np.uint8) for m in maps]
        self.capacity = capacity

    def view(self, position: int) -> np.ndarray:
        return self._views[position]

    def close(self) -> None:
        self._views = []
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass      # a result still views it; the mapping goes when that array does
        self._maps = [None] * len(self.ranks)
        self.capacity = 0
