"""Supervise a job's workers, however they were started: relay output, fail fast, forward signals, reap.

This is the runner's one implementation of spawn-and-supervise: static jobs (:func:`horovod.runner.pipeline.run_job`),
elastic jobs (:mod:`horovod.runner.elastic.spawner`) and any backend's handles (local processes, ssh clients,
``mpirun``, Ray actors) go through a :class:`Supervisor`. The rules:

* **Fail fast.** The first worker to exit non-zero or by a signal makes :meth:`Supervisor.wait` send SIGTERM to every
  other worker, then SIGKILL after the grace period; that first exit is the job's failure. The SIGTERM waits for the
  settle time first (one keepalive probe interval and a second, 2 s by default): when a host is lost, every
  survivor raises its own ``HorovodInternalError`` within one keepalive probe of the others, and a survivor stopped
  before it could say what it saw leaves the user one report instead of all of them. Workers that end by themselves
  meanwhile end the wait early.
* **Signals.** SIGINT/SIGTERM to the launcher (:meth:`Supervisor.interrupt`, installed by
  :func:`horovod.runner.procgroup.forward_signals`) are forwarded to every worker, which are then killed after the
  grace period; the launcher exits 128+N.
* **Reaping.** Leaving the supervisor (:meth:`Supervisor.close`) SIGKILLs every worker's process group, including
  what lingers after a worker itself exited: no worker outlives the launcher's call.
"""

from __future__ import annotations

import dataclasses
import queue
import signal
import sys
import threading
import time
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Tuple

from horovod.runner.backends.base import WorkerHandle
from horovod.runner.output import OutputSink, relay_lines

__all__ = ["WorkerExit", "JobResult", "Supervisor", "failure_message", "with_launcher_trouble",
           "DEFAULT_GRACE_SECONDS"]

DEFAULT_GRACE_SECONDS = 5.0
DEFAULT_SETTLE_SECONDS = 2.0  # one keepalive probe at the default liveness timeout (1 s), and as much again
_POLL_SECONDS = 0.05  # how often the wait loop looks at a signal flag; worker exits wake it at once
_WAKE = ("", 0, 0)    # on the exits queue: not an exit, only "look now" (see Supervisor.wake)
_READER_JOIN_SECONDS = 2.0  # a grandchild that left the process group may hold a pipe open


@dataclasses.dataclass(frozen=True)
class WorkerExit:
    """How one worker ended: ``returncode`` is negative when a signal killed it, as in :mod:`subprocess`;
    ``ended_at`` is the launcher's wall clock when it saw the exit (0.0: unknown)."""

    rank: int
    hostname: str
    returncode: int
    ended_at: float = dataclasses.field(default=0.0, compare=False)

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
    # The last lines each worker wrote to stderr, by rank (what a failure before hvd.init() left to go on).
    tails: Mapping[Hashable, str] = dataclasses.field(default_factory=dict, compare=False)
    # Why the launcher itself could not serve (its rendezvous store ran out of descriptors), when the job failed.
    launcher_trouble: str = dataclasses.field(default="", compare=False)

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


def with_launcher_trouble(result: JobResult, trouble: Optional[str]) -> JobResult:
    """``result`` carrying ``trouble`` (the launcher's own reason it could not serve, such as
    :attr:`~horovod.common.rendezvous_server.RendezvousServer.exhausted`) when the job failed; else ``result``."""
    if not trouble or result.ok:
        return result
    return dataclasses.replace(result, launcher_trouble=trouble)


def failure_message(failure: WorkerExit, first: bool = True) -> str:
    """Horovod's summary of a failed job, naming the first failed rank (or, ``first`` False, the rank that caused
    the failure), its host and its exit code or signal."""
    code = f"{failure.returncode} (killed by {failure.signal_name})" if failure.signal_name else str(failure.returncode)
    which = "The first process to do so was" if first else "The process that caused it was"
    return ("Horovod detected that one or more processes exited with non-zero status, thus causing the job to be "
            f"terminated. {which}:\n"
            f"Process name: {failure.rank}\nHost: {failure.hostname}\nExit code: {code}\n")


