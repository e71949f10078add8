"""Shared-memory segments for the ranks of one host.

Each rank of a group owns one segment (a file in ``/dev/shm`` mapped by every rank of the group); collectives write
into their own segment and read their peers' directly, so bytes between ranks of one host never cross a socket.
Segments are unlinked as soon as every peer has mapped them, so nothing is left behind in ``/dev/shm`` even when a
process is killed.

Any local user can watch ``/dev/shm`` and may create files there, so a name the job will use must not follow from one
it has used: another user who could derive the next generation's names (or another process set's) would create them
first, and the job would fail on ``File exists``. Every file name and wake-up socket name is therefore a keyed hash
(HMAC with the job's secret) of everything that tells the names apart; only the ``hvdpy-`` start is recognisable.

Barriers count in the segments' headers: a rank arriving writes its count, and a waiting rank spins on its peers'
counts briefly (only while every local rank has a core), then sleeps on a wake-up socket of its own, saying so in its
header; an arriving rank that sees a peer asleep on this barrier sends it a datagram. A barrier whose peers arrive
while it spins costs no system call at all (two per barrier before, one send and one receive on the connection).
Sleeping ranks look again at least every few milliseconds (a wake-up lost to reordered memory accesses, or a
namespace that hides the socket, costs time, never a hang), watch their peers' connections for a hang-up, and give
up after the transport's timeout. Before the segments are first mapped, barriers are bytes on the connections.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import mmap
import os
import platform
import socket
import struct
import threading
import time
from typing import List, Optional, Sequence

import numpy as np

from horovod.common.exceptions import HorovodInternalError
from horovod.transport.base import Transport

__all__ = ["SHM_DIR", "SPIN_SECONDS", "COUNTER_BARRIERS", "spin_seconds", "available", "job_token", "segment_name",
           "wake_name", "ShmSegments"]

log = logging.getLogger("horovod")

SHM_DIR = "/dev/shm"
_HEADER = 4096    # a page before the data: the barrier counters, and page-aligned data after it
_ARRIVED, _ASLEEP = 0, 8   # header offsets: barriers entered; the barrier this rank sleeps in (0: awake)
SPIN_SECONDS = 0.0002   # how long a barrier spins on shared memory before it sleeps
_FIRST_LOOK, _LAST_LOOK = 0.001, 0.05    # a sleeping rank looks at its peers' counters this often, backing off
_FENCE = threading.Lock()
# Counters alone order a peer's data before its count only where stores are seen in program order (x86's TSO) and a
# locked instruction is a full fence; elsewhere barriers stay bytes on the connections, whose system calls order.
COUNTER_BARRIERS = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _fence() -> None:
    """Order this thread's earlier stores before its later loads (a locked instruction on x86).

    "Write my count, then read whether a peer sleeps" against "write that I sleep, then read the counts": without it
    both reads may see the old values and the sleeper misses its wake-up until it looks again.
    """
    _FENCE.acquire()
    _FENCE.release()


def spin_seconds(local_ranks: int, spin_us: Optional[int] = None) -> float:
    """How long a waiting rank may spin (``HOROVOD_SPIN_US``, default :data:`SPIN_SECONDS`): only while every local
    rank has a core of its own."""
    spin = SPIN_SECONDS if spin_us is None else spin_us * 1e-6
    return spin if local_ranks <= (os.cpu_count() or 1) else 0.0


def available() -> bool:
    """Whether this host offers shared memory that this process may write (``/dev/shm``)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def job_token(secret: bytes, scope: str) -> str:
    """A token private to one job (derived from its secret) that its groups' names start from, so jobs never map each
    other's segments; it never appears in a file or socket name (see :func:`segment_name`)."""
    return hashlib.sha256(secret + scope.encode()).hexdigest()[:16]


def _keyed_name(secret: bytes, *fields) -> str:
    """``hvdpy-`` and 128 bits of HMAC-SHA256 of ``fields`` under the job's secret: without the secret, no such name
    tells anything about another."""
    message = "\0".join(str(field) for field in fields).encode()
    return "hvdpy-" + hmac.new(secret, message, hashlib.sha256).hexdigest()[:32]


def segment_name(secret: bytes, prefix: str, rank: int, generation: int) -> str:
    """The ``/dev/shm`` file name of ``rank``'s segment of generation ``generation`` in the group named ``prefix``."""
    return _keyed_name(secret, "segment", prefix, rank, generation)


def wake_name(secret: bytes, prefix: str, rank: int) -> str:
    """The abstract socket name ``rank`` is woken on. Any local user can list these names (``/proc/net/unix``), so,
    like the segments' names, they are keyed hashes that reveal nothing about any other name."""
    return _keyed_name(secret, "wake", prefix, rank)


