"""The remote end of a host's launch: every worker ``horovodrun`` runs on this host, over one ssh connection.

``python -m horovod.runner.ssh_boot --host-mode`` reads one payload line (the working directory, the grace period and
each worker's rank, command and environment; nothing of it on a command line), starts every worker in a session of
its own, and relays their output and exits as frames on standard output (:mod:`horovod.runner.mux`), from one
thread over one ``select``. Requests on standard input signal one worker's process group; the end of input (the
launcher gone, or stopping the job) stops them all: SIGTERM, then SIGKILL after the grace period. So no worker
outlives its launcher's connection, and a host costs the launcher one ssh client whatever its number of slots.

Standard library, :mod:`.procgroup`, :mod:`.mux`, :mod:`.worker_threads` and :mod:`horovod.common.config` only, like
:mod:`.ssh_boot`.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Sequence

from horovod.common.config import environ_snapshot
from horovod.runner import mux
from horovod.runner.procgroup import forward_signals, signal_group, signal_sessions, start_session
from horovod.runner.worker_threads import thread_defaults

__all__ = ["make_host_payload", "parse_host_payload", "run_host"]

PAYLOAD_VERSION = 1


def make_host_payload(workers: Sequence[Mapping[str, Any]], cwd: str, grace: float) -> bytes:
    """The payload line for one host: ``workers`` holds each worker's ``rank``, ``command`` and ``env``."""
    return json.dumps({"version": PAYLOAD_VERSION, "mode": "host", "cwd": cwd, "grace": grace,
                       "workers": [{"rank": int(w["rank"]), "command": list(w["command"]), "env": dict(w["env"])}
                                   for w in workers]}).encode() + b"\n"


def parse_host_payload(line: bytes) -> Dict[str, Any]:
    """Validate a host payload line.

    Raises:
        ValueError: naming what is wrong.
    """
    if not line.endswith(b"\n"):
        raise ValueError("no complete payload line on standard input (launcher gone, or payload too large)")
    payload = json.loads(line)
    if not isinstance(payload, dict) or payload.get("version") != PAYLOAD_VERSION or payload.get("mode") != "host":
        raise ValueError("payload is not a version-1 host launch request")
    workers, cwd, grace = payload.get("workers"), payload.get("cwd"), payload.get("grace")
    if not isinstance(cwd, str) or not isinstance(grace, (int, float)) or not 0 <= grace <= 3600:
        raise ValueError("payload cwd must be a string and grace a number of seconds")
    if not isinstance(workers, list) or not workers:
        raise ValueError("payload workers must be a non-empty list")
    for worker in workers:
        command, env = worker.get("command") if isinstance(worker, dict) else None, worker.get("env")
        if not isinstance(worker.get("rank"), int) or not isinstance(command, list) or not command \
                or not all(isinstance(a, str) for a in command) or not isinstance(env, dict) \
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("each worker needs an int rank, a non-empty command of strings and a string env")
    return payload


