"""Handles: the future of one submitted collective, shaped like ``concurrent.futures.Future``."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional


class Handle:
    """Completion of one collective. ``result()`` blocks, then returns the output or raises the op's error."""

    __slots__ = ("name", "_event", "_value", "_error", "_callbacks", "__weakref__")

    def __init__(self, name: str):
        self.name = name
        self._event = threading.Event()
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: List[Callable[["Handle"], None]] = []

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, value: Any) -> None:
        self._value = value
        self._finish()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        self._event.set()
        for callback in self._callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[["Handle"], None]) -> None:
        self._callbacks.append(callback)
        if self._event.is_set():
            callback(self)

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._event.wait(timeout)

    def exception(self) -> Optional[BaseException]:
        self._event.wait()
        return self._error

    def result(self, timeout: Optional[float] = None) -> Any:
        if not self._event.wait(timeout):
            raise TimeoutError(f"collective {self.name!r} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<Handle {self.name!r} {state}>"
