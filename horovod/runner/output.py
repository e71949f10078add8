"""Workers' output, relayed line by line with Horovod's ``[rank]<stdout>:`` prefix, and optionally kept per rank."""

from __future__ import annotations

import datetime
import os
import sys
import threading
from typing import IO, Dict, Hashable, Optional, TextIO, Tuple

__all__ = ["OutputSink", "relay_lines"]


class OutputSink:
    """Writes workers' output lines, prefixed ``[rank]<stdout>:``, whole lines under one lock so none interleave.

    With ``output_dir``, each rank's raw lines also go to ``output_dir/rank.N/stdout`` and ``stderr``.

    Output that cannot be written (``horovodrun ... | head``, a closed terminal) is dropped from then on, with one
    warning: the job goes on, and the workers' pipes keep being drained.
    """

    def __init__(self, size: int, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 output_dir: Optional[str] = None, timestamp: bool = False):
        self._stdout = stdout
        self._stderr = stderr
        self._timestamp = timestamp
        self._lock = threading.Lock()
        self._files: Dict[Tuple[int, str], IO[str]] = {}
        self._broken: Dict[str, bool] = {}
        if output_dir:
            width = len(str(max(size - 1, 0)))
            for rank in range(size):
                directory = os.path.join(output_dir, f"rank.{rank:0{width}d}")
                os.makedirs(directory, exist_ok=True)
                for stream in ("stdout", "stderr"):
                    self._files[(rank, stream)] = open(os.path.join(directory, stream), "w", encoding="utf-8")

    def write(self, rank: Hashable, stream: str, line: str) -> None:
        """Write one line (without its newline) of ``rank``'s ``stream`` ("stdout" or "stderr")."""
        prefix = f"[{rank}]<{stream}>:"
        if self._timestamp:
            prefix = f"{datetime.datetime.now().strftime('%a %b %d %H:%M:%S %Y')}[{rank}]<{stream}>:"
        target = (self._stdout or sys.stdout) if stream == "stdout" else (self._stderr or sys.stderr)
        with self._lock:
            if not self._broken.get(stream):
                try:
                    target.write(f"{prefix}{line}\n")
                    target.flush()
                except (OSError, ValueError, AttributeError) as exc:    # (no stream at all: None)
                    self._give_up(stream, target, exc)
            handle = self._files.get((rank, stream))
            if handle is not None:
                handle.write(line + "\n")
                handle.flush()

    def _give_up(self, stream: str, target: TextIO, exc: BaseException) -> None:
        """``stream`` cannot be written (its reader is gone): drop its output from now on, and say so once."""
        self._broken[stream] = True
        try:
            # Later writes and the interpreter's flush at exit go nowhere instead of failing again.
            if target is None:
                raise ValueError("no stream")
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, target.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        if stream == "stdout" and not self._broken.get("stderr"):
            try:
                other = self._stderr or sys.stderr
                if other is None:
                    raise ValueError("no stream")
                other.write(f"horovodrun: workers' standard output can no longer be written ({exc}); it is dropped "
                            f"from now on, the job goes on\n")
                other.flush()
            except (OSError, ValueError):
                self._broken["stderr"] = True

    def close(self) -> None:
        """Close the per-rank output files."""
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()


def relay_lines(sink: "OutputSink", key: Hashable, stream: str, pipe: IO[bytes]) -> None:
    """Copy ``pipe`` to ``sink`` line by line under ``key`` until it ends, then close it."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            sink.write(key, stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"))