class _Host:
    """The workers of this host, the frames that report them, and the stop that the launcher asks for."""

    def __init__(self, out_fd: int, grace: float):
        self.out_fd = out_fd
        self.grace = grace
        self.children: Dict[int, subprocess.Popen] = {}
        self.open_pipes: Dict[int, int] = {}          # rank -> pipes not yet at end of file
        self.reported: Dict[int, int] = {}
        self.lock = threading.Lock()                  # one writer of frames at a time (main loop, request thread)
        self.selector = selectors.DefaultSelector()
        self.stopping: List[float] = []               # when the stop began (end of input, or a signal to us)
        self.termed = self.killed = False

    def send(self, rank: int, kind: int, payload: bytes) -> None:
        """Write one frame whole (the launcher is gone if it cannot be written: the end of input stops us)."""
        data = mux.frame(rank, kind, payload)
        with self.lock:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.out_fd, view):]
                except BlockingIOError:
                    time.sleep(0.001)
                except OSError:
                    return

    def fail(self, rank: int, code: int, message: str) -> None:
        """Report a worker that could not start."""
        self.send(rank, mux.STDERR, message.encode())
        self.reported[rank] = code
        self.send(rank, mux.EXIT, str(code).encode())

    def start(self, workers: Sequence[Mapping[str, Any]]) -> None:
        """Start every worker in a session of its own, its output read by :meth:`relay`."""
        base = environ_snapshot()
        for worker in workers:
            rank = worker["rank"]
            try:
                env = {**base, **worker["env"]}
                child = start_session(worker["command"], {**env, **thread_defaults(env)})
            except OSError as exc:
                self.fail(rank, 127, f"horovod: cannot start {worker['command'][0]!r} on host "
                                     f"{socket.gethostname()}: {exc.strerror or exc}\n")
                continue
            self.children[rank] = child
            self.open_pipes[rank] = 2
            for kind, pipe in ((mux.STDOUT, child.stdout), (mux.STDERR, child.stderr)):
                os.set_blocking(pipe.fileno(), False)
                self.selector.register(pipe, selectors.EVENT_READ, (rank, kind))

    def serve_requests(self, stdin_fd: int) -> None:
        """Signal workers as the launcher asks, until its input ends (then stop them all)."""
        buffered = b""
        try:
            while True:
                chunk = os.read(stdin_fd, 4096)
                if not chunk:
                    break
                buffered += chunk
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    try:
                        rank, signum = mux.parse_signal_line(line)
                    except ValueError:
                        continue
                    child = self.children.get(rank)
                    if child is not None and rank not in self.reported:
                        signal_group(child.pid, signum)
        except OSError:
            pass
        self.stopping.append(time.monotonic())

    def relay(self, total: int) -> None:
        """Pass output on as it comes and report each exit, stopping the workers when asked, until all ``total``
        are reported."""
        while len(self.reported) < total:
            for key, _ in self.selector.select(0.1):
                rank, kind = key.data
                try:
                    chunk = os.read(key.fileobj.fileno(), mux.MAX_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    self.send(rank, kind, chunk)
                else:
                    self.selector.unregister(key.fileobj)
                    key.fileobj.close()
                    self.open_pipes[rank] -= 1
            waited = self._stop_if_asked()
            # A process that left a worker's group may hold its pipes open: past the kill, exits go unawaited.
            self.report_exits(drained=not (self.killed and waited >= self.grace + 2.0))

    def _stop_if_asked(self) -> float:
        if not self.stopping:
            return 0.0
        waited = time.monotonic() - self.stopping[0]
        if not self.termed:
            self.signal_all(signal.SIGTERM)
            self.termed = True
        if not self.killed and waited >= self.grace:
            self.signal_all(signal.SIGKILL)
            self.killed = True
        return waited

    def report_exits(self, drained: bool = True) -> None:
        """Report each worker that exited; with ``drained``, only once its output pipes are at their end."""
        for rank, child in self.children.items():
            if rank not in self.reported and (self.open_pipes.get(rank, 0) == 0 or not drained) \
                    and child.poll() is not None:
                self.reported[rank] = child.returncode
                self.send(rank, mux.EXIT, str(child.returncode).encode())

    def signal_all(self, sig: int) -> None:
        """Signal every worker still running: each process group of its session (a wrapper's, and any a process
        under it made for itself, as ``timeout`` does), so a stop reaches the worker under any wrapper."""
        signal_sessions([child.pid for rank, child in self.children.items() if rank not in self.reported], sig)


def run_host(stdin_fd: int, out_fd: int, payload_line: bytes) -> int:
    """Start this host's workers from ``payload_line`` and relay them until each has exited; returns 0, or 125 for
    a bad payload."""
    try:
        payload = parse_host_payload(payload_line)
    except ValueError as exc:
        print(f"horovod ssh_boot on {socket.gethostname()}: {exc}", file=sys.stderr, flush=True)
        return 125
    host = _Host(out_fd, float(payload["grace"]))
    try:
        os.chdir(payload["cwd"])
    except OSError as exc:
        for worker in payload["workers"]:
            host.fail(worker["rank"], 126, f"horovod: working directory {payload['cwd']!r} does not exist on host "
                                           f"{socket.gethostname()} ({exc.strerror}); it is carried over from the "
                                           f"launcher\n")
        return 0
    host.start(payload["workers"])
    threading.Thread(target=host.serve_requests, args=(stdin_fd,), daemon=True, name="horovod-host-requests").start()
    with forward_signals(lambda signum: host.stopping.append(time.monotonic()),
                         (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
        host.relay(len(payload["workers"]))
    signal_sessions([child.pid for child in host.children.values()], signal.SIGKILL)   # whatever workers left
    return 0
