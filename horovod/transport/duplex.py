"""One collective's sends and receives, progressed together on the calling thread.

A ring step sends to one neighbour while it receives from the other. Doing that with a sender thread per peer costs a
hand-off per piece: the thread must be woken, must take Python's GIL from the receiving thread, and the two fight for
the GIL for every chunk the kernel hands over. Across hosts that halved the bandwidth (a two-rank allreduce between
namespace hosts: 0.26-0.41 GB/s threaded against 0.44-0.64 GB/s in one thread over the same link). A
:class:`Duplex` therefore keeps every transfer of one collective in one thread: the algorithm queues sends and
receives (per peer, in order) and callbacks that run as a receive completes, and :meth:`Duplex.run` moves whatever
the kernel accepts or has, in whatever order the links allow, waiting in ``poll`` only when no connection can move.

Two implementations share the queueing: :class:`PollDuplex` over the file descriptors of a socket transport
(non-blocking ``write``/``readv`` straight into the caller's buffers: no copy, no thread) and :class:`SerialDuplex`
over any transport's ``isend``/``recv_into`` (the in-memory test transport), which completes receives one at a time
in queue order.
"""

from __future__ import annotations

import collections
import os
import select
import time
from typing import Callable, Deque, Dict, List, Optional, Tuple

__all__ = ["Duplex", "PollDuplex", "SerialDuplex"]

# Largest single write: the kernel takes what fits in the socket buffer anyway; a bound keeps one call short.
_MAX_WRITE = 8 << 20
_RETRY_SEND = 1.0    # seconds between write attempts on a connection poll does not call writable (see PollDuplex)
_READ_EVENTS = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_WRITE_EVENTS = select.POLLOUT | select.POLLERR | select.POLLHUP

Then = Optional[Callable[[], None]]


class Duplex:
    """Queued transfers of one collective: sends and receives kept in order per peer.

    ``then`` of a receive runs on the thread calling :meth:`run` as soon as the receive completed, before the next
    receive from the same peer takes a byte, so that receive may reuse the scratch buffer this one filled; it may
    queue more sends and receives.
    """

    def __init__(self):
        self._sends: Dict[int, Deque[memoryview]] = {}
        self._recvs: Dict[int, Deque[Tuple[memoryview, Then]]] = {}
        self._pending_recvs = 0

    def send(self, peer: int, view: memoryview) -> None:
        """Queue ``view`` for ``peer`` behind earlier sends to it; the buffer stays untouched until :meth:`run`
        returns."""
        if len(view):
            self._sends.setdefault(peer, collections.deque()).append(view)

    def recv(self, peer: int, view: memoryview, then: Then = None) -> None:
        """Queue a receive filling ``view`` from ``peer`` behind earlier receives from it; ``then()`` once full."""
        if len(view):
            self._recvs.setdefault(peer, collections.deque()).append((view, then))
            self._pending_recvs += 1
        elif then is not None:
            then()

    def run(self) -> None:
        """Move every queued byte (and whatever the callbacks queue) before returning."""
        raise NotImplementedError


class SerialDuplex(Duplex):
    """Over any transport: sends go out through ``isend`` as they are queued, receives complete in queue order."""

    def __init__(self, transport):
        super().__init__()
        self.transport = transport

    def run(self) -> None:
        """Hand every queued send to ``isend``, complete the receives in queue order, then await the sends."""
        futures = []
        while True:
            for peer, queue in self._sends.items():
                while queue:
                    futures.append(self.transport.isend(peer, queue.popleft()))
            peer = next((p for p, q in self._recvs.items() if q), None)
            if peer is None:
                break
            view, then = self._recvs[peer].popleft()
            self.transport.recv_into(peer, view)
            if then is not None:
                then()
        for future in futures:
            future.wait()


