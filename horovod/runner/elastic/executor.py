"""Start and stop an elastic job's workers one at a time, relaying their output.

The driver decides which slot gets a worker; this module only carries it out. Each worker runs in its own session
(its process group id is its pid), so stopping it signals its whole group and never a process found by name. A host
that is this machine (``localhost``, ``127.x``, this machine's names and addresses) is started locally; other hosts
need ssh launch, which this version does not have.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Dict, List, Mapping, Tuple

from horovod.elastic.protocol import slot_key
from horovod.runner.hosts import SlotInfo, is_local_host
from horovod.runner.launch import RendezvousInfo, worker_env
from horovod.runner.processes import DEFAULT_GRACE_SECONDS, OutputSink, signal_group


class LocalSpawner:
    """Starts workers of slots on this machine; their exits come back through :meth:`exits`.

    Args:
        command: the worker command line.
        rendezvous: the job's rendezvous service.
        base_env: the environment to start from; extra_env: variables for every worker.
        sink: where prefixed output lines go (the prefix is the slot, ``[host:slot]``).
        popen: the process spawner (a parameter so tests can substitute it).
    """

    def __init__(self, command, rendezvous: RendezvousInfo, base_env: Mapping[str, str],
                 extra_env: Mapping[str, str], sink: OutputSink, popen: Callable[..., subprocess.Popen] =
                 subprocess.Popen, grace_seconds: float = DEFAULT_GRACE_SECONDS):
        self.command = list(command)
        self.rendezvous = rendezvous
        self.base_env = dict(base_env)
        self.extra_env = dict(extra_env)
        self.sink = sink
        self.grace_seconds = grace_seconds
        self._popen = popen
        self.procs: Dict[str, subprocess.Popen] = {}
        self._events: "queue.Queue[Tuple[str, int, int]]" = queue.Queue()
        self._readers: List[threading.Thread] = []

    def spawn(self, slot: SlotInfo) -> int:
        """Start the worker of ``slot``; returns its pid.

        Raises:
            OSError: the command cannot be started, or the host is not this machine (no ssh launch yet).
        """
        key = slot_key(slot.hostname, slot.local_rank)
        if not is_local_host(slot.hostname):
            raise OSError(f"host {slot.hostname!r} is not this machine and ssh launch is not available yet")
        env = worker_env(self.base_env, slot, self.rendezvous, self.extra_env)
        env["HOROVOD_ELASTIC"] = "1"
        proc = self._popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, start_new_session=True)
        self.procs[key] = proc
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            reader = threading.Thread(target=self._relay, args=(key, stream, pipe), daemon=True,
                                      name=f"horovod-output-{key}-{stream}")
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._await_exit, args=(key, proc), daemon=True, name=f"horovod-wait-{key}").start()
        return proc.pid

    def _relay(self, key: str, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                self.sink.write(key, stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"))

    def _await_exit(self, key: str, proc: subprocess.Popen) -> None:
        self._events.put((key, proc.pid, proc.wait()))

    def exits(self, timeout: float) -> List[Tuple[str, int, int]]:
        """``(key, pid, returncode)`` of workers that exited, waiting up to ``timeout`` for the first one."""
        found = []
        try:
            found.append(self._events.get(timeout=timeout))
            while True:
                found.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return found

    def send_signal(self, key: str, sig: int) -> None:
        proc = self.procs.get(key)
        if proc is not None and proc.poll() is None:
            signal_group(proc.pid, sig)

    def forget(self, key: str, pid: int) -> None:
        """Drop an exited worker (unless the slot already holds a newer one)."""
        proc = self.procs.get(key)
        if proc is not None and proc.pid == pid:
            del self.procs[key]
        signal_group(pid, signal.SIGKILL)  # whatever the worker left running in its group

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self.procs.values()]

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Stop every worker: ``sig``, then SIGKILL after the grace period; also kills what lingers in their groups."""
        for proc in self.procs.values():
            if proc.poll() is None:
                signal_group(proc.pid, sig)
        deadline = time.monotonic() + self.grace_seconds
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=self.grace_seconds)
            except subprocess.TimeoutExpired:
                pass
        end = time.monotonic() + 2.0
        for reader in self._readers:
            reader.join(max(0.0, end - time.monotonic()))
        self.sink.close()


__all__ = ["LocalSpawner"]
