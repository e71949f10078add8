"""Run a job's worker processes: start them, relay their output, stop them all when one fails.

Each worker runs in its own session, so its process group id is its pid: stopping a worker signals its whole group
(the worker and anything it started), never a process found by name. Fail fast: the first worker to exit non-zero or
by a signal makes the group send SIGTERM to every other worker, then SIGKILL after a grace period.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

DEFAULT_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.05  # how often the wait loop looks at a signal flag; child exits wake it at once


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What to start for one rank."""

    rank: int
    hostname: str
    command: Tuple[str, ...]
    env: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class WorkerExit:
    """How one worker ended: ``returncode`` is negative when a signal killed it, as in :mod:`subprocess`."""

    rank: int
    hostname: str
    returncode: int

    @property
    def signal_name(self) -> Optional[str]:
        """``SIGKILL`` when a signal ended the worker, else None."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """``exit code 17`` or ``signal SIGKILL``."""
        return f"signal {self.signal_name}" if self.signal_name else f"exit code {self.returncode}"


@dataclasses.dataclass(frozen=True)
class JobResult:
    """The outcome of a job: every worker's exit, the first failure, and the signal that interrupted the launcher."""

    exits: Tuple[WorkerExit, ...]
    first_failure: Optional[WorkerExit] = None
    interrupted_by: Optional[int] = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Every worker exited 0, and nothing stopped the job."""
        return self.first_failure is None and self.interrupted_by is None and not self.timed_out

    @property
    def exit_code(self) -> int:
        """The launcher's exit status: 0, 1 on a failure or timeout, 128+N when interrupted by signal N."""
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return 0 if self.ok else 1


def failure_message(failure: WorkerExit) -> str:
    """Horovod's summary of a failed job, naming the first failed rank, its host and its exit code or signal."""
    code = f"{failure.returncode} (killed by {failure.signal_name})" if failure.signal_name else str(failure.returncode)
    return ("Horovod detected that one or more processes exited with non-zero status, thus causing the job to be "
            "terminated. The first process to do so was:\n"
            f"Process name: {failure.rank}\nHost: {failure.hostname}\nExit code: {code}\n")


