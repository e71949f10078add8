"""Handles: the future of one submitted collective, shaped like ``concurrent.futures.Future``."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Protocol

__all__ = ["Handle", "Completer"]


class Completer(Protocol):
    """What a handle waits on: the engine that completes it (not the negotiation's ``Loop``, which is what the
    engine lends a negotiation).

    The engine batches tensors while nobody waits for a result and hurries as soon as somebody does, so a handle
    tells it when a thread blocks on it or polls it; and a thread about to wait may run the engine's loop itself.
    """

    def waiting(self, delta: int) -> None:
        """A thread is about to block on a handle (+1), stopped blocking (-1), or polls an unfinished one (0)."""

    def drive(self, handle: "Handle") -> bool:
        """Run the loop on this thread until ``handle`` completes and return True, or return False at once when
        the loop is busy elsewhere."""


class Handle:
    """Completion of one collective. ``result()`` blocks, then returns the output or raises the op's error.

    A bare lock (held until completion) is the cheapest primitive a waiter can block on; a training step creates
    one handle per gradient, so the cost matters. ``completer`` is the engine that completes it (None: nothing to tell).
    """

    __slots__ = ("name", "_completer", "_done", "_lock", "_value", "_error", "_callbacks", "__weakref__")

    def __init__(self, name: str, completer: Optional[Completer] = None):
        self.name = name
        self._completer = completer
        self._done = False
        self._lock = threading.Lock()
        self._lock.acquire()
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: Optional[List[Callable[["Handle"], None]]] = None

    @property
    def finished(self) -> bool:
        """Whether the collective completed, without telling the engine that somebody looks (unlike ``done``)."""
        return self._done

    def done(self) -> bool:
        """Whether the collective completed; a poll, so the engine hurries as for a blocked waiter."""
        if self._done:
            return True
        completer = self._completer
        if completer is not None:
            completer.waiting(0)      # somebody polls for this result: as urgent as a blocked waiter
        return self._done

    def set_result(self, value: Any) -> None:
        """Complete with ``value`` (called by the engine)."""
        self._value = value
        self._finish()

    def set_exception(self, error: BaseException) -> None:
        """Complete with ``error``, which ``result`` raises (called by the engine)."""
        self._error = error
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self._lock.release()
        for callback in self._callbacks or ():
            callback(self)

    def add_done_callback(self, callback: Callable[["Handle"], None]) -> None:
        """Call ``callback(handle)`` on completion (at once if already complete)."""
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)
        if self._done:
            callback(self)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until completion or ``timeout`` seconds; returns whether it completed."""
        if self._done:
            return True
        completer = self._completer
        if completer is None:
            return self._lock_wait(timeout)
        if timeout is None and completer.drive(self):
            return True
        completer.waiting(1)
        try:
            return self._lock_wait(timeout)
        finally:
            completer.waiting(-1)

    def _lock_wait(self, timeout: Optional[float]) -> bool:
        if self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            self._lock.release()
            return True
        return self._done

    def exception(self) -> Optional[BaseException]:
        """Wait for completion; the collective's error, or None."""
        self.wait()
        return self._error

    def result(self, timeout: Optional[float] = None) -> Any:
        """Wait for completion and return the output.

        Raises:
            TimeoutError: not complete within ``timeout`` seconds.
            HorovodError: the collective failed (its own error).
        """
        if not self.wait(timeout):
            raise TimeoutError(f"collective {self.name!r} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<Handle {self.name!r} {state}>"
