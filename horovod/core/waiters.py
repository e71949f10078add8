"""Who waits on this process, and how the loop is woken: the two facts that pace a cycle.

A negotiation protocol spaces cycles (so that gradients fuse) only while nobody waits for a result, and hurries as
soon as a thread blocks on or polls a handle; the loop parks, spins or sleeps by the same facts. Both live here so
that the engine and its negotiation read one record instead of sharing a dozen attributes.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Callable, Optional

__all__ = ["Waiters", "Wakeup", "Handback", "shorter", "spin_select"]


class Waiters:
    """Threads of this process waiting on handles, as the loop sees them.

    ``blocked`` counts threads blocked on a handle now; ``waited`` says one blocked (or polled) since the last cycle
    started, ``waited_before`` since the start of the cycle before; ``polled`` that one polled since the last cycle.
    """

    __slots__ = ("blocked", "waited", "polled", "waited_before", "_lock")

    def __init__(self):
        self.blocked = 0
        self.waited = False
        self.polled = False
        self.waited_before = False
        self._lock = threading.Lock()

    def add(self, delta: int) -> None:
        """Count ``delta`` more (or, negative, fewer) threads blocked on a handle."""
        with self._lock:
            self.blocked += delta

    def latency_bound(self) -> bool:
        """Whether callers waited for results during this cycle or the one before (they will wait again)."""
        return self.waited or self.waited_before

    def cycle_started(self) -> None:
        """A cycle starts: what was "since the last cycle" becomes "the cycle before"."""
        self.waited_before, self.waited = self.waited, self.blocked > 0
        self.polled = False


class Handback:
    """When the engine thread, asleep, takes the loop back from a caller who ran it (see ``Engine.drive``).

    Taking it back the moment the caller lets go costs both threads a hand-off per blocking op, and a parked
    thread's batch-spacing timer wakes it again in the middle of the next one: on a host with more ranks than cores
    that was a third of a small allreduce's CPU. So while a caller drives, the engine thread rests: it wakes when the
    caller leaves work behind, when a submission comes a batch spacing or more after the caller let go (as a parked
    thread's timer would have woken it: an asynchronous burst the engine thread paces; sooner, the caller is likely
    to wait and drive again), when a caller waits without driving, when the loop ends, or after ``seconds`` (the
    negotiation's poll interval: an idle rank still reads its peers' frames that often).
    """

    __slots__ = ("driving", "resting", "_left_at", "_spacing", "_event", "_seconds")

    def __init__(self, seconds: float, spacing: Callable[[], float]):
        self.driving = False        # a caller runs the loop now
        self.resting = False        # the engine thread rests (see rest)
        self._left_at = 0.0         # when a caller last let go of the loop
        self._spacing = spacing     # the batch spacing now (autotune may change it)
        self._event = threading.Event()
        self._seconds = seconds

    def rest(self, ended: Callable[[], bool]) -> None:
        """The engine thread: sleep while a caller drives, until one of the wake-ups above or ``ended()``."""
        while self.driving and not ended():
            self._event.clear()     # (then looked at again: a wake-up set before the clear is not lost)
            self.resting = True
            try:
                if self.driving and not ended():
                    self._event.wait(self._seconds)
            finally:
                self.resting = False

    def taken(self) -> None:
        """A caller took the loop."""
        self.driving = True

    def left(self, work_left: bool) -> None:
        """The caller let go of the loop, leaving work (or not)."""
        self._left_at = time.monotonic()
        self.driving = False
        if work_left:
            self._event.set()

    def submitted(self) -> None:
        """A request was queued."""
        if self.resting and not self.driving and time.monotonic() - self._left_at >= self._spacing():
            self._event.set()

    def wake(self) -> None:
        """Wake a resting engine thread (a caller waits without driving, or the loop ended)."""
        self._event.set()


def shorter(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """The shorter of two select timeouts, None being forever."""
    if a is None:
        return b
    return a if b is None else min(a, b)


class Wakeup:
    """A socket pair that wakes the loop out of ``select``; one byte per wake-up, however many notifications."""

    def __init__(self):
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._notified = False

    def notify(self) -> None:
        """Wake the loop (a no-op while a wake-up is already pending)."""
        if not self._notified:
            self._notified = True
            try:
                self._writer.send(b"x")
            except OSError:
                pass

    def drain(self) -> None:
        """Consume pending wake-ups; the next notification writes again."""
        try:
            while self.reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self._notified = False

    def close(self) -> None:
        """Close both ends."""
        self.reader.close()
        self._writer.close()


def spin_select(fds: list, timeout: Optional[float], spin: float) -> list:
    """``select`` for reading, polling for up to ``spin`` seconds first: a frame that arrives meanwhile costs no
    scheduler wake-up (20-40 us on a virtual machine)."""
    now = time.monotonic()
    end = now + (spin if timeout is None else min(spin, timeout))
    while now < end:
        readable = select.select(fds, [], [], 0)[0]
        if readable:
            return readable
        now = time.monotonic()
    if timeout is not None:
        timeout = max(0.0, timeout - spin)
    return select.select(fds, [], [], timeout)[0]