class OutputSink:
    """Writes workers' output lines, prefixed ``[rank]<stdout>:``, whole lines under one lock so none interleave.

    With ``output_dir``, each rank's raw lines also go to ``output_dir/rank.N/stdout`` and ``stderr``.
    """

    def __init__(self, size: int, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 output_dir: Optional[str] = None, timestamp: bool = False):
        self._stdout = stdout
        self._stderr = stderr
        self._timestamp = timestamp
        self._lock = threading.Lock()
        self._files: Dict[Tuple[int, str], IO[str]] = {}
        if output_dir:
            width = len(str(max(size - 1, 0)))
            for rank in range(size):
                directory = os.path.join(output_dir, f"rank.{rank:0{width}d}")
                os.makedirs(directory, exist_ok=True)
                for stream in ("stdout", "stderr"):
                    self._files[(rank, stream)] = open(os.path.join(directory, stream), "w", encoding="utf-8")

    def write(self, rank: int, stream: str, line: str) -> None:
        """Write one line (without its newline) of ``rank``'s ``stream`` ("stdout" or "stderr")."""
        prefix = f"[{rank}]<{stream}>:"
        if self._timestamp:
            prefix = f"{datetime.datetime.now().strftime('%a %b %d %H:%M:%S %Y')}[{rank}]<{stream}>:"
        target = (self._stdout or sys.stdout) if stream == "stdout" else (self._stderr or sys.stderr)
        with self._lock:
            target.write(f"{prefix}{line}\n")
            target.flush()
            handle = self._files.get((rank, stream))
            if handle is not None:
                handle.write(line + "\n")
                handle.flush()

    def close(self) -> None:
        """Close the per-rank output files."""
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid``; a group that is already gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerGroup:
    """Starts a job's workers, relays their output and waits for them with fail-fast semantics.

    Use as a context manager: leaving it kills every worker's process group, whatever happened.

    Args:
        specs: one spec per rank.
        sink: where output lines go.
        grace_seconds: time between SIGTERM and SIGKILL when stopping workers.
        popen: the process spawner (a parameter so tests can substitute it).
        log: where launcher messages go (default: stderr).
    """

    def __init__(self, specs: Sequence[WorkerSpec], sink: OutputSink, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 popen: Callable[..., subprocess.Popen] = subprocess.Popen,
                 log: Optional[Callable[[str], None]] = None):
        self.specs = list(specs)
        self.sink = sink
        self.grace_seconds = grace_seconds
        self._popen = popen
        self._log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.procs: Dict[int, subprocess.Popen] = {}
        self._events: "queue.Queue[Tuple[int, int]]" = queue.Queue()
        self._readers: List[threading.Thread] = []
        self._pending_signal: Optional[int] = None

    @property
    def pids(self) -> List[int]:
        """The started workers' pids (each also its process group id)."""
        return [p.pid for p in self.procs.values()]

    def start(self) -> None:
        """Start every worker in its own session, with reader threads on its pipes and a thread awaiting its exit."""
        for spec in self.specs:
            proc = self._popen(list(spec.command), env=dict(spec.env), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            self.procs[spec.rank] = proc
            for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                reader = threading.Thread(target=self._relay, args=(spec.rank, stream, pipe), daemon=True,
                                          name=f"horovod-output-{spec.rank}-{stream}")
                reader.start()
                self._readers.append(reader)
            threading.Thread(target=self._await_exit, args=(spec.rank, proc), daemon=True,
                             name=f"horovod-wait-{spec.rank}").start()

    def _relay(self, rank: int, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                self.sink.write(rank, stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"))

    def _await_exit(self, rank: int, proc: subprocess.Popen) -> None:
        self._events.put((rank, proc.wait()))

    def interrupt(self, signum: int) -> None:
        """Ask :meth:`wait` to forward ``signum`` to every worker and stop them; safe in a signal handler."""
        # A plain assignment: a signal handler must not take the locks the wait loop may hold.
        self._pending_signal = signum

    def wait(self, timeout: Optional[float] = None, on_exit: Optional[Callable[[WorkerExit], None]] = None
             ) -> JobResult:
        """Wait for every worker; on the first failure or an interrupt, stop the others.

        Args:
            timeout: seconds after which every worker is stopped (None: no limit); the result then has no failure
                unless a worker failed before.
            on_exit: called with each worker's exit as it happens.

        Returns:
            The :class:`JobResult`.
        """
        hostnames = {spec.rank: spec.hostname for spec in self.specs}
        exits: Dict[int, WorkerExit] = {}
        first_failure: Optional[WorkerExit] = None
        interrupted_by: Optional[int] = None
        timed_out = False
        deadline = None if timeout is None else time.monotonic() + timeout
        kill_at: Optional[float] = None
        while len(exits) < len(self.procs):
            if self._pending_signal is not None and interrupted_by is None:
                interrupted_by = self._pending_signal
                self._log(f"horovodrun received {signal.Signals(interrupted_by).name}; stopping all workers.")
                kill_at = self._stop_live(exits, interrupted_by, kill_at)
            if deadline is not None and kill_at is None and time.monotonic() >= deadline:
                timed_out = True
                kill_at = self._stop_live(exits, signal.SIGTERM, kill_at)
            if kill_at is not None and time.monotonic() >= kill_at:
                for rank, proc in self.procs.items():
                    if rank not in exits:
                        signal_group(proc.pid, signal.SIGKILL)
            try:
                rank, returncode = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            exited = WorkerExit(rank, hostnames[rank], returncode)
            exits[rank] = exited
            if on_exit is not None:
                on_exit(exited)
            if returncode != 0 and first_failure is None and kill_at is None:
                first_failure = exited
                self._log(f"Process {rank} exit with status code {returncode}.")
                self._log(f"Terminating remaining workers after failure of Process {rank}.")
                kill_at = self._stop_live(exits, signal.SIGTERM, kill_at)
        self.kill_all()
        self._join_readers()
        return JobResult(tuple(exits[r] for r in sorted(exits)), first_failure, interrupted_by, timed_out)

    def _stop_live(self, exits: Mapping[int, WorkerExit], sig: int, kill_at: Optional[float]) -> float:
        for rank, proc in self.procs.items():
            if rank not in exits:
                signal_group(proc.pid, sig)
        return kill_at if kill_at is not None else time.monotonic() + self.grace_seconds

    def kill_all(self) -> None:
        """SIGKILL every worker's process group, including what lingers after a worker itself has exited."""
        for proc in self.procs.values():
            signal_group(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=self.grace_seconds)
            except subprocess.TimeoutExpired:
                pass

    def _join_readers(self) -> None:
        # A grandchild that left the process group may hold a pipe open; do not wait on it forever.
        end = time.monotonic() + 2.0
        for reader in self._readers:
            reader.join(max(0.0, end - time.monotonic()))

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.kill_all()
        self.sink.close()


__all__ = ["WorkerSpec", "WorkerExit", "JobResult", "OutputSink", "WorkerGroup", "failure_message", "signal_group",
           "DEFAULT_GRACE_SECONDS"]
