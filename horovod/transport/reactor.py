"""The transport's one I/O thread: accepting and authenticating connections, and writing queued sends.

A rank's thread count must not grow with the world size, so everything a socket transport does in the background
runs here, on one thread over one selector, however many peers there are:

* **Listening.** The TCP and Unix listeners stay open for the whole job (connections are opened when a collective
  first needs them, :mod:`horovod.transport.mesh`). Every accepted connection runs the acceptor's side of
  :func:`horovod.common.wire.handshake` as a non-blocking state machine, with :data:`HANDSHAKE_SECONDS` in all,
  however its bytes trickle in. At most :data:`MAX_PENDING_HANDSHAKES` are heard at once; past that the *oldest*
  unauthenticated one is dropped, never the newcomer, so strangers holding connections cannot keep a real peer out.
  A Unix-socket caller running as another user is refused before it sends a byte (``SO_PEERCRED``).
* **Queued sends.** :meth:`Reactor.send` takes a message too large to write inline and writes it as the peer's
  connection accepts bytes, in order per peer; its future completes when the last byte went out.

When a dialer has proved itself, ``claim(rank)`` says whether its connection is kept (the mesh's tie-break for two
ranks dialling each other at once); the verdict goes back to the dialer as one byte after the acceptor's proof, and
only then is a kept connection handed over with ``adopt(rank, sock)``, so no data can overtake the verdict.
"""

from __future__ import annotations

import collections
import errno
import hmac
import logging
import os
import resource
import selectors
import socket
import struct
import threading
import time
from typing import Callable, Deque, Dict, Optional, Tuple

from horovod.common import wire

__all__ = ["HANDSHAKE_SECONDS", "MAX_PENDING_HANDSHAKES", "VERDICT_KEEP", "VERDICT_DROP", "SendFuture", "Reactor"]

log = logging.getLogger("horovod")

HANDSHAKE_SECONDS = 10.0          # an accepted connection's whole handshake, however its bytes trickle in
MAX_PENDING_HANDSHAKES = 64       # connections being authenticated at once; past it the oldest is dropped
VERDICT_KEEP = b"\x01"
VERDICT_DROP = b"\x00"
_MAX_WRITE = 8 << 20
_DIALER_BYTES = wire.HELLO_SIZE + wire.PROOF_SIZE
_PEERCRED = struct.Struct("3i")


class SendFuture:
    """Completion of one queued send; ``wait`` re-raises the error that ended it."""

    __slots__ = ("_event", "_error")

    def __init__(self):
        self._event = threading.Event()
        self._error: Optional[BaseException] = None

    def _finish(self, error: Optional[BaseException] = None) -> None:
        self._error = error
        self._event.set()

    def done(self) -> bool:
        """Whether the send ended (written, or failed)."""
        return self._event.is_set()

    def wait(self) -> None:
        """Return once the send completed; re-raise its error."""
        self._event.wait()
        if self._error is not None:
            raise self._error


class _Handshake:
    """The acceptor's side of one connection's handshake, fed as bytes arrive."""

    __slots__ = ("sock", "deadline", "nonce", "got")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.deadline = deadline
        self.nonce = os.urandom(16)
        self.got = bytearray()


