"""Socket transport: an authenticated, full-duplex connection to each peer a rank talks to.

A connection is opened the first time a collective needs it (:mod:`horovod.transport.mesh`), to the address every
rank published through the rendezvous. Ranks on one host connect through a Unix-domain socket (Linux's abstract
namespace) where they can: the same stream, without the TCP stack, so a small send costs about a tenth of a loopback
TCP send. TCP is the fallback, and the only way between hosts. A collective's transfers go through
:meth:`TcpTransport.duplex`, which moves its sends and receives together on the calling thread
(:mod:`horovod.transport.duplex`); :meth:`~TcpTransport.isend` of anything too large to go inline is written by the
transport's one I/O thread (:mod:`horovod.transport.reactor`), which also serves the listeners: a rank runs that
thread beside the engine's, whatever the world size. A socket error, a closed connection or a peer silent for
longer than the timeout becomes :class:`HorovodInternalError` naming the peer; the transport then closes every
connection so that the other ranks learn of the failure at once instead of waiting for their own timeout.

Liveness is the kernel's, separate from progress: every TCP connection has keepalive probes and a bound on
unacknowledged data (``HOROVOD_LIVENESS_TIMEOUT``), which the peer's kernel answers whatever its Python does (a rank
inside a minute-long call that holds the GIL stays alive), so a host that is down or cut off is lost within the
liveness timeout, a dead process at once (its kernel closes the connection). A live peer that sends nothing is
busy, and is waited on (:mod:`horovod.transport.patience`: a warning every ``HOROVOD_GLOO_TIMEOUT_SECONDS``, failure
only past ``HOROVOD_BUSY_PEER_TIMEOUT_SECONDS``).

How the mesh is made (listening, dialling, authenticating, refusing strangers) is :mod:`horovod.transport.mesh`'s.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import threading
import time
from typing import Dict, List, Optional, Sequence

from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.forks import FORKED
from horovod.transport.base import DescriptorLimitError, Transport
from horovod.transport.duplex import PollDuplex
from horovod.transport.mesh import MeshSetup, hold_open, watch_liveness, window_closed
from horovod.transport.patience import Patience
from horovod.transport.reactor import Reactor, SendFuture

__all__ = ["SendFuture", "TcpTransport", "watch_liveness"]

log = logging.getLogger("horovod")

_SOCKET_BUFFER = 4 * 1024 * 1024
_INLINE_SEND_BYTES = 64 * 1024


class _Stuck(Exception):
    """A live peer made no progress inside a collective for the busy-peer bound (the text is the account)."""


class _Sent:
    """The completion of a send that went out inline: nothing to wait for (and no Event to build, per barrier)."""

    __slots__ = ()

    def wait(self) -> None:
        return None


_SENT = _Sent()


def _configure(sock: socket.socket, timeout: float, liveness: float = 0.0) -> None:
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        watch_liveness(sock, liveness)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)
        except OSError:
            pass
    sock.settimeout(timeout if timeout > 0 else None)


class TcpTransport(MeshSetup, Transport):
    """Point-to-point messaging between the ranks of one job over authenticated TCP connections."""

    def __init__(self, rank: int, size: int, secret: bytes, timeout: float, job_token: str = "",
                 liveness: float = 0.0, busy_bound: float = 0.0):
        self.rank = rank
        self.size = size
        self.secret = secret
        self.timeout = timeout
        self.liveness = liveness            # HOROVOD_LIVENESS_TIMEOUT (0: the kernel's defaults)
        # How long a live peer may owe bytes inside a collective (HOROVOD_BUSY_PEER_TIMEOUT_SECONDS), warned
        # about every ``timeout`` seconds; the executor names the collective through ``patience.working_on``.
        self.patience = Patience(rank, timeout, busy_bound, self._where)
        self.job_token = job_token
        self._socks: Dict[int, socket.socket] = {}
        self._reactor: Optional[Reactor] = None
        self._broken: Optional[str] = None
        self._pid = os.getpid()
        self._silence_reported: set = set()
        self._held: set = set()             # peers whose connection is held open behind a closed window
        self._abandoned = None
        self._fail_lock = threading.Lock()
        self._limit_hit = False
        # Where a failing rank posts its account before it hangs up, so that ranks that only learn of the failure
        # from it (connections open on demand: few see a lost rank itself) name the lost rank, not the messenger.
        self.loss_board = None
        self._addresses: Dict = {}
        self._unix_names: Dict[int, str] = {}
        self._connect_timeout = timeout if timeout > 0 else 30.0
        self._listener: Optional[socket.socket] = None
        self._unix_listener: Optional[socket.socket] = None
        self.unix_name = ""                # where same-host peers dial us ("" when Unix sockets are unavailable)
        self.hostnames: List[str] = []     # host identity of every rank (which ranks can share memory): set_layout
        self.cores: List[int] = []         # cores of every rank's host: set_layout

    # -- setup ---------------------------------------------------------------------------------------------------

    def _configure(self, sock: socket.socket) -> None:
        _configure(sock, self.timeout, self.liveness)

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
        with self._fail_lock:
            if self._broken is None:
                self._limit_hit = isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)
                self._broken = self._cause(peer, exc)
                self.close()
        return self.broken_error()

    def broken_error(self) -> HorovodInternalError:
        """The error every call raises once the transport failed (DescriptorLimitError when this rank ran out of
        descriptors, so that the engine names the collective that needed them)."""
        kind = DescriptorLimitError if self._limit_hit else HorovodInternalError
        return kind(f"Horovod failed on rank {self.rank}: {self._broken}")

    def _cause(self, peer: int, exc: BaseException) -> str:
        """What failed, as this rank tells it: its own view of ``peer``'s connection, unless ``peer`` posted on the
        loss board before it hung up (then it is passing on a loss it saw, and its account names the lost rank)."""
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return str(exc.strerror)      # this rank's own limit, worded by the mesh
        if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT:
            # The kernel's keepalive probes or unacknowledged data ran out: the host is down or cut off.
            cause = (f"{self._where(peer)} was lost: its connection showed no sign of life for {self.liveness:g} s "
                     f"(HOROVOD_LIVENESS_TIMEOUT); its host is down or unreachable")
        elif isinstance(exc, _Stuck):
            cause = str(exc)     # the patience's account: the peer is alive but made no progress for the bound
        elif isinstance(exc, socket.timeout):
            # Python's own timeout on a send: the peer's kernel still answers, so the process is alive but stuck.
            cause = (f"{self._where(peer)} took nothing for {self.timeout:g} s in the middle of a collective "
                     f"(HOROVOD_GLOO_TIMEOUT_SECONDS), though its connection is alive: it is stuck, or busy in a "
                     f"long call that holds Python's GIL")
        else:
            cause = f"{self._where(peer)} was lost: its connection failed ({exc}); the process died"
        board = self.loss_board
        if board is None:
            return cause
        try:
            posted = board.read()
            if peer in posted:
                cause = posted[peer]
                if " (passed on by rank " not in cause and not cause.startswith(f"{self._where(peer)} failed: "):
                    cause = f"{cause} (passed on by rank {peer})"
            board.post(self.rank, cause)
        except Exception as error:  # the board is a courtesy: a launcher that is gone only loses the account
            log.debug("rank %d: the loss board failed: %s", self.rank, error)
        return cause

    def fail_own(self, account: str) -> None:
        """This rank fails for a reason of its own (a bug on its engine thread): post it on the loss board before
        the connections close, so that the ranks that lose theirs to it name it and the reason."""
        board = self.loss_board
        if board is None:
            return
        try:
            board.post(self.rank, f"{self._where(self.rank)} failed: {account}")
        except Exception as error:  # the board is a courtesy
            log.debug("rank %d: the loss board failed: %s", self.rank, error)

    def fail(self, peer: int, exc: BaseException) -> HorovodInternalError:
        """The error for ``peer``'s connection failing with ``exc``; the transport fails as a whole."""
        return self._fail(peer, exc)

    def connection(self, peer: int) -> socket.socket:
        """The socket to ``peer`` (for :class:`~horovod.transport.duplex.PollDuplex`)."""
        return self._sock(peer)

    def duplex(self) -> PollDuplex:
        """A collective's sends and receives, progressed on the calling thread (see :mod:`~.duplex`)."""
        return PollDuplex(self)

    def quiesce(self, peer: int) -> None:
        """Return once no queued send to ``peer`` is still being written (before another writer takes the
        connection)."""
        reactor = self._reactor
        if reactor is not None and not reactor.idle(peer):
            reactor.send(peer, self._sock(peer), memoryview(b"")).wait()

    def check_open(self, peer: int) -> None:
        """Raise HorovodInternalError if ``peer`` hung up; bytes waiting on the connection are left there."""
        sock = self._sock(peer)
        try:
            # (A socket with a timeout waits for data before it receives, MSG_DONTWAIT or not: look first.)
            if select.select([sock], [], [], 0)[0] and sock.recv(1, socket.MSG_PEEK) == b"":
                raise ConnectionError("connection closed by peer")
        except (OSError, ConnectionError, ValueError) as exc:
            raise self._fail(peer, exc) from None

    def waiting(self, peer: int, silent_for: float) -> None:
        """A collective has waited ``silent_for`` seconds on ``peer``, whose connection is alive (see
        :mod:`~horovod.transport.patience`): warns once for the job every timeout, and fails the transport (raising
        HorovodInternalError) past the busy-peer bound."""
        account = self.patience.waiting(peer, silent_for)
        if account is not None:
            raise self._fail(peer, _Stuck(account))

    def resumed(self) -> None:
        """Bytes moved again after :meth:`waiting` was called."""
        self.patience.resumed()

    def _hold_busy_peers(self) -> None:
        """Every second, on the I/O thread: a connection whose peer's kernel took every byte and closed its window
        (the peer's process does not read: busy, or stopped) is held open up to the busy-peer bound instead of
        being cut at the liveness timeout, since Linux applies ``TCP_USER_TIMEOUT`` to window probes too; once
        its window opens, or its host stops answering, liveness is as before. Whatever waits on it (a duplex, a
        receive, a queued send), the patience still bounds the collective."""
        for peer, sock in list(self._socks.items()):
            if sock.family == socket.AF_UNIX:
                continue
            busy = window_closed(sock)
            if busy and peer not in self._held:
                self._held.add(peer)
                hold_open(sock, self.patience.bound)
            elif not busy and peer in self._held:
                self._held.discard(peer)
                hold_open(sock, self.liveness)

    def _silent_peer(self, peer: int, silent_for: float) -> None:
        """``peer`` owes a control message while its connection is alive: busy (a long call that holds its GIL) or
        stuck, not lost. The patience says so once for the job, and bounds the wait."""
        self._silence_reported.add(peer)
        self.waiting(peer, silent_for)

    def _sock(self, peer: int) -> socket.socket:
        if self._broken is not None:
            raise self.broken_error()
        sock = self._socks.get(peer)
        return sock if sock is not None else self._open(peer)

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
        reactor = self._reactor
        # Inline only when nothing is queued for this peer: two threads writing one socket would interleave bytes.
        if len(view) <= _INLINE_SEND_BYTES and (reactor is None or reactor.idle(peer)) or reactor is None:
            try:
                self.send(peer, view)
                return _SENT
            except HorovodInternalError as exc:
                future = SendFuture()
                future._finish(exc)
                return future
        return reactor.send(peer, self._sock(peer), view)

    def recv_into(self, peer: int, view: memoryview) -> None:
        """Fill ``view`` with the next bytes from ``peer`` (a live peer may take its time: :meth:`waiting`)."""
        sock = self._sock(peer)
        tick = self.timeout / 2
        poller = None
        got, total = 0, len(view)
        since = None
        try:
            while got < total:
                if tick > 0:
                    if poller is None:
                        poller = select.poll()
                        poller.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
                    if not poller.poll(max(1, int(tick * 1000))):
                        since = since if since is not None else time.monotonic() - tick
                        self.waiting(peer, time.monotonic() - since)
                        continue
                n = sock.recv_into(view[got:], total - got)
                if n == 0:
                    raise ConnectionError("connection closed by peer")
                got += n
                if since is not None:
                    since = None
                    self.resumed()
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def send_obj(self, peer: int, message) -> None:
        """Send one control message (primitives only, see :mod:`horovod.common.wire`)."""
        sock = self._sock(peer)
        try:
            wire.send_frame(sock, wire.encode(message))
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def recv_obj(self, peer: int):
        """Receive one control message (negotiation: a live peer may take its time, see :meth:`_silent_peer`)."""
        sock = self._sock(peer)
        try:
            frame = wire.recv_frame(sock, lambda silent_for: self._silent_peer(peer, silent_for), self.timeout / 2)
            if self._silence_reported:
                self._silence_reported.clear()
                self.resumed()
            return wire.decode(frame)
        except (OSError, ConnectionError) as exc:
            raise self._fail(peer, exc) from None

    def close(self) -> None:
        """Close every connection and stop the I/O thread; later calls raise HorovodInternalError.

        In a process forked after the connections were made, they are the parent's too: they are only closed
        here, never shut down, which would cut the parent off.
        """
        for listener in (self._listener, self._unix_listener):
            if listener is not None:
                listener.close()
        self._listener = self._unix_listener = None
        child = FORKED[0] and self._pid != os.getpid()
        if self._reactor is not None:
            self._reactor.stop()
        for sock in list(self._socks.values()):
            if not child:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            sock.close()
        if self._broken is None:
            self._broken = ("this process was forked after hvd.init(): the job's connections belong to its parent"
                            if child else "the transport was closed (Horovod has been shut down)")

    def join_senders(self, timeout: float) -> None:
        """Wait (after :meth:`close`) for the I/O thread to end, so that it does not outlive the interpreter."""
        reactor = self._reactor
        if reactor is not None and reactor.is_alive() and reactor is not threading.current_thread():
            reactor.join(timeout)
