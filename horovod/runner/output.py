"""Workers' output, relayed piece by piece with Horovod's ``[rank]<stdout>:`` prefix, and optionally kept per rank.

Memory stays bounded whatever a worker writes: a stream is read in chunks of at most :data:`READ_BYTES` and cut
(:class:`PieceSplitter`) at each line end, at each carriage return (a progress bar redrawn in place is passed on as
it is drawn, its ``\r`` kept so that a terminal redraws it too), and inside a line that runs past
:data:`PIECE_CHARS` characters (each piece gets the prefix and a line of its own). A piece holds at most
:data:`PIECE_CHARS` characters until its end arrives; the per-rank files get the worker's output exactly.
"""

from __future__ import annotations

import codecs
import collections
import datetime
import os
import re
import sys
import threading
from typing import IO, Callable, Deque, Dict, Hashable, List, Optional, TextIO, Tuple

from horovod.common.safe_files import open_for_writing
from horovod.runner.noise import is_startup_note

__all__ = ["OutputSink", "PieceSplitter", "relay_pieces", "relay_lines", "PIECE_CHARS", "READ_BYTES"]

PIECE_CHARS = 64 * 1024      # the longest piece held back waiting for its line end
TAIL_LINES, TAIL_LINE_CHARS = 60, 1000    # what is kept of each rank's stderr for the failure summary
READ_BYTES = 64 * 1024
_ENDS = re.compile(r"\r\n|\r|\n")


class OutputSink:
    """Writes workers' output lines, prefixed ``[rank]<stdout>:``, whole lines under one lock so none interleave.

    With ``output_dir``, each rank's raw lines also go to ``output_dir/rank.N/stdout`` and ``stderr``.

    Output that cannot be written (``horovodrun ... | head``, a closed terminal) is dropped from then on, with one
    warning: the job goes on, and the workers' pipes keep being drained.

    With ``hide_notes``, TensorFlow's INFO lines from before its log level took effect are kept off the screen
    (:mod:`horovod.runner.noise`); the per-rank files still get them.
    """

    def __init__(self, size: int, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 output_dir: Optional[str] = None, timestamp: bool = False, hide_notes: bool = False):
        self._hide_notes = hide_notes
        self._stdout = stdout
        self._stderr = stderr
        self._timestamp = timestamp
        self._lock = threading.Lock()
        self._files: Dict[Tuple[int, str], IO[str]] = {}
        self._broken: Dict[str, bool] = {}
        # The last lines each rank wrote to stderr: a failure before hvd.init() is summarised from them.
        self._tails: Dict[Hashable, Deque[str]] = {}
        if output_dir:
            width = len(str(max(size - 1, 0)))
            for rank in range(size):
                directory = os.path.join(output_dir, f"rank.{rank:0{width}d}")
                os.makedirs(directory, exist_ok=True)
                for stream in ("stdout", "stderr"):
                    self._files[(rank, stream)] = open_for_writing(os.path.join(directory, stream),
                                                                      f"rank {rank}'s {stream}")

    def write(self, rank: Hashable, stream: str, line: str, end: str = "\n") -> None:
        """Write one piece of ``rank``'s ``stream`` ("stdout" or "stderr"): ``line`` and the ``end`` that the worker
        wrote after it (see :class:`PieceSplitter`), on a line of its own with the prefix; a carriage return is
        kept, so that a terminal redraws the line in place."""
        prefix = f"[{rank}]<{stream}>:"
        if self._timestamp:
            prefix = f"{datetime.datetime.now().strftime('%a %b %d %H:%M:%S %Y')}[{rank}]<{stream}>:"
        target = (self._stdout or sys.stdout) if stream == "stdout" else (self._stderr or sys.stderr)
        shown = not (self._hide_notes and stream == "stderr" and is_startup_note(line))
        with self._lock:
            if shown and not self._broken.get(stream):
                try:
                    target.write(prefix + line + ("\r" if end == "\r" else "\n"))
                    target.flush()
                except (OSError, ValueError, AttributeError) as exc:    # (no stream at all: None)
                    self._give_up(stream, target, exc)
            handle = self._files.get((rank, stream))
            if handle is not None:
                handle.write(line + end)
                handle.flush()
            if shown and stream == "stderr" and end != "\r":
                tail = self._tails.get(rank)
                if tail is None:
                    tail = self._tails[rank] = collections.deque(maxlen=TAIL_LINES)
                tail.append(line[:TAIL_LINE_CHARS])

    def tail(self, rank: Hashable) -> str:
        """The last lines ``rank`` wrote to stderr (at most :data:`TAIL_LINES`)."""
        with self._lock:
            return "\n".join(self._tails.get(rank, ()))

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


class PieceSplitter:
    """Cuts one stream's bytes into the pieces to relay, holding at most ``limit`` characters between calls.

    Each piece is ``(text, end)``: ``end`` is what the worker wrote after ``text``: ``"\n"`` or ``"\r\n"`` (a line),
    ``"\r"`` (a carriage return: a progress bar's redraw) or ``""`` (no end: a piece of an overlong line, or what was
    left at the end of the stream). UTF-8 is decoded across chunk boundaries (invalid bytes become U+FFFD).
    """

    def __init__(self, limit: int = PIECE_CHARS):
        self._limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> List[Tuple[str, str]]:
        """The pieces that ``data`` completes."""
        return self._split(self._decoder.decode(data), final=False)

    def finish(self) -> List[Tuple[str, str]]:
        """The pieces left at the end of the stream."""
        return self._split(self._decoder.decode(b"", final=True), final=True)

    def _split(self, text: str, final: bool) -> List[Tuple[str, str]]:
        text, pieces, start, held = self._partial + text, [], 0, ""
        for found in _ENDS.finditer(text):
            if found.group() == "\r" and found.end() == len(text) and not final:
                held = "\r"     # a "\n" may follow in the next chunk: "\r\n" is one line end
                break
            pieces.append((text[start:found.start()], found.group()))
            start = found.end()
        rest = text[start:len(text) - len(held)]
        while len(rest) > self._limit or (final and rest):
            pieces.append((rest[:self._limit], ""))
            rest = rest[self._limit:]
        self._partial = rest + held
        return pieces


Deliver = Callable[[str, str], None]


def relay_pieces(pipe: IO[bytes], deliver: Deliver) -> None:
    """Read ``pipe`` until it ends, calling ``deliver(text, end)`` for each piece (:class:`PieceSplitter`); then
    close it."""
    splitter = PieceSplitter()
    read = getattr(pipe, "read1", pipe.read)    # what has arrived, up to the bound: never waits for more
    with pipe:
        while True:
            chunk = read(READ_BYTES)
            if not chunk:
                break
            for text, end in splitter.feed(chunk):
                deliver(text, end)
        for text, end in splitter.finish():
            deliver(text, end)


def relay_lines(sink: "OutputSink", key: Hashable, stream: str, pipe: IO[bytes]) -> None:
    """Copy ``pipe`` to ``sink`` piece by piece under ``key`` until it ends, then close it."""
    relay_pieces(pipe, lambda text, end: sink.write(key, stream, text, end))
