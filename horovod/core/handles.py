"""Handles: the future of one submitted collective, shaped like ``concurrent.futures.Future``."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

__all__ = ["Handle", "set_blocking_hook", "set_driver"]


# Called with +1 when a thread is about to block on an unfinished handle, -1 when it stops, and 0 when a thread
# polls an unfinished handle: the engine batches tensors while nobody waits for a result, and hurries as soon as
# somebody does.
_blocking_hook: Optional[Callable[[int], None]] = None


def set_blocking_hook(hook: Optional[Callable[[int], None]]) -> None:
    """Install the engine's hook told when threads block on (+1), stop blocking on (-1) or poll (0) a handle."""
    global _blocking_hook
    _blocking_hook = hook


# Offered a handle a thread is about to wait for (without a timeout): runs the engine's loop on that thread until
# the handle completes and returns True, or returns False at once when the loop is busy elsewhere.
_driver: Optional[Callable[["Handle"], bool]] = None


def set_driver(driver: Optional[Callable[["Handle"], bool]]) -> None:
    """Install the engine's offer to run its loop on a thread about to wait for a handle (None: no offer)."""
    global _driver
    _driver = driver


class Handle:
    """Completion of one collective. ``result()`` blocks, then returns the output or raises the op's error.

    A bare lock (held until completion) is the cheapest primitive a waiter can block on; a training step creates
    one handle per gradient, so the cost matters.
    """

    __slots__ = ("name", "_done", "_lock", "_value", "_error", "_callbacks", "__weakref__")

    def __init__(self, name: str):
        self.name = name
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
        hook = _blocking_hook
        if hook is not None:
            hook(0)      # somebody polls for this result: as urgent as a blocked waiter
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
        driver = _driver
        if timeout is None and driver is not None and driver(self):
            return True
        hook = _blocking_hook
        if hook is not None:
            hook(1)
        try:
            if self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
                self._lock.release()
                return True
        finally:
            if hook is not None:
                hook(-1)
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
