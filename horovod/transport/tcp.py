"""Socket transport: one authenticated, full-duplex connection between every pair of ranks.

Connections are made once at ``init`` through the rendezvous (rank *j* dials every lower rank and accepts every
higher one). Ranks on one host connect through a Unix-domain socket (Linux's abstract namespace) where they can:
the same stream, without the TCP stack, so a small send costs about a tenth of a loopback TCP send. TCP is the
fallback, and the only way between hosts. Each peer has a sender thread, so a ring step sends to the right while
receiving from the left. A socket error, a closed connection or a peer silent for longer than the timeout becomes
:class:`HorovodInternalError` naming the peer; the transport then closes every connection so that the other ranks
learn of the failure at once instead of waiting for their own timeout.
"""

from __future__ import annotations

import os
import queue
import select
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.transport import wire

__all__ = ["SendFuture", "TcpTransport"]

_SOCKET_BUFFER = 4 * 1024 * 1024
_INLINE_SEND_BYTES = 64 * 1024
_PURPOSE_MESH = 1


class SendFuture:
    """Completion of one queued send; ``wait`` re-raises the sender's error."""

    __slots__ = ("_event", "_error")

    def __init__(self):
        self._event = threading.Event()
        self._error: Optional[BaseException] = None

    def _finish(self, error: Optional[BaseException] = None) -> None:
        self._error = error
        self._event.set()

    def wait(self) -> None:
        """Return once the send completed; re-raise the sender's error."""
        self._event.wait()
        if self._error is not None:
            raise self._error


class _Sent:
    """The completion of a send that went out inline: nothing to wait for (and no Event to build, per barrier)."""

    __slots__ = ()

    def wait(self) -> None:
        return None


_SENT = _Sent()


class _Sender(threading.Thread):
    def __init__(self, transport: "TcpTransport", peer: int):
        super().__init__(name=f"horovod-send-{peer}", daemon=True)
        self.transport = transport
        self.peer = peer
        self.jobs: "queue.SimpleQueue[Optional[Tuple[memoryview, SendFuture]]]" = queue.SimpleQueue()
        # Jobs queued and not yet sent = put - done; each counter has one writer (engine thread, this thread).
        self.put = 0
        self.done = 0

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            view, future = job
            try:
                self.transport.send(self.peer, view)
                self.done += 1
                future._finish()
            except BaseException as exc:  # handed to the waiting thread
                self.done += 1
                future._finish(exc)


def _configure(sock: socket.socket, timeout: float) -> None:
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
        except OSError:
            pass
    sock.settimeout(timeout if timeout > 0 else None)


