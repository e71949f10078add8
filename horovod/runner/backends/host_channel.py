"""The launcher's end of a host channel: one ssh client runs every worker of a remote host (:mod:`..ssh_host`).

:class:`HostChannel` owns the ssh client and one thread that reads its frames (:mod:`horovod.runner.mux`); each
worker is a :class:`RemoteWorker` handle, which the supervisor drives like any other, except that its output and
its exit are pushed to it (:meth:`RemoteWorker.attach_output`, :meth:`RemoteWorker.notify_exit`) instead of read
from pipes of its own: ``horovodrun``'s threads and descriptors grow with the hosts, not the ranks. The ssh
client's own messages (a refused login, a lost connection) go to the host's first worker's standard error; when
the connection ends, every worker not yet reported gets the ssh client's exit status.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Callable, Dict, List, Optional

from horovod.runner import mux
from horovod.runner.output import PieceSplitter, relay_pieces
from horovod.runner.procgroup import release_session, signal_group

__all__ = ["HostChannel", "RemoteWorker", "CLOSE_SECONDS"]

CLOSE_SECONDS = 5.0     # how long a closed channel's ssh client may take to end by itself
_STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP)

Deliver = Callable[[str, str, str], None]     # (stream, text, end): see horovod.runner.output.PieceSplitter


class HostChannel:
    """One remote host's ssh client, carrying the workers of ``ranks`` (it was started with ``--host-mode`` and has
    been sent the payload)."""

    def __init__(self, proc: subprocess.Popen, ranks: List[int]):
        self.proc = proc
        self.ranks = list(ranks)
        self.exits: Dict[int, int] = {}
        self._deliver: Dict[int, Deliver] = {}
        self._held: Dict[int, List] = {rank: [] for rank in ranks}     # output before the supervisor attached
        self._splitters: Dict[tuple, PieceSplitter] = {}     # per (rank, stream): what a piece holds is bounded
        self._on_exit: Dict[int, Callable[[int], None]] = {}
        self._released: set = set()
        self._stopped: set = set()                     # ranks asked to stop (SIGTERM, SIGINT, SIGKILL...)
        self._lock = threading.Condition()
        self._write_lock = threading.Lock()
        self.workers = {rank: RemoteWorker(self, rank) for rank in ranks}
        for target, name in ((self._read_frames, "frames"), (self._read_ssh_errors, "ssh-stderr")):
            threading.Thread(target=target, daemon=True, name=f"horovod-host-{name}-{proc.pid}").start()

    # -- output and exits ----------------------------------------------------------------------------------------

    def attach(self, rank: int, deliver: Deliver) -> None:
        """Deliver ``rank``'s output pieces to ``deliver`` from now on, first those held until now."""
        with self._lock:
            self._deliver[rank] = deliver
            held, self._held[rank] = self._held.get(rank, []), []
        for stream, text, end in held:
            deliver(stream, text, end)

    def _emit(self, rank: int, stream: str, text: str, end: str = "\n") -> None:
        with self._lock:
            deliver = self._deliver.get(rank)
            if deliver is None:
                self._held.setdefault(rank, []).append((stream, text, end))
                return
        deliver(stream, text, end)

    def _chunk(self, rank: int, stream: str, data: bytes) -> None:
        splitter = self._splitters.setdefault((rank, stream), PieceSplitter())
        for text, end in splitter.feed(data):
            self._emit(rank, stream, text, end)

    def _flush(self, rank: int) -> None:
        for stream in ("stdout", "stderr"):
            splitter = self._splitters.pop((rank, stream), None)
            for text, end in splitter.finish() if splitter is not None else ():
                self._emit(rank, stream, text, end)

    def _exited(self, rank: int, code: int) -> None:
        self._flush(rank)
        with self._lock:
            if rank in self.exits:
                return
            self.exits[rank] = code
            callback = self._on_exit.get(rank)
            self._lock.notify_all()
        if callback is not None:
            callback(code)

    def _read_frames(self) -> None:
        reader = mux.FrameReader()
        stream = self.proc.stdout
        try:
            while True:
                chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
                if not chunk:
                    break
                for rank, kind, payload in reader.feed(chunk):
                    if rank not in self.workers:
                        continue
                    if kind == mux.EXIT:
                        self._exited(rank, int(payload or b"1"))
                    else:
                        self._chunk(rank, "stdout" if kind == mux.STDOUT else "stderr", payload)
        except (OSError, ValueError) as exc:
            self._emit(self.ranks[0], "stderr", f"horovodrun: the channel to this host failed: {exc}")
        code = self.proc.wait()
        release_session(self.proc.pid)      # whatever the ssh client left behind (a ProxyCommand)
        # The connection ended (ssh failed or the host went away): the workers not reported end with ssh's status.
        for rank in self.ranks:
            if rank not in self.exits:
                self._exited(rank, code if code != 0 else 255)

    def _read_ssh_errors(self) -> None:
        relay_pieces(self.proc.stderr, lambda text, end: self._emit(self.ranks[0], "stderr", text, end))

    # -- control -------------------------------------------------------------------------------------------------

    def notify(self, rank: int, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` once ``rank`` exited (at once if it has)."""
        with self._lock:
            self._on_exit[rank] = callback
            code = self.exits.get(rank)
        if code is not None:
            callback(code)

    def wait(self, rank: int, timeout: Optional[float]) -> Optional[int]:
        """``rank``'s exit status once it exited, waiting up to ``timeout`` seconds; None if it still runs."""
        with self._lock:
            self._lock.wait_for(lambda: rank in self.exits, timeout)
            return self.exits.get(rank)

    def signal(self, rank: int, sig: int) -> None:
        """Have the remote end signal one worker; once every running worker of the host is being stopped, the ssh
        client itself gets the signal, as a single worker's did: the remote end stops the workers when the
        connection ends, and a host cut off ends here at once instead of when ssh gives up on it."""
        if rank in self.exits:
            return
        with self._write_lock:
            try:
                self.proc.stdin.write(mux.signal_line(rank, sig))
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass    # the connection is gone: the remote end stops its workers by itself
        if sig in _STOPPING:
            with self._lock:
                self._stopped.add(rank)
                everyone = all(r in self._stopped or r in self.exits for r in self.ranks)
            if everyone and self.proc.poll() is None:
                signal_group(self.proc.pid, sig)

    def release(self, rank: int) -> None:
        """Once every worker of the host is released, the channel closes (the remote end stops what is left, then
        exits) and the ssh client is killed if it still runs :data:`CLOSE_SECONDS` later (a host cut off)."""
        with self._lock:
            # Releasing is idempotent: the supervisor releases a worker when it reaps and again when it closes, and
            # only the first release that completes the host closes the channel (one timer per host, not per call).
            first = rank not in self._released
            self._released.add(rank)
            last = first and len(self._released) == len(self.ranks)
        if last:
            with self._write_lock:
                try:
                    self.proc.stdin.close()
                except (OSError, ValueError):
                    pass
            if self.proc.poll() is None:
                timer = threading.Timer(CLOSE_SECONDS, self._kill_client)
                timer.daemon = True
                timer.start()

    def _kill_client(self) -> None:
        if self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)


class RemoteWorker:
    """One worker of a :class:`HostChannel`, as a :class:`~horovod.runner.backends.base.WorkerHandle`."""

    stdout = None
    stderr = None

    def __init__(self, channel: HostChannel, rank: int):
        self.channel = channel
        self.rank = rank

    @property
    def pid(self) -> int:
        """The host's ssh client (shared by the host's workers)."""
        return self.channel.proc.pid

    def attach_output(self, deliver: Deliver) -> None:
        """Have the worker's output delivered as ``deliver(stream, text, end)`` pieces
        (:class:`~horovod.runner.output.PieceSplitter`), from the channel's thread."""
        self.channel.attach(self.rank, deliver)

    def notify_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` once the worker exited (at once if it has)."""
        self.channel.notify(self.rank, callback)

    def poll(self) -> Optional[int]:
        """The exit status if it has ended (negative: killed by that signal), else None."""
        return self.channel.exits.get(self.rank)

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait up to ``timeout`` seconds (None: for ever); the exit status, or None if it still runs."""
        return self.channel.wait(self.rank, timeout)

    def signal(self, sig: int) -> None:
        """Have the remote end send ``sig`` to the worker's process group."""
        self.channel.signal(self.rank, sig)

    def release(self) -> None:
        """Let go of the worker; the last one of the host closes the channel."""
        self.channel.release(self.rank)