@dataclasses.dataclass
class _Stopping:
    """The state of one :meth:`Supervisor.wait`: what has exited and whether (and until when) others are stopped."""

    deadline: Optional[float]
    exits: Dict[Hashable, WorkerExit] = dataclasses.field(default_factory=dict)
    first_failure: Optional[WorkerExit] = None
    interrupted_by: Optional[int] = None
    timed_out: bool = False
    term_at: Optional[float] = None
    kill_at: Optional[float] = None


def _to_stderr(text: str) -> None:
    """A launcher message on standard error; one that cannot be written (stderr closed) is dropped."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Supervisor:
    """Holds a job's worker handles by key (the rank, or an elastic slot key), relays their output and their exits.

    Use as a context manager: leaving it stops and reaps every worker, whatever happened.

    Args:
        sink: where output lines go, prefixed with the worker's key.
        grace_seconds: time between SIGTERM and SIGKILL when stopping workers.
        log: where launcher messages go (default: stderr).
        settle_seconds: after the first failure, time the other workers get to end by themselves before SIGTERM.
    """

    def __init__(self, sink: OutputSink, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                 log: Optional[Callable[[str], None]] = None, settle_seconds: float = DEFAULT_SETTLE_SECONDS):
        self.sink = sink
        self.grace_seconds = grace_seconds
        self.settle_seconds = settle_seconds
        self._log = log or _to_stderr
        self.handles: Dict[Hashable, WorkerHandle] = {}
        self.hostnames: Dict[Hashable, str] = {}
        self._events: "queue.Queue[Tuple[Hashable, int, int]]" = queue.Queue()
        self._readers: List[threading.Thread] = []
        self._pending_signal: Optional[int] = None

    @property
    def pids(self) -> List[int]:
        """The supervised workers' pids (each also its process group id)."""
        return [h.pid for h in self.handles.values()]

    def add(self, key: Hashable, hostname: str, handle: WorkerHandle) -> None:
        """Supervise ``handle``: relay its output under ``key`` and report its exit through :meth:`exits`."""
        self.handles[key] = handle
        self.hostnames[key] = hostname
        attach, notify = getattr(handle, "attach_output", None), getattr(handle, "notify_exit", None)
        if attach is not None and notify is not None:
            # A worker whose output and exit are pushed (many workers over one channel): no thread of its own.
            attach(lambda stream, text, end: self.sink.write(key, stream, text, end))
            notify(lambda code: self._events.put((key, handle.pid, code)))
            return
        for stream, pipe in (("stdout", handle.stdout), ("stderr", handle.stderr)):
            if pipe is not None:
                reader = threading.Thread(target=relay_lines, args=(self.sink, key, stream, pipe), daemon=True,
                                          name=f"horovod-output-{key}-{stream}")
                reader.start()
                self._readers.append(reader)
        threading.Thread(target=self._await_exit, args=(key, handle), daemon=True,
                         name=f"horovod-wait-{key}").start()

    def _await_exit(self, key: Hashable, handle: WorkerHandle) -> None:
        self._events.put((key, handle.pid, handle.wait()))

    def exits(self, timeout: float) -> List[Tuple[Hashable, int, int]]:
        """``(key, pid, returncode)`` of workers that exited, waiting up to ``timeout`` for the first one (or for a
        :meth:`wake`)."""
        found = []
        try:
            found.append(self._events.get(timeout=timeout))
            while True:
                found.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return [event for event in found if event is not _WAKE]

    def wake(self) -> None:
        """Make a waiting :meth:`exits` return now, with whatever has exited (maybe nothing); thread-safe."""
        self._events.put(_WAKE)

    def send_signal(self, key: Hashable, sig: int) -> None:
        """Send ``sig`` to the worker of ``key`` if it still runs."""
        handle = self.handles.get(key)
        if handle is not None and handle.poll() is None:
            handle.signal(sig)

    def forget(self, key: Hashable, pid: int) -> None:
        """Drop an exited worker (unless ``key`` already holds a newer one) and kill what it left in its group."""
        handle = self.handles.get(key)
        if handle is not None and handle.pid == pid:
            del self.handles[key]
            handle.release()
            handle.signal(signal.SIGKILL)

    def interrupt(self, signum: int) -> None:
        """Ask :meth:`wait` to forward ``signum`` to every worker and stop them; safe in a signal handler."""
        # A plain assignment: a signal handler must not take the locks the wait loop may hold.
        self._pending_signal = signum

    def wait(self, timeout: Optional[float] = None, on_exit: Optional[Callable[[WorkerExit], None]] = None
             ) -> JobResult:
        """Wait for every worker, failing fast; on the first failure, an interrupt or ``timeout``, stop the others.

        Args:
            timeout: seconds after which every worker is stopped (None: no limit); the result then has no failure
                unless a worker failed before.
            on_exit: called with each worker's exit as it happens.

        Returns:
            The :class:`JobResult`; every worker's process group has been killed and its output relayed.
        """
        state = _Stopping(None if timeout is None else time.monotonic() + timeout)
        while len(state.exits) < len(self.handles):
            self._check_stops(state)
            try:
                event = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if event is _WAKE:
                continue
            key, _, returncode = event
            exited = WorkerExit(key, self.hostnames[key], returncode, time.time())
            state.exits[key] = exited
            if on_exit is not None:
                on_exit(exited)
            if returncode != 0 and state.first_failure is None and state.kill_at is None:
                state.first_failure = exited
                # Which rank failed first is the summary's to say, once every report is in: the first to exit
                # is often a survivor of another rank's failure.
                self._log(f"Process {key} exit with status code {returncode}.")
                self._log("Terminating remaining workers; the root cause (which need not be the first process "
                          "to exit) follows once they have ended.")
                state.term_at = time.monotonic() + self.settle_seconds
        self._reap()
        exits = tuple(state.exits[k] for k in sorted(state.exits))
        tail = getattr(self.sink, "tail", None)
        tails = {k: tail(k) for k in state.exits} if tail is not None and state.first_failure is not None else {}
        return JobResult(exits, state.first_failure, state.interrupted_by, state.timed_out, tails)

    def _check_stops(self, state: _Stopping) -> None:
        if self._pending_signal is not None and state.interrupted_by is None:
            state.interrupted_by = self._pending_signal
            self._log(f"horovodrun received {signal.Signals(state.interrupted_by).name}; stopping all workers.")
            self._stop_live(state, state.interrupted_by)
        if state.term_at is not None and state.kill_at is None and time.monotonic() >= state.term_at:
            self._stop_live(state, signal.SIGTERM)
        if state.deadline is not None and state.kill_at is None and time.monotonic() >= state.deadline:
            state.timed_out = True
            self._stop_live(state, signal.SIGTERM)
        if state.kill_at is not None and time.monotonic() >= state.kill_at:
            for key, handle in self.handles.items():
                if key not in state.exits:
                    handle.signal(signal.SIGKILL)

    def _stop_live(self, state: _Stopping, sig: int) -> None:
        for key, handle in self.handles.items():
            if key not in state.exits:
                handle.signal(sig)
        if state.kill_at is None:
            state.kill_at = time.monotonic() + self.grace_seconds

    def _reap(self) -> None:
        for handle in self.handles.values():
            handle.signal(signal.SIGKILL)
            handle.release()
        for handle in self.handles.values():
            handle.wait(timeout=self.grace_seconds)
        end = time.monotonic() + _READER_JOIN_SECONDS
        for reader in self._readers:
            reader.join(max(0.0, end - time.monotonic()))

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Stop every worker still running (``sig``, then SIGKILL after the grace period), reap all, close output."""
        live = [h for h in self.handles.values() if h.poll() is None]
        for handle in live:
            handle.signal(sig)
        deadline = time.monotonic() + self.grace_seconds
        for handle in live:
            handle.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._reap()
        self.sink.close()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