class PollDuplex(Duplex):
    """Over a socket transport: non-blocking writes and reads on the peers' connections, one ``poll`` when none
    can move.

    ``transport`` is a :class:`horovod.transport.base.Transport`: its ``connection`` and ``quiesce`` hand over the
    socket, ``waiting`` is told every half ``timeout`` while no byte moves (and raises to end the wait),
    ``resumed`` once bytes move again, and ``fail`` makes the error that fails the transport.
    """

    def __init__(self, transport):
        super().__init__()
        self.transport = transport
        self._fds: Dict[int, int] = {}
        self._restore: List[int] = []

    def _fd(self, peer: int) -> int:
        fd = self._fds.get(peer)
        if fd is None:
            self.transport.quiesce(peer)
            sock = self.transport.connection(peer)
            fd = self._fds[peer] = sock.fileno()
            # A socket with a timeout is non-blocking underneath already (Python polls before each call); one
            # without (timeout 0: wait forever) is made non-blocking for this run only. Asking Python, not the
            # kernel, saves a system call per peer per collective.
            if sock.gettimeout() is None:
                os.set_blocking(fd, False)
                self._restore.append(fd)
        return fd

    def run(self) -> None:
        """Move every queued byte; HorovodInternalError (naming the peer) when a connection fails or stays idle
        for the transport's timeout."""
        try:
            self._progress()
        finally:
            for fd in self._restore:
                try:
                    os.set_blocking(fd, True)
                except OSError:
                    pass
            self._restore.clear()

    def _progress(self) -> None:
        # A connection that fails (a dead process, a host the keepalive probes lost) raises from _move; silence
        # on a live one is the transport's to judge, told every half timeout (transport.waiting may raise).
        tick = self.transport.timeout / 2
        last_moved = time.monotonic()
        told = False
        look = last_moved + tick
        while self._pending_recvs or any(self._sends.values()):
            if self._move():
                last_moved = time.monotonic()
                look = last_moved + tick
                if told:
                    told = False
                    self.transport.resumed()
                continue
            waiting = self._wait_set()
            now = time.monotonic()
            if tick > 0 and now >= look:
                told = True
                self.transport.waiting(self._blamed(), now - last_moved)
                look = now + tick
            wait = None if tick <= 0 else look - now
            if any(self._sends.values()):
                # Linux raises POLLOUT only once a third of the send buffer is free: a write may take bytes
                # before poll says so, and a peer that trickles its window open would look silent for a tick.
                again = _RETRY_SEND - (now - last_moved) % _RETRY_SEND
                wait = again if wait is None else min(wait, again)
            poller = select.poll()
            for fd, events in waiting.items():
                poller.register(fd, events)
            poller.poll(None if wait is None else max(1, int(wait * 1000)))

    def _move(self) -> bool:
        """One non-blocking attempt on every connection with work; whether any byte moved."""
        moved = False
        for peer in list(self._sends):
            queue = self._sends[peer]
            while queue:
                view = queue[0]
                try:
                    n = os.write(self._fd(peer), view[:_MAX_WRITE])
                except BlockingIOError:
                    break
                except OSError as exc:
                    raise self.transport.fail(peer, exc) from None
                moved = True
                if n < len(view):
                    queue[0] = view[n:]
                    break
                queue.popleft()
        for peer in list(self._recvs):
            queue = self._recvs[peer]
            while queue:
                view, then = queue[0]
                try:
                    n = os.readv(self._fd(peer), [view])
                except BlockingIOError:
                    break
                except OSError as exc:
                    raise self.transport.fail(peer, exc) from None
                if n == 0:
                    raise self.transport.fail(peer, ConnectionError("connection closed by peer"))
                moved = True
                if n < len(view):
                    queue[0] = (view[n:], then)
                    break
                queue.popleft()
                self._pending_recvs -= 1
                if then is not None:
                    then()
        return moved

    def _wait_set(self) -> Dict[int, int]:
        waiting: Dict[int, int] = {}
        for peer, queue in self._sends.items():
            if queue:
                waiting[self._fd(peer)] = _WRITE_EVENTS
        for peer, queue in self._recvs.items():
            if queue:
                fd = self._fd(peer)
                waiting[fd] = waiting.get(fd, 0) | _READ_EVENTS
        return waiting

    def _blamed(self) -> int:
        """The peer a stalled collective waits on: the first one owing bytes, else the first not taking them."""
        for peer, queue in self._recvs.items():
            if queue:
                return peer
        return next(peer for peer, queue in self._sends.items() if queue)