class TcpTransport:
    """Point-to-point messaging between the ranks of one job over authenticated TCP connections."""

    def __init__(self, rank: int, size: int, secret: bytes, timeout: float, job_token: str = ""):
        self.rank = rank
        self.size = size
        self.secret = secret
        self.timeout = timeout
        self.job_token = job_token
        self._socks: Dict[int, socket.socket] = {}
        self._senders: Dict[int, _Sender] = {}
        self._broken: Optional[str] = None
        self._listener: Optional[socket.socket] = None
        self._unix_listener: Optional[socket.socket] = None
        self.unix_name = ""                # where same-host peers dial us ("" when Unix sockets are unavailable)
        self.hostnames: List[str] = []     # host identity of every rank (which ranks can share memory): set_layout
        self.cores: List[int] = []         # cores of every rank's host: set_layout

    # -- setup ---------------------------------------------------------------------------------------------------

    def listen(self, bind_host: str = "0.0.0.0") -> int:
        """Open the listening socket; returns its port (to be published through the rendezvous)."""
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind_host, 0))
        self._listener.listen(max(16, self.size))
        self._listen_unix()
        return self._listener.getsockname()[1]

    def _listen_unix(self) -> None:
        if not hasattr(socket, "AF_UNIX") or not os.path.exists("/proc/net/unix"):
            return      # the abstract namespace is Linux's
        name = f"hvdpy-{os.getpid()}-{os.urandom(8).hex()}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind("\0" + name)
            listener.listen(max(16, self.size))
        except OSError:
            listener.close()
            return
        self._unix_listener, self.unix_name = listener, name

    def connect(self, addresses: Dict[int, Tuple[str, int]], deadline: float,
                unix_names: Optional[Dict[int, str]] = None) -> None:
        """Dial every lower rank and accept every higher one, authenticating each; bounded by ``deadline``.

        ``unix_names`` names the Unix sockets of lower ranks on this host; each is tried before the TCP address.
        """
        try:
            for peer in range(self.rank):
                name = (unix_names or {}).get(peer)
                if not (name and self._dial_unix(peer, name, deadline)):
                    self._dial(peer, addresses[peer], deadline)
            self._accept_higher(deadline)
        except (OSError, ConnectionError) as exc:
            self.close()
            raise HorovodInternalError(f"rank {self.rank}: could not connect to its peers: {exc}") from None
        finally:
            for listener in (self._listener, self._unix_listener):
                if listener is not None:
                    listener.close()
            self._listener = self._unix_listener = None
        for peer, sock in self._socks.items():
            _configure(sock, self.timeout)
            sender = _Sender(self, peer)
            sender.start()
            self._senders[peer] = sender

    def _dial(self, peer: int, address: Tuple[str, int], deadline: float) -> None:
        last: Optional[BaseException] = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
            except OSError as exc:
                last = exc
                time.sleep(0.05)
                continue
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            self._greet(sock, peer, address)
            return
        raise HorovodInternalError(f"rank {self.rank} could not reach rank {peer} at {address[0]}:{address[1]} "
                                   f"before the start timeout: {last}")

    def _dial_unix(self, peer: int, name: str, deadline: float) -> bool:
        """Connect to a same-host peer's Unix socket; False when it cannot be reached that way (then TCP)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.connect("\0" + name)
        except OSError:
            sock.close()    # another network namespace, or no such socket: the peer is not here after all
            return False
        self._greet(sock, peer, f"unix:{name}")
        return True

    def _greet(self, sock: socket.socket, peer: int, where) -> None:
        """Authenticate a connection we dialled; it becomes ``peer``'s when ``peer`` answered."""
        their_rank = wire.handshake(sock, self.secret, self.rank, _PURPOSE_MESH)
        if their_rank != peer:
            sock.close()
            raise HorovodInternalError(f"rank {self.rank} dialled rank {peer} at {where} but rank "
                                       f"{their_rank} answered")
        self._socks[peer] = sock

    def _accept_higher(self, deadline: float) -> None:
        expected = set(range(self.rank + 1, self.size))
        listeners = [listener for listener in (self._listener, self._unix_listener) if listener is not None]
        while expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HorovodInternalError(f"rank {self.rank} timed out waiting for ranks {sorted(expected)} "
                                           f"to connect")
            ready, _, _ = select.select(listeners, [], [], remaining)
            if not ready:
                continue
            try:
                sock, _ = ready[0].accept()
            except (BlockingIOError, InterruptedError):
                continue
            sock.settimeout(min(remaining, 10.0))
            try:
                peer = wire.handshake(sock, self.secret, self.rank, _PURPOSE_MESH, dialer=False)
            except (HorovodInternalError, OSError, ConnectionError):
                sock.close()  # a stranger or a garbled greeting: drop it and keep waiting for real peers
                continue
            if peer not in expected:
                sock.close()
                continue
            expected.discard(peer)
            self._socks[peer] = sock

    def set_layout(self, hostnames: Sequence[str], cores: Sequence[int]) -> None:
        """Every rank's host identity and core count, as the ranks published them (known once the mesh is up).

        Raises:
            ValueError: not one of each per rank.
        """
        if len(hostnames) != self.size or len(cores) != self.size:
            raise ValueError(f"rank {self.rank}: a layout of {len(hostnames)} hosts and {len(cores)} core counts "
                             f"for {self.size} ranks")
        self.hostnames, self.cores = list(hostnames), list(cores)

    # -- messaging -------------------------------------------------------------------------------------------------

    def _fail(self, peer: int, exc: BaseException) -> HorovodInternalError:
        if self._broken is None:
            if isinstance(exc, socket.timeout):
                self._broken = (f"rank {peer} sent nothing for {self.timeout:g} s "
                                f"(HOROVOD_GLOO_TIMEOUT_SECONDS); it is hung or unreachable")
            else:
                self._broken = f"connection to rank {peer} failed: {exc}; that rank probably died"
            self.close()
        return HorovodInternalError(f"Horovod failed on rank {self.rank}: {self._broken}")

    def check_open(self, peer: int) -> None:
        """Raise HorovodInternalError if ``peer`` hung up; bytes waiting on the connection are left there."""
        sock = self._sock(peer)
        try:
            # (A socket with a timeout waits for data before it receives, MSG_DONTWAIT or not: look first.)
            if select.select([sock], [], [], 0)[0] and sock.recv(1, socket.MSG_PEEK) == b"":
                raise ConnectionError("connection closed by peer")
        except (OSError, ConnectionError, ValueError) as exc:
            raise self._fail(peer, exc) from None

    def silent(self, peer: int) -> HorovodInternalError:
        """``peer`` owed this rank a message for longer than the timeout: the same failure as a silent receive."""
        return self._fail(peer, socket.timeout())

    def _sock(self, peer: int) -> socket.socket:
        if self._broken is not None:
            raise HorovodInternalError(f"Horovod failed on rank {self.rank}: {self._broken}")
        try:
            return self._socks[peer]
        except KeyError:
            raise HorovodInternalError(f"rank {self.rank} has no connection to rank {peer}") from None

    def fileno(self, peer: int) -> int:
        """The connection's file descriptor, for waiting on several peers at once."""
        return self._sock(peer).fileno()

    def send(self, peer: int, data) -> None:
        """Send all of ``data`` (bytes or a memoryview) to ``peer``."""
        sock = self._sock(peer)
        try:
            sock.sendall(data)
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def isend(self, peer: int, view: memoryview) -> SendFuture:
        """Queue ``view`` for sending to ``peer``; the buffer must stay untouched until ``wait`` returns.

        Small messages fit in the kernel's socket buffer, so they are sent inline: handing them to the sender
        thread would cost more than the send.
        """
        sender = self._senders.get(peer)
        # Inline only when nothing is queued for this peer: two threads writing one socket would interleave bytes.
        if len(view) <= _INLINE_SEND_BYTES and (sender is None or sender.put == sender.done):
            try:
                self.send(peer, view)
                return _SENT
            except HorovodInternalError as exc:
                future = SendFuture()
                future._finish(exc)
                return future
        future = SendFuture()
        self._sock(peer)
        sender.put += 1
        sender.jobs.put((view, future))
        return future

    def recv_into(self, peer: int, view: memoryview) -> None:
        """Fill ``view`` with the next bytes from ``peer``."""
        sock = self._sock(peer)
        try:
            wire.recv_exact(sock, view)
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def send_obj(self, peer: int, message) -> None:
        """Send one control message (primitives only, see :mod:`horovod.transport.wire`)."""
        sock = self._sock(peer)
        try:
            wire.send_frame(sock, wire.encode(message))
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def recv_obj(self, peer: int):
        """Receive one control message."""
        sock = self._sock(peer)
        try:
            return wire.decode(wire.recv_frame(sock))
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def close(self) -> None:
        """Close every connection and stop the sender threads; later calls raise HorovodInternalError."""
        for listener in (self._listener, self._unix_listener):
            if listener is not None:
                listener.close()
        self._listener = self._unix_listener = None
        for sender in self._senders.values():
            sender.jobs.put(None)
        for sock in list(self._socks.values()):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._broken is None:
            self._broken = "the transport was closed (Horovod has been shut down)"
