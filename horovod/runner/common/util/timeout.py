"""``horovod.runner.common.util.timeout`` as Horovod has it: a deadline that names the activity it cut short."""

from __future__ import annotations

import time

__all__ = ["TimeoutException", "Timeout"]


class TimeoutException(Exception):
    """A :class:`Timeout` ran out; ``message`` says during what."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Timeout:
    """A deadline ``timeout`` seconds from now; ``message`` may hold ``{activity}``."""

    def __init__(self, timeout: float, message: str):
        self._timeout = timeout
        self._timeout_at = time.time() + timeout
        self._message = message

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._timeout_at - time.time())

    def timed_out(self) -> bool:
        """Whether the deadline has passed."""
        return time.time() > self._timeout_at

    def check_time_out_for(self, activity: str) -> None:
        """Raise :class:`TimeoutException` naming ``activity`` if the deadline has passed."""
        if self.timed_out():
            text = self._message.format(activity=activity)
            stop = "" if text.rstrip().endswith(".") else "."
            raise TimeoutException(f"{text}{stop} Timeout after {self._timeout} seconds.")
