"""A worker's own standard error through a small filter process that drops TensorFlow's start-up notes (issue 49).

Where a launcher does not carry the workers' output itself (Ray: an actor's fd 2 is a log file that Ray's log monitor
tails and relays to the driver), the worker filters its stderr at the source. :func:`start` points the worker's fd 2
at a pipe read by a child process, which copies everything to the old fd 2 except whole lines that
:func:`horovod.runner.noise.is_startup_note` identifies. The caller starts it once the worker's environment is set and
before any job code (and so TensorFlow) runs, and only when that environment hides TensorFlow's INFO lines
(:func:`horovod.runner.noise.hides_notes`).

Invariants:

* Only whole lines that are start-up notes are dropped; every other byte is copied unchanged and in order. A line
  without an end (a prompt, a progress bar) is written after a short quiet or wait, and the rest of that line is
  not judged.
* No line is lost when the worker dies: the filter is a process of its own, in its own session (a signal to the
  worker's process group does not reach it), reading until every writer of the pipe (the worker, and processes it
  started) has closed it; then it writes what is left and exits. So it ends when the worker ends. (Ray kills an
  exiting actor's child processes, the filter among them: by then the filter has copied what the worker wrote, as it
  copies each write when it arrives.)
* The worker is never left writing into a pipe nobody reads: fd 2 is redirected only once the filter has said it is
  running; if it cannot start, stderr stays as it was.
* :meth:`NoteFilter.stop` gives fd 2 back and waits for the filter (its child, by pid) to copy what is left and exit.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import List, Optional

from horovod.runner.noise import is_startup_note

__all__ = ["NoteFilter", "start", "copy_lines", "main"]

READ_BYTES = 64 * 1024
HOLD_BYTES = 64 * 1024      # the longest piece of a line held back waiting for its end
QUIET_S = 0.1               # a piece of a line is written once the worker has written nothing for this long,
HOLD_S = 0.5                # or once it has waited this long (a progress bar redrawn with "\r" without a pause)
READY_TIMEOUT_S = 30.0


class _Out:
    """Writes to a descriptor; once it cannot be written, drops everything (the worker must never block on us)."""

    def __init__(self, fd: int):
        self.fd, self.broken = fd, False

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.broken:
            try:
                view = view[os.write(self.fd, view):]
            except InterruptedError:
                continue
            except OSError:
                self.broken = True


def _kept(lines: List[bytes], continues: bool) -> List[bytes]:
    """The complete ``lines`` (each with its end) to copy; with ``continues`` the first ends a line already written."""
    kept = []
    for i, line in enumerate(lines):
        text = line[:-1].rstrip(b"\r").decode("utf-8", "replace")
        if (continues and i == 0) or not is_startup_note(text):
            kept.append(line)
    return kept


def copy_lines(src: int, dst: int, quiet_s: float = QUIET_S, hold: int = HOLD_BYTES) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, dropping the whole lines that are TensorFlow's start-up notes."""
    out, pending, continues, since = _Out(dst), b"", False, 0.0
    while True:
        if pending and (time.monotonic() - since > HOLD_S or not select.select([src], [], [], quiet_s)[0]):
            out.write(pending)      # a line without its end yet: shown now, its rest later, unjudged
            pending, continues = b"", True
            continue
        try:
            chunk = os.read(src, READ_BYTES)
        except InterruptedError:
            continue
        if not chunk:
            break
        before = pending
        *lines, pending = (pending + chunk).split(b"\n")
        if lines or not before:
            since = time.monotonic()
        lines = [line + b"\n" for line in lines]
        kept = _kept(lines, continues)
        continues = continues and not lines
        if len(pending) > hold:
            kept.append(pending)
            pending, continues = b"", True
        if kept:
            out.write(b"".join(kept))
    out.write(pending)


class NoteFilter:
    """A running filter of one descriptor (see the module doc); :meth:`stop` ends it."""

    def __init__(self, process: subprocess.Popen, fd: int, saved: int):
        self.process, self.fd, self._saved = process, fd, saved

    @property
    def pid(self) -> int:
        """The filter process's id."""
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> Optional[int]:
        """Point the descriptor back where it pointed before and wait up to ``timeout`` seconds for the filter to copy
        what is left and exit; its exit status, or None if a process the worker started still holds the pipe (the
        filter then ends with that process)."""
        if self._saved >= 0:
            _flush_stderr()
            os.dup2(self._saved, self.fd)
            os.close(self._saved)
            self._saved = -1
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def start(fd: int = 2, timeout: float = READY_TIMEOUT_S) -> Optional[NoteFilter]:
    """Send what this process writes to ``fd`` through a new filter process; None (``fd`` unchanged) if the filter
    did not start and say it runs within ``timeout`` seconds."""
    import horovod
    root = os.path.dirname(os.path.dirname(os.path.abspath(horovod.__file__)))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from horovod.runner.note_filter import main; main(sys.argv[2])"
    data_r, data_w = os.pipe()
    ready_r, ready_w = os.pipe()
    saved = os.dup(fd)
    process = None
    try:
        process = subprocess.Popen([sys.executable, "-c", code, root, str(ready_w)], stdin=data_r, stdout=saved,
                                   stderr=saved, pass_fds=(ready_w,), start_new_session=True)
        os.close(ready_w)
        ready_w = -1
        if not select.select([ready_r], [], [], timeout)[0] or os.read(ready_r, 1) != b"1":
            raise OSError("the filter did not start")
    except (OSError, ValueError, subprocess.SubprocessError):
        for end in (data_w, saved, ready_w):
            if end >= 0:
                os.close(end)
        if process is not None:
            process.kill()
            process.wait()
        return None
    finally:
        os.close(data_r)
        os.close(ready_r)
    _flush_stderr()
    os.dup2(data_w, fd)
    os.close(data_w)
    return NoteFilter(process, fd, saved)


def main(ready_fd: str) -> None:
    """The filter process: say it runs on descriptor ``ready_fd``, then copy stdin to stdout (:func:`copy_lines`)."""
    os.write(int(ready_fd), b"1")
    os.close(int(ready_fd))
    copy_lines(0, 1)
