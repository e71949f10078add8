"""Making the mesh: connections opened when first needed, authenticated, refusing strangers, watching liveness.

A rank connects only to the peers its collectives use (ring neighbours, the coordinator, its host's ranks, the
partners of recursive doubling or alltoall), the first time it needs each one, so a job that only allreduces holds a
handful of sockets per rank whatever its size, instead of a full mesh of ``n(n-1)/2`` made at ``init``. The
listeners stay open for the whole job, served by the transport's I/O thread (:mod:`horovod.transport.reactor`),
which authenticates every caller without a thread per connection.

Either end of a pair may dial first; when both dial at once, the connection dialled by the higher rank is kept and
the other is dropped (the acceptor's verdict byte says which), so both ends agree on one connection before a byte
of data crosses it. A dialled listener that refuses outright belongs to a rank that is gone (every rank listened
before it published its address): that is reported at once as a lost rank.

Liveness is the kernel's (:func:`watch_liveness`): keepalive probes on idle connections and a bound on unacknowledged
data, answered by the peer's kernel whatever its Python does.

A process forked after the mesh was made shares its connections with its parent
(:func:`horovod.common.forks.forked` says so), and :meth:`horovod.transport.tcp.TcpTransport.close` then never
shuts them down.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import socket
import struct
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.descriptors import raise_descriptor_limit
from horovod.common.liveness import probe_interval
from horovod.transport.base import DescriptorLimitError
from horovod.transport.reactor import HANDSHAKE_SECONDS, MAX_PENDING_HANDSHAKES, VERDICT_KEEP, Reactor

__all__ = ["HANDSHAKE_SECONDS", "MAX_PENDING_HANDSHAKES", "PURPOSE_MESH", "watch_liveness",
           "raise_descriptor_limit", "DescriptorLimitError", "MeshSetup"]

PURPOSE_MESH = 2                  # 1 was the full mesh made at init, whose acceptors sent no verdict


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


_TCPI_PROBES = 3       # struct tcp_info: state, ca_state, retransmits, probes (unanswered window probes)
_TCPI_UNACKED = 24     # ... then backoff, options, wscale, flags, rto, ato, snd_mss, rcv_mss, unacked
_SIOCOUTQ = 0x5411     # Linux: bytes in a socket's send queue, sent or not


def window_closed(sock: socket.socket) -> bool:
    """Whether bytes wait in ``sock``'s kernel behind a window the peer closed while the peer's kernel answers:
    every byte sent was acknowledged, more wait to go, and at most one window probe went unanswered. The peer's
    process does not read (busy, or stopped) but its host is alive; a host that stops answering raises the probe
    count past one, and the connection is no longer held open."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        if len(info) < 28 or struct.unpack_from("I", info, _TCPI_UNACKED)[0] != 0 or info[_TCPI_PROBES] > 1:
            return False
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0] > 0
    except (OSError, AttributeError, ValueError):
        return False


def hold_open(sock: socket.socket, seconds: float) -> None:
    """Bound unacknowledged data and unanswered window probes on ``sock`` by ``seconds`` (0: the kernel's own
    retries, many minutes) instead of the liveness timeout: Linux applies ``TCP_USER_TIMEOUT`` to a closed window
    too, and would cut a peer that is merely busy."""
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
        except OSError:
            pass