class ShmSegments:
    """One growable segment per rank of a group; ``view(i)`` maps rank ``i``'s segment as bytes."""

    def __init__(self, transport: Transport, ranks: Sequence[int], index: int, prefix: str, min_bytes: int = 64 * 1024,
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
        self._asleep: List[np.ndarray] = []  # per segment: the barrier its rank sleeps in, 0 when awake
        self._wake: Optional[socket.socket] = None     # datagrams from peers that saw us asleep
        self._wake_timeout = 0.0
        self._secret = transport.secret
        self._wake_names = ["\0" + wake_name(self._secret, prefix, rank) for rank in self.ranks]
        self._wake_failed = False
        if COUNTER_BARRIERS:
            try:
                wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    wake.settimeout(None)       # not socket.setdefaulttimeout's: SO_RCVTIMEO bounds each receive
                    wake.bind(self._wake_names[index])
                except OSError:
                    wake.close()
                    raise
                self._wake = wake
            except (OSError, AttributeError) as exc:
                # Sleepers then find out by looking, every few milliseconds: slower barriers, same results.
                log.warning("shared-memory barriers on rank %d cannot be woken (%s); they poll instead",
                            self.ranks[index], exc)
        self._peers = [p for p in range(len(self.ranks)) if p != index]
        self._epoch = 0
        self._half = 0            # which half the next chunk of a halved collective uses
        self._settled = True      # no peer can still be reading our segments

    # -- synchronisation --------------------------------------------------------------------------------------------

    def barrier(self) -> None:
        """Every rank of the group has called ``barrier`` as often as this one.

        Counted in the segments' headers once they are mapped (see the module's docstring). While ranks do not
        outnumber cores and the process has nothing else to run (its callers wait for results), a waiting rank
        first spins briefly on its peers' counters: a sleep and wake-up costs more than the whole barrier on a
        virtual machine. During a training step the cores compute, and nobody spins.
        """
        n = len(self.ranks)
        if n == 1:
            return
        if self._flags and COUNTER_BARRIERS:
            self._counted_barrier()
            return
        distance = 1
        while distance < n:
            to = self.ranks[(self.index + distance) % n]
            frm = self.ranks[(self.index - distance) % n]
            pending = self.transport.isend(to, memoryview(b"\x01"))
            self.transport.recv_into(frm, memoryview(self._token))
            pending.wait()
            distance *= 2

    def _counted_barrier(self) -> None:
        self._epoch += 1
        epoch = self._epoch
        flags = self._flags
        _fence()    # our data before our count, whatever stores the copies used (non-temporal ones are unordered)
        flags[self.index][0] = epoch
        _fence()
        peers = self._peers
        for p in peers:
            if self._asleep[p][0] == epoch:
                self._wake_up(p)
        if self.spin_seconds > 0 and (self.may_spin is None or self.may_spin()):
            deadline = time.perf_counter() + self.spin_seconds
            for p in peers:
                flag = flags[p]
                while flag[0] < epoch and time.perf_counter() < deadline:
                    pass
        if any(flags[p][0] < epoch for p in peers):
            self._sleep(epoch, peers)

    def _wake_up(self, position: int) -> None:
        if self._wake is None:
            return
        try:
            self._wake.sendto(b"\x01", socket.MSG_DONTWAIT, self._wake_names[position])
        except BlockingIOError:
            pass    # its queue is full: it will wake
        except OSError as exc:
            # Gone (its connection says so), or out of reach (another network namespace): it wakes by looking.
            if not self._wake_failed:
                self._wake_failed = True
                log.warning("rank %d cannot wake rank %d in a shared-memory barrier (%s); it polls instead",
                            self.ranks[self.index], self.ranks[position], exc)

    def _doze(self, look: float) -> bool:
        """Wait up to ``look`` seconds for a wake-up datagram; whether one came (from a peer, an old datagram, or
        anyone: the caller looks at the counters all the same)."""
        wake = self._wake
        if wake is None:
            time.sleep(look)
            return False
        if look != self._wake_timeout:
            # In the kernel, not Python's timeout: that would poll before every receive, and the wake-up path is
            # one system call on each side.
            wake.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, int(look * 1e6)))
            self._wake_timeout = look
        try:
            wake.recv(16)
            return True
        except (BlockingIOError, InterruptedError):
            return False

    def _sleep(self, epoch: int, peers: List[int]) -> None:
        """Wait until every peer entered barrier ``epoch``; a hang-up, or a live peer's silence past the
        transport's bound, raises HorovodInternalError.

        One blocking receive on the wake-up socket per look: a peer's datagram ends it at once. Between looks that
        found nobody new, the waiting peers' connections are checked for a hang-up.
        """
        flags, mine, wake = self._flags, self._asleep[self.index], self._wake
        # Peers that hang up raise from check_open; a live peer's silence is the transport's to judge, told every
        # half timeout (transport.waiting raises once it has lasted too long).
        tick = self.transport.timeout / 2
        started = time.monotonic()
        tell = started + tick if tick > 0 else None
        told = False
        look = _FIRST_LOOK
        next_check = time.monotonic() + look
        try:
            while True:
                mine[0] = epoch
                _fence()
                waiting = [p for p in peers if flags[p][0] < epoch]
                if not waiting:
                    if told:
                        self.transport.resumed()
                    return
                woken = self._doze(look)
                now = time.monotonic()
                # On every wake-up, not only after a quiet look: datagrams from anyone must not defer these.
                if now >= next_check:
                    for p in waiting:
                        self.transport.check_open(self.ranks[p])    # raises on a hang-up
                    next_check = now + look
                if tell is not None and now >= tell:
                    told = True
                    self.transport.waiting(self.ranks[waiting[0]], now - started)
                    tell = now + tick
                if not woken:
                    look = min(2 * look, _LAST_LOOK if wake is not None else _FIRST_LOOK)
        finally:
            mine[0] = 0

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
        return os.path.join(SHM_DIR, segment_name(self._secret, self.prefix, self.ranks[position], generation))

    def ensure(self, nbytes: int) -> None:
        """Grow every segment to at least ``nbytes`` (collective: every rank calls it with the same size)."""
        if nbytes <= self.capacity:
            return
        capacity = max(nbytes, 2 * self.capacity, 1 << 20)
        capacity = (capacity + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        size = capacity + _HEADER
        self._generation += 1
        own = self._path(self.index, self._generation)
        mine = _create_segment(own, size)
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
        self._unmap()
        self._maps = maps
        self._flags = [np.frombuffer(m, dtype=np.uint64, count=1, offset=_ARRIVED) for m in maps]
        self._asleep = [np.frombuffer(m, dtype=np.uint64, count=1, offset=_ASLEEP) for m in maps]
        self._views = [np.frombuffer(m, dtype=np.uint8, offset=_HEADER) for m in maps]
        self._epoch = 0
        self._settled = True      # ``ensure`` synchronised every rank before the old segments went
        self.capacity = capacity

    def view(self, position: int) -> np.ndarray:
        """The segment of the rank at ``position`` as flat bytes (valid until the next :meth:`ensure`)."""
        return self._views[position]

    def close(self) -> None:
        """Unmap every segment (they were unlinked as soon as every peer had mapped them)."""
        self._unmap()
        if self._wake is not None:
            self._wake.close()
            self._wake = None

    def _unmap(self) -> None:
        self._views = []
        self._flags = []
        self._asleep = []
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass      # a result still views it; the mapping goes when that array does
        self._maps = [None] * len(self.ranks)
        self.capacity = 0


def _create_segment(path: str, size: int) -> mmap.mmap:
    """Create, reserve and map one segment of ``size`` bytes at ``path``.

    The memory is reserved up front (``posix_fallocate``): sized with ``ftruncate`` alone, a tmpfs finds its pages
    missing only when they are first touched, so a ``/dev/shm`` that another user has filled killed a rank with
    SIGBUS in the middle of a collective. Reserved, a full ``/dev/shm`` is this error, naming the directory, the
    bytes needed and ``HOROVOD_SHM_DISABLE``.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise HorovodInternalError(f"cannot create shared memory segment {path} of {size} bytes: {exc}. "
                                   f"Set HOROVOD_SHM_DISABLE=1 to use TCP between local ranks") from None
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                raise
            raise HorovodInternalError(
                f"{os.path.dirname(path)} is full: cannot reserve the {size} bytes of shared memory segment {path} "
                f"({_free_bytes(path)} bytes free there): free space in {os.path.dirname(path)}, or set "
                f"HOROVOD_SHM_DISABLE=1 to use TCP between local ranks") from None
        return mmap.mmap(fd, size)
    except BaseException as exc:
        try:
            os.unlink(path)         # a segment never handed out: nobody else will unlink it
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise HorovodInternalError(f"cannot create shared memory segment {path} of {size} bytes: {exc}. "
                                       f"Set HOROVOD_SHM_DISABLE=1 to use TCP between local ranks") from None
        raise
    finally:
        os.close(fd)


def _free_bytes(path: str) -> int:
    try:
        stat = os.statvfs(os.path.dirname(path))
    except OSError:
        return -1
    return stat.f_bavail * stat.f_frsize
