"""Who the rendezvous store lets in: every connection is heard, strangers are bounded, descriptors are kept.

The accepting half of :class:`horovod.common.rendezvous_server._Loop` (which sets ``listener``, ``selector``,
``unauthenticated``, ``budget``, ``resume_at`` and ``exhausted``, and serves and closes connections). Strangers
cost slots, never a real client's chance: past :data:`MAX_UNAUTHENTICATED` connections waiting to authenticate the
oldest that connected over a second ago is closed, not the newcomer. Descriptors are a slot too: at the loop's
budget (the soft limit less a reserve, :mod:`horovod.common.descriptors`), or when ``accept`` fails with
``EMFILE``/``ENFILE``, the oldest stranger is closed whatever its age -- otherwise a crowd of a thousand idle
connections pins the launcher at its limit and its listener, readable for ever, spins the loop. With no stranger to
close the listener rests for :data:`_PAUSE_SECONDS` and the reason is logged once, naming the limit and the fix.
"""

from __future__ import annotations

import collections
import errno
import logging
import selectors
import socket
import time
from typing import Callable, Dict, Optional, Tuple

from horovod.common.descriptors import exhausted_message

__all__ = ["Admission", "Conn", "REQUEST_SECONDS", "MAX_UNAUTHENTICATED"]

REQUEST_SECONDS = 10.0          # a request's line, headers and body arrive within this, however slowly
MAX_UNAUTHENTICATED = 128       # connections waiting to authenticate at once; past it the oldest is closed
_GRACE_SECONDS = 1.0            # a connection this young is not yet a stranger holding a slot
_HARD_CAP = 8192                # connections authenticating at once, however young
_PAUSE_SECONDS = 0.05           # how long the listener rests when no descriptor can be freed for it

log = logging.getLogger("horovod.common.rendezvous_server")


class Conn:
    """One client connection: its bytes so far, its deadline, and (once parsed) its request."""

    __slots__ = ("sock", "inbox", "outbox", "deadline", "head", "length", "waiting")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.inbox, self.outbox = bytearray(), bytearray()
        self.head: Optional[Tuple[str, str, Dict[str, str]]] = None    # method, path, headers (lower-case)
        self.length = 0
        self.waiting: Optional[Tuple[float, Callable[[], Optional[Tuple[int, bytes]]]]] = None


class Admission:
    """Accepting connections for the store's loop without ever refusing a newcomer for a stranger's sake."""

    listener: socket.socket
    selector: selectors.BaseSelector
    unauthenticated: "collections.OrderedDict[Conn, None]"
    budget: int
    resume_at: Optional[float]
    exhausted: Optional[str]

    def _accept(self) -> None:
        for _ in range(256):
            if len(self.selector.get_map()) >= self.budget and not self._evict_oldest():
                return self._pause("keep a reserve of descriptors for the launcher")
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of descriptors (the process's or the system's): a stranger goes, and the listener is heard
                # again; with none to drop it rests a moment rather than spin on a listener that stays readable.
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._evict_oldest():
                    continue
                return self._pause("accept a connection") if exc.errno in (errno.EMFILE, errno.ENFILE) else None
            sock.setblocking(False)
            now = time.monotonic()
            if len(self.unauthenticated) >= MAX_UNAUTHENTICATED:
                oldest = next(iter(self.unauthenticated))
                # The oldest stranger goes, not the newcomer; one that connected within the last second may be a
                # worker of a crowd registering at once, whose request is on its way: then the cap waits.
                if oldest.deadline - REQUEST_SECONDS <= now - _GRACE_SECONDS \
                        or len(self.unauthenticated) >= _HARD_CAP:
                    self._close(oldest)
            conn = Conn(sock, now + REQUEST_SECONDS)
            self.unauthenticated[conn] = None
            self.selector.register(sock, selectors.EVENT_READ, conn)
            self._serve(conn, selectors.EVENT_READ)    # a worker's whole request is usually here already

    def _evict_oldest(self) -> bool:
        """Close the oldest connection still to authenticate, whatever its age; False when there is none."""
        if not self.unauthenticated:
            return False
        self._close(next(iter(self.unauthenticated)))
        return True

    def _pause(self, what: str) -> None:
        """Stop listening for :data:`_PAUSE_SECONDS` (no spinning on a readable listener), saying why once."""
        self.selector.unregister(self.listener)
        self.resume_at = time.monotonic() + _PAUSE_SECONDS
        if self.exhausted is None:
            self.exhausted = exhausted_message("the launcher's rendezvous store", what)
            log.warning("%s", self.exhausted)

    def _resume(self) -> None:
        if self.resume_at is not None and self.resume_at <= time.monotonic():
            self.resume_at = None
            self.selector.register(self.listener, selectors.EVENT_READ, None)