class MeshSetup:
    """The connection-making half of :class:`horovod.transport.tcp.TcpTransport` (which sets every attribute)."""

    rank: int
    size: int
    secret: bytes
    liveness: float
    timeout: float
    hostnames: List[str]
    _socks: Dict[int, socket.socket]
    _listener: Optional[socket.socket]
    _unix_listener: Optional[socket.socket]
    _reactor: Optional[Reactor]
    _broken: Optional[str]
    unix_name: str
    _abandoned: Optional[Callable[[], bool]]

    def close(self) -> None:
        """Close every connection (the transport's)."""
        raise NotImplementedError

    def _hold_busy_peers(self) -> None:
        """Look at the connections' windows, every second on the I/O thread (the transport's)."""
        raise NotImplementedError

    def _fail(self, peer: int, exc: BaseException) -> HorovodInternalError:
        raise NotImplementedError

    def _configure(self, sock: socket.socket) -> None:
        raise NotImplementedError

    def broken_error(self) -> HorovodInternalError:
        """The error every call raises once the transport failed (the transport's)."""
        raise NotImplementedError

    def _check_abandoned(self) -> None:
        """Raise when the round this mesh is for was given up (``abandoned``, asked at most every half second)."""
        abandoned = self._abandoned
        if abandoned is not None and abandoned():
            raise HorovodInternalError(f"rank {self.rank}: this round was given up while its mesh formed (a peer "
                                       f"failed during start-up)")

    def listen(self, bind_host: str = "0.0.0.0") -> int:
        """Open the listening socket; returns its port (to be published through the rendezvous)."""
        self._links = threading.Condition()
        self._dialing: Set[int] = set()
        self._claimed: Set[int] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind_host, 0))
        self._listener.listen(_backlog(self.size))
        self._listen_unix()
        # Served from now on, while this rank still waits for the others to publish: a peer that starts sooner
        # may dial at once, and strangers are dropped while they wait.
        self._reactor = Reactor(self.rank, self.size, self.secret, PURPOSE_MESH, self._claim, self._fail,
                                self._adopt, self._hold_busy_peers if self.liveness > 0 else None)
        self._reactor.start()
        for listener in (self._listener, self._unix_listener):
            if listener is not None:
                self._reactor.listen_on(listener)
        return self._listener.getsockname()[1]

    def _listen_unix(self) -> None:
        if not hasattr(socket, "AF_UNIX") or not os.path.exists("/proc/net/unix"):
            return      # the abstract namespace is Linux's
        name = f"hvdpy-{os.getpid()}-{os.urandom(8).hex()}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind("\0" + name)
            listener.listen(_backlog(self.size))
        except OSError:
            listener.close()
            return
        self._unix_listener, self.unix_name = listener, name

    def connect(self, addresses: Dict[int, Tuple[str, int]], connect_timeout: float,
                unix_names: Optional[Dict[int, str]] = None, abandoned=None) -> None:
        """Learn every peer's address: connections to ``addresses`` (every peer's TCP address) are opened when
        first needed, each within ``connect_timeout`` seconds. ``unix_names`` names the Unix sockets of peers on
        this host, tried before TCP."""
        self._addresses = dict(addresses)
        self._unix_names = dict(unix_names or {})
        self._connect_timeout = connect_timeout
        self._abandoned = abandoned      # asked now and then while waiting for a peer (elastic rounds)

    # -- both ends agree on one connection -----------------------------------------------------------------------

    def _claim(self, peer: int) -> bool:
        """Whether a connection ``peer`` dialled is kept (the I/O thread asks, once the peer proved itself)."""
        with self._links:
            if self._broken is not None or peer in self._socks or peer in self._claimed:
                return False
            if peer in self._dialing and peer < self.rank:
                return False        # we are dialling it too, and the higher rank's connection is the one kept
            self._claimed.add(peer)
            return True

    def _adopt(self, peer: int, sock: Optional[socket.socket]) -> None:
        """A claimed connection is ready for use (the verdict went out), or ``None``: it failed before that."""
        if sock is not None:
            self._configure(sock)
        with self._links:
            self._claimed.discard(peer)
            if sock is not None:
                if self._broken is not None:
                    sock.close()
                else:
                    self._socks[peer] = sock
            self._links.notify_all()

    def _open(self, peer: int) -> socket.socket:
        """The connection to ``peer``, dialled now if neither end has opened it yet.

        Raises:
            HorovodInternalError: the peer is gone, unreachable or never answered within the connect timeout.
        """
        if not 0 <= peer < self.size or peer == self.rank:
            raise HorovodInternalError(f"rank {self.rank} has no connection to rank {peer}")
        deadline = time.monotonic() + self._connect_timeout
        dialled = False
        while True:
            with self._links:
                while True:
                    if self._broken is not None:
                        raise self.broken_error()
                    sock = self._socks.get(peer)
                    if sock is not None:
                        return sock
                    if peer not in self._dialing and peer not in self._claimed and not dialled:
                        self._dialing.add(peer)
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._fail(peer, TimeoutError(
                            f"no connection within {self._connect_timeout:g} s (HOROVOD_START_TIMEOUT)"))
                    self._links.wait(min(left, 0.5))
                    self._check_abandoned()
            sock = None
            try:
                sock = self._dial_any(peer, deadline)
            finally:
                dialled = True
                if sock is not None:
                    self._configure(sock)
                with self._links:
                    self._dialing.discard(peer)
                    if sock is not None and self._broken is None:
                        self._socks[peer] = sock
                    self._links.notify_all()
            # Dropped: the peer dialled us at the same time and its connection is the one kept; wait for it.

    def await_dial(self, peer: int, deadline: float, abandoned=None) -> None:
        """Wait until ``peer`` has dialled this rank (before this rank knows any address: start-up's records come
        from the rank that dials), asking ``abandoned`` now and then.

        Raises:
            HorovodInternalError: the transport failed, or no connection came by ``deadline``.
        """
        if abandoned is not None:
            self._abandoned = abandoned
        with self._links:
            while peer not in self._socks:
                if self._broken is not None:
                    raise self.broken_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HorovodInternalError(f"rank {self.rank}: the start-up records did not come from rank {peer} "
                                               f"within the start timeout (HOROVOD_START_TIMEOUT): rank 0 waits for "
                                               f"every rank to register, and it reports which did not")
                self._links.wait(min(left, 0.5))
                self._check_abandoned()

    def _dial_any(self, peer: int, deadline: float) -> Optional[socket.socket]:
        """A connection to ``peer`` that it kept, or None when it kept its own dial to us instead."""
        while True:
            try:
                return self._dial_either(peer, deadline)
            except _HandshakeCut as cut:
                # Cut before the verdict (a crowd of strangers on the peer's listener evicted it, or a reset): a
                # real peer dials again until the deadline; a dead one refuses the next dial.
                if time.monotonic() >= deadline:
                    raise self._fail(peer, cut.error) from None
                self._check_abandoned()
                time.sleep(0.05)
            except OSError as exc:
                raise self._dial_error(peer, self._addresses.get(peer, ("?", 0)), exc) from None

    def _dial_either(self, peer: int, deadline: float) -> Optional[socket.socket]:
        name = self._unix_names.get(peer)
        if name:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.connect("\0" + name)
            except BlockingIOError as exc:
                # The listener is here but its backlog is full (a crowd of strangers): dial it again shortly.
                # Falling back to TCP would meet the same crowd, and a dropped SYN waits a second to be resent.
                sock.close()
                raise _HandshakeCut(exc) from None
            except OSError:
                sock.close()    # another network namespace after all: TCP
            else:
                return self._greet(sock, peer, deadline)
        address = self._addresses.get(peer)
        if address is None:
            raise HorovodInternalError(f"rank {self.rank} has no address for rank {peer}")
        try:
            sock = _connect_tcp(address, deadline)
        except OSError as exc:
            raise self._dial_error(peer, address, exc) from None
        watch_liveness(sock, self.liveness)
        return self._greet(sock, peer, deadline)

    def _dial_error(self, peer: int, address: Tuple[str, int], exc: OSError) -> HorovodInternalError:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            return self._fail(peer, OSError(exc.errno, (
                f"rank {self.rank} cannot open a connection to rank {peer}: the limit of {soft} open files per "
                f"process is reached (hard limit {hard}); raise the limit (ulimit -n, or LimitNOFILE for a "
                f"service) before starting the job")))
        if isinstance(exc, ConnectionRefusedError):
            return self._fail(peer, ConnectionError(f"its listener at {address[0]}:{address[1]} refused the "
                                                    f"connection"))
        return self._fail(peer, exc)

    def _greet(self, sock: socket.socket, peer: int, deadline: float) -> Optional[socket.socket]:
        """Authenticate a connection we dialled and read the acceptor's verdict: the socket if kept, else None."""
        try:
            their_rank = wire.handshake(sock, self.secret, self.rank, PURPOSE_MESH,
                                        deadline=min(deadline, time.monotonic() + HANDSHAKE_SECONDS))
            verdict = wire.recv_by(sock, 1, deadline)
        except (OSError, ConnectionError) as exc:
            sock.close()
            raise _HandshakeCut(exc) from None
        except BaseException:
            sock.close()
            raise
        if their_rank != peer:
            sock.close()
            raise HorovodInternalError(f"rank {self.rank} dialled rank {peer} but rank {their_rank} answered")
        if verdict != VERDICT_KEEP:
            sock.close()
            return None
        return sock

    def connected_peers(self) -> List[int]:
        """The peers this rank holds a connection to now."""
        return sorted(self._socks)

    def _where(self, peer: int) -> str:
        host = self.hostnames[peer] if 0 <= peer < len(self.hostnames) else ""
        return f"rank {peer} on host {host}" if host else f"rank {peer}"


class _HandshakeCut(Exception):
    """A dialled connection failed before the acceptor's verdict."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _connect_tcp(address: Tuple[str, int], deadline: float) -> socket.socket:
    """A TCP connection to ``address`` by ``deadline``. A SYN that a full accept queue dropped (a crowd of strangers on
    the listener) is resent by the kernel only after a second; a new dial sooner, with patience that doubles up to
    what is left, gets in as soon as the queue has room, and still waits out a slow link."""
    patience = 0.25
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection(address, timeout=max(0.1, min(patience, left)))
        except TimeoutError:
            if patience >= left:
                raise
            patience *= 2


def _backlog(size: int) -> int:
    # Every rank may dial one (the coordinator) at once when the job starts.
    return max(128, min(size, 4096))
