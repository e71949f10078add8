"""Making the mesh: listening, dialling and authenticating every pair of ranks, refusing strangers, watching liveness.

Rank *j* dials every lower rank and accepts every higher one. Strangers on the listening sockets while the mesh forms
are each given :data:`HANDSHAKE_SECONDS` in all (not per byte) on a thread of their own, and at most
:data:`MAX_PENDING_HANDSHAKES` are heard at once, so a silent, trickling or flooding client never delays a real peer's
handshake.

Liveness is the kernel's (:func:`watch_liveness`): keepalive probes on idle connections and a bound on unacknowledged
data, answered by the peer's kernel whatever its Python does.

A process forked after the mesh was made shares its connections with its parent: :func:`forked` says so, and
:meth:`horovod.transport.tcp.TcpTransport.close` then never shuts them down.
"""

from __future__ import annotations

import os
import queue
import select
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.transport import wire

__all__ = ["HANDSHAKE_SECONDS", "MAX_PENDING_HANDSHAKES", "PURPOSE_MESH", "FORKED", "forked", "watch_liveness",
           "MeshSetup"]

PURPOSE_MESH = 1
HANDSHAKE_SECONDS = 10.0          # an accepted connection's whole handshake, however its bytes trickle in
MAX_PENDING_HANDSHAKES = 64       # connections being authenticated at once; more are refused at once
FORKED = [False]


def _after_fork_in_child() -> None:
    FORKED[0] = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked() -> bool:
    """Whether this process was forked from the one that may own the job's connections (they are not its own)."""
    return FORKED[0]


def probe_interval(liveness: float) -> float:
    """Seconds between keepalive probes for a liveness timeout of ``liveness`` seconds: the ranks that lose one peer
    each learn of it within this much of each other."""
    return float(max(1, int(liveness / 10)))


def watch_liveness(sock: socket.socket, seconds: float) -> None:
    """Have the kernel declare the connection dead after ``seconds`` without a sign of life from the other end.

    Keepalive probes go out every ``seconds / 10`` (at least 1 s) while the connection is idle, and
    ``TCP_USER_TIMEOUT`` bounds both unanswered probes and unacknowledged data: a blocked receive or send then fails
    with ``ETIMEDOUT`` within ``seconds`` plus one probe interval. The peer's kernel answers, not its Python, so a
    busy process stays alive. Best effort where an option is missing (non-Linux).
    """
    if seconds <= 0:
        return
    probe = int(probe_interval(seconds))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", probe), ("TCP_KEEPINTVL", probe),
                        ("TCP_KEEPCNT", max(1, int(seconds / probe))), ("TCP_USER_TIMEOUT", int(seconds * 1000))):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass


class MeshSetup:
    """The connection-making half of :class:`horovod.transport.tcp.TcpTransport` (which sets every attribute)."""

    rank: int
    size: int
    secret: bytes
    liveness: float
    hostnames: List[str]
    _socks: Dict[int, socket.socket]
    _listener: Optional[socket.socket]
    _unix_listener: Optional[socket.socket]
    unix_name: str
    _accepting_ended: bool

    def close(self) -> None:
        """Close every connection (the transport's)."""
        raise NotImplementedError

    def _check_abandoned(self) -> None:
        """Raise when the round this mesh is for was given up (``abandoned``, asked at most every half second)."""
        abandoned = getattr(self, "_abandoned", None)
        if abandoned is not None and abandoned():
            raise HorovodInternalError(f"rank {self.rank}: this round was given up while its mesh formed (a peer "
                                       f"failed during start-up)")

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

    def _connect_all(self, addresses: Dict[int, Tuple[str, int]], deadline: float,
                     unix_names: Optional[Dict[int, str]]) -> None:
        """Dial every lower rank and accept every higher one; the listeners are closed after, success or not."""
        try:
            for peer in range(self.rank):
                name = (unix_names or {}).get(peer)
                if not (name and self._dial_unix(peer, name, deadline)):
                    self._dial(peer, addresses[peer], deadline)
            self._accept_higher(deadline)
        except HorovodInternalError:
            self.close()
            raise
        except (OSError, ConnectionError) as exc:
            self.close()
            raise HorovodInternalError(f"rank {self.rank}: could not connect to its peers: {exc}") from None
        finally:
            for listener in (self._listener, self._unix_listener):
                if listener is not None:
                    listener.close()
            self._listener = self._unix_listener = None

    def _dial(self, peer: int, address: Tuple[str, int], deadline: float) -> None:
        last: Optional[BaseException] = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
            except OSError as exc:
                last = exc
                self._check_abandoned()
                time.sleep(0.05)
                continue
            watch_liveness(sock, self.liveness)
            self._greet(sock, peer, address, deadline)
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
        self._greet(sock, peer, f"unix:{name}", deadline)
        return True

    def _greet(self, sock: socket.socket, peer: int, where, deadline: float) -> None:
        """Authenticate a connection we dialled; it becomes ``peer``'s when ``peer`` answered."""
        try:
            their_rank = wire.handshake(sock, self.secret, self.rank, PURPOSE_MESH, deadline=deadline)
        except BaseException:
            sock.close()
            raise
        if their_rank != peer:
            sock.close()
            raise HorovodInternalError(f"rank {self.rank} dialled rank {peer} at {where} but rank "
                                       f"{their_rank} answered")
        self._socks[peer] = sock

    def _accept_higher(self, deadline: float) -> None:
        """Accept and authenticate every higher rank; each accepted connection shakes hands on its own thread.

        A stranger (silent, trickling, garbage) is dropped after :data:`HANDSHAKE_SECONDS` at most, and never holds
        up a real peer, whose handshake runs beside it.
        """
        expected = set(range(self.rank + 1, self.size))
        listeners = [listener for listener in (self._listener, self._unix_listener) if listener is not None]
        done: "queue.SimpleQueue[Tuple[int, socket.socket]]" = queue.SimpleQueue()
        pending = [0]
        lock = threading.Lock()
        try:
            while expected:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HorovodInternalError(f"rank {self.rank} timed out waiting for ranks {sorted(expected)} "
                                               f"to connect")
                self._check_abandoned()
                while True:     # collect finished handshakes
                    try:
                        peer, sock = done.get_nowait()
                    except queue.Empty:
                        break
                    if peer in expected:
                        expected.discard(peer)
                        self._socks[peer] = sock
                    else:
                        sock.close()
                if not expected:
                    break
                ready, _, _ = select.select(listeners, [], [], min(remaining, 0.05))
                for listener in ready:
                    self._accept_one(listener, deadline, done, pending, lock)
        finally:
            self._accepting_ended = True

    def _accept_one(self, listener: socket.socket, deadline: float, done, pending, lock) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError, OSError):
            return
        with lock:
            if pending[0] >= MAX_PENDING_HANDSHAKES:
                sock.close()    # a flood of connections: real peers retry until the start deadline
                return
            pending[0] += 1
        if sock.family != socket.AF_UNIX:
            watch_liveness(sock, self.liveness)

        def shake() -> None:
            try:
                limit = min(deadline, time.monotonic() + HANDSHAKE_SECONDS)
                peer = wire.handshake(sock, self.secret, self.rank, PURPOSE_MESH, dialer=False, deadline=limit)
            except (HorovodInternalError, OSError, ConnectionError, ValueError):
                sock.close()    # a stranger or a garbled greeting: drop it, real peers are not held up
                return
            finally:
                with lock:
                    pending[0] -= 1
            if self._accepting_ended:
                sock.close()
            else:
                done.put((peer, sock))

        threading.Thread(target=shake, name="horovod-handshake", daemon=True).start()

    def _where(self, peer: int) -> str:
        host = self.hostnames[peer] if 0 <= peer < len(self.hostnames) else ""
        return f"rank {peer} on host {host}" if host else f"rank {peer}"