class Reactor(threading.Thread):
    """One transport's I/O thread (see the module's docstring).

    Args:
        rank: this rank.
        size: the world size (valid peer ranks).
        secret: the job secret.
        purpose: the connections' purpose id (both ends must agree).
        claim: called with a peer's rank once it proved itself; returns whether its connection is kept.
        fail: called with ``(peer, exc)`` when a queued send to ``peer`` fails; returns the error its future gets.
        adopt: called with ``(rank, sock)`` once a kept connection's verdict went out (the socket is then the
            caller's), or ``(rank, None)`` when the connection failed before that.
        every_second: called about once a second on this thread, whatever else waits (the transport looks at its
            connections' windows there), or ``None``.
    """

    def __init__(self, rank: int, size: int, secret: bytes, purpose: int,
                 claim: Callable[[int], bool],
                 fail: Callable[[int, BaseException], BaseException],
                 adopt: Callable[[int, Optional[socket.socket]], None],
                 every_second: Optional[Callable[[], None]] = None):
        super().__init__(name="horovod-io", daemon=True)
        self.rank, self.size, self.secret, self.purpose = rank, size, secret, purpose
        self._claim, self._fail, self._adopt = claim, fail, adopt
        self._every_second = every_second
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._commands: Deque[Callable[[], None]] = collections.deque()
        self._pending: "collections.OrderedDict[int, _Handshake]" = collections.OrderedDict()
        self._queues: Dict[int, Deque[Tuple[memoryview, SendFuture]]] = {}
        self._socks: Dict[int, socket.socket] = {}
        self._uid = os.getuid()
        self._stopped = False
        # Sends queued and ended per peer; each counter has one writer (the caller's thread, this one), so that
        # "nothing queued for this peer" is answered without a lock.
        self.put: Dict[int, int] = collections.defaultdict(int)
        self.ended: Dict[int, int] = collections.defaultdict(int)

    # -- called from other threads -------------------------------------------------------------------------------

    def listen_on(self, listener: socket.socket) -> None:
        """Accept connections on ``listener`` from now until :meth:`stop`."""
        listener.setblocking(False)
        self._call(lambda: self._selector.register(listener, selectors.EVENT_READ, ("listen", listener)))

    def send(self, peer: int, sock: socket.socket, view: memoryview) -> SendFuture:
        """Write ``view`` to ``peer``'s connection behind earlier queued sends to it; the buffer stays untouched
        until the future completes."""
        future = SendFuture()
        self.put[peer] += 1
        self._call(lambda: self._queue(peer, sock, view, future))
        return future

    def idle(self, peer: int) -> bool:
        """Whether no queued send to ``peer`` is still being written."""
        return self.put.get(peer, 0) == self.ended.get(peer, 0)

    @property
    def handshaking(self) -> int:
        """Connections still authenticating."""
        return len(self._pending)

    def stop(self) -> None:
        """End the thread; queued sends fail, pending handshakes are dropped (the listeners are the caller's)."""
        self._stopped = True
        self._wake()

    # -- the loop ------------------------------------------------------------------------------------------------

    def _call(self, command: Callable[[], None]) -> None:
        self._commands.append(command)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass        # a wake-up is already waiting, or the thread is gone

    def run(self) -> None:
        """Serve the listeners, handshakes and queued sends until :meth:`stop`."""
        try:
            next_look = time.monotonic() + 1.0
            while not self._stopped:
                timeout = None
                if self._pending:
                    timeout = max(0.0, min(h.deadline for h in self._pending.values()) - time.monotonic())
                if self._every_second is not None:
                    now = time.monotonic()
                    if now >= next_look:
                        self._every_second()
                        next_look = now + 1.0
                    timeout = next_look - now if timeout is None else min(timeout, next_look - now)
                for key, events in self._selector.select(timeout):
                    kind, target = key.data
                    if kind == "wake":
                        self._drain_wake()
                    elif kind == "listen":
                        self._accept(target)
                    elif kind == "shake":
                        self._shake(target)
                    elif kind == "send":
                        self._write(target)
                while self._commands:
                    self._commands.popleft()()
                self._expire()
        except Exception:  # the loop must never die silently: the transport's waits would go unanswered
            log.exception("rank %d: the transport's I/O thread failed", self.rank)
        finally:
            self._shut()

    def _drain_wake(self) -> None:
        # As core.waiters.Wakeup.drain does for the engine's wake-up; the transport's floor cannot import the
        # engine's, and this one must also survive its socket being closed at shutdown (OSError).
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _shut(self) -> None:
        for handshake in list(self._pending.values()):
            self._drop(handshake)
        for peer, queue in self._queues.items():
            while queue:
                _, future = queue.popleft()
                self.ended[peer] += 1
                future._finish(self._fail(peer, ConnectionError("the transport was closed")))
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- accepting -----------------------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(64):     # a burst of dialers: take what is waiting, then serve the others
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._pending:
                    # Out of descriptors while strangers hold handshakes: the oldest goes, and we accept again.
                    self._drop(next(iter(self._pending.values())))
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    # Out of descriptors: the peer dialling us would wait in the backlog until its timeout. Fail
                    # now, saying why, so that every rank learns of it at once.
                    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                    self._fail(self.rank, OSError(exc.errno, (
                        f"rank {self.rank} cannot accept a connection: the limit of {soft} open files per process is "
                        f"reached (hard limit {hard}); raise the limit (ulimit -n, or LimitNOFILE for a service) "
                        f"before starting the job")))
                    self._stopped = True
                else:
                    log.warning("rank %d: accepting a connection failed: %s", self.rank, exc)
                return
            if sock.family == socket.AF_UNIX and not self._same_user(sock):
                sock.close()    # another local user: the abstract namespace lets anyone dial
                continue
            if len(self._pending) >= MAX_PENDING_HANDSHAKES:
                self._drop(next(iter(self._pending.values())))    # the oldest stranger goes, not the newcomer
            sock.setblocking(False)
            handshake = _Handshake(sock, time.monotonic() + HANDSHAKE_SECONDS)
            try:
                sock.send(wire.hello(handshake.nonce, self.rank, self.purpose))
            except OSError:
                sock.close()
                continue
            self._pending[sock.fileno()] = handshake
            self._selector.register(sock, selectors.EVENT_READ, ("shake", handshake))

    def _same_user(self, sock: socket.socket) -> bool:
        try:
            _, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except (OSError, AttributeError, struct.error):
            return True     # no credentials to ask (not Linux): the handshake still authenticates
        return uid == self._uid

    def _shake(self, handshake: _Handshake) -> None:
        sock = handshake.sock
        try:
            chunk = sock.recv(_DIALER_BYTES - len(handshake.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            return self._drop(handshake)
        handshake.got += chunk
        if len(handshake.got) >= wire.HELLO_SIZE and not wire.hello_matches(bytes(handshake.got[:wire.HELLO_SIZE]),
                                                                             self.purpose):
            return self._drop(handshake)     # another protocol or another job: no need to wait for more
        if len(handshake.got) < _DIALER_BYTES:
            return
        their_nonce, their_rank = wire.parse_hello(bytes(handshake.got[:wire.HELLO_SIZE]))
        proof = bytes(handshake.got[wire.HELLO_SIZE:])
        expected = wire.proof(self.secret, b"D", their_nonce, handshake.nonce, their_rank, self.rank, self.purpose)
        if not hmac.compare_digest(proof, expected) or not (0 <= their_rank < self.size) or their_rank == self.rank:
            return self._drop(handshake)
        self._forget(handshake)
        keep = self._claim(their_rank)
        answer = wire.proof(self.secret, b"A", their_nonce, handshake.nonce, their_rank, self.rank, self.purpose)
        try:
            # 33 bytes into a fresh connection's empty buffer: the kernel takes them whole.
            sent = sock.send(answer + (VERDICT_KEEP if keep else VERDICT_DROP)) == wire.PROOF_SIZE + 1
        except OSError:
            sent = False    # the dialer is gone
        if keep and sent:
            self._adopt(their_rank, sock)
            return
        sock.close()
        if keep:
            self._adopt(their_rank, None)

    def _forget(self, handshake: _Handshake) -> None:
        self._pending.pop(handshake.sock.fileno(), None)
        try:
            self._selector.unregister(handshake.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, handshake: _Handshake) -> None:
        self._forget(handshake)
        handshake.sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for handshake in [h for h in self._pending.values() if h.deadline <= now]:
            self._drop(handshake)

    # -- queued sends --------------------------------------------------------------------------------------------

    def _queue(self, peer: int, sock: socket.socket, view: memoryview, future: SendFuture) -> None:
        queue = self._queues.setdefault(peer, collections.deque())
        queue.append((view, future))
        if len(queue) == 1:
            self._socks[peer] = sock
            try:
                self._selector.register(sock, selectors.EVENT_WRITE, ("send", peer))
            except (KeyError, ValueError, OSError) as exc:
                self._end_queue(peer, exc)

    def _write(self, peer: int) -> None:
        queue = self._queues[peer]
        sock = self._socks[peer]
        while queue:
            view, future = queue[0]
            try:
                n = sock.send(view[:_MAX_WRITE], socket.MSG_DONTWAIT) if len(view) else 0
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                return self._end_queue(peer, exc)
            if n < len(view):
                queue[0] = (view[n:], future)
                return
            queue.popleft()
            self.ended[peer] += 1
            future._finish()
        self._selector.unregister(sock)

    def _end_queue(self, peer: int, exc: BaseException) -> None:
        queue = self._queues[peer]
        error = self._fail(peer, exc)
        while queue:
            _, future = queue.popleft()
            self.ended[peer] += 1
            future._finish(error)
        try:
            self._selector.unregister(self._socks[peer])
        except (KeyError, ValueError):
            pass

