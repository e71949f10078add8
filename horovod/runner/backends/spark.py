"""The Spark backend: workers started by agents that run inside Spark tasks.

Each Spark task of a ``horovod.spark`` job runs an agent (:mod:`horovod.spark.task`). The agent dials the driver's
:class:`AgentServer`, both ends prove they know the job secret (:func:`horovod.common.wire.handshake`), and the
agent says where it runs. :class:`SparkBackend` then hands each planned worker (a
:class:`~horovod.runner.backends.base.WorkerLaunch`) to an agent: the agent starts the command as its own child, in a
session of its own that dies with the agent, streams the worker's output back and reports its exit. A
:class:`SparkWorkerHandle` is that remote worker as the :class:`~horovod.runner.supervisor.Supervisor` drives it.

The agent's connection is its liveness: when Spark's Python worker that runs an agent dies (an executor lost, a
process killed), its connection closes and its worker counts as killed by SIGKILL, at once.

The messages are the typed records of :mod:`horovod.runner.backends.spark_link`, which travel as plain tuples and
are checked field by field where they arrive: an agent whose message is malformed is dropped as lost, with a warning
that names the field. This module does not import pyspark.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.runner.backends import spark_link
from horovod.runner.backends.base import WorkerHandle, WorkerLaunch, start_each
from horovod.runner.backends.spark_link import DONE, Exit, Hello, Launch, Out, Signal, StartError, Started

__all__ = ["AGENT_PURPOSE", "AgentInfo", "Agent", "AgentServer", "SparkWorkerHandle", "SparkBackend"]

AGENT_PURPOSE = 0x5350524B  # "SPRK": the handshake purpose of agent connections
_DRIVER_ID = -1             # the driver's "rank" in the handshake
_LOST = -signal.SIGKILL     # a worker whose agent vanished counts as killed
log = logging.getLogger("horovod")
_AFTER_HELLO = (Started, StartError, Out, Exit)     # what an agent may say once it said hello


@dataclasses.dataclass(frozen=True)
class AgentInfo:
    """Where an agent runs: its Spark partition and attempt, host, process id and Python interpreter.

    ``host`` is the identity its workers get as ``HOROVOD_HOSTNAME`` (ranks with one host share memory).
    """

    index: int
    attempt: int
    host: str
    pid: int
    python: str


class SparkWorkerHandle:
    """A worker started by an agent (see :class:`~horovod.runner.backends.base.WorkerHandle`).

    Its output arrives over the agent's connection and is written into local pipes, so :attr:`stdout` and
    :attr:`stderr` read like a local process's.
    """

    def __init__(self, agent: "Agent"):
        self.agent = agent
        self.pid = agent.info.pid
        self._pipes: Dict[str, Tuple[IO[bytes], int]] = {}
        for stream in ("stdout", "stderr"):
            read_fd, write_fd = os.pipe()
            self._pipes[stream] = (os.fdopen(read_fd, "rb"), write_fd)
        self._started = threading.Event()
        self._ended = threading.Event()
        self._start_error: Optional[str] = None
        self.returncode: Optional[int] = None
        self._lock = threading.Lock()

    @property
    def stdout(self) -> IO[bytes]:
        """The worker's standard output, line by line."""
        return self._pipes["stdout"][0]

    @property
    def stderr(self) -> IO[bytes]:
        """The worker's standard error, line by line."""
        return self._pipes["stderr"][0]

    def poll(self) -> Optional[int]:
        """The exit status if the worker has ended (``-9`` when its agent vanished), else None."""
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait up to ``timeout`` seconds (None: until it ends); the exit status, or None if it still runs."""
        self._ended.wait(timeout)
        return self.returncode

    def signal(self, sig: int) -> None:
        """Ask the agent to send ``sig`` to the worker's process group (nothing if it has ended)."""
        if self.returncode is None:
            self.agent.send(Signal(int(sig)))

    def release(self) -> None:
        """Tell the agent its work is over: it ends its Spark task."""
        self.agent.send(DONE)

    # -- fed by the agent's connection -----------------------------------------------------------------------------

    def _on_started(self, pid: int) -> None:
        self.pid = pid
        self._started.set()

    def _on_error(self, text: str) -> None:
        self._start_error = text
        self._started.set()
        self._finish(127)

    def _on_output(self, stream: str, data: bytes) -> None:
        pipe = self._pipes.get(stream)
        if pipe is not None and data:
            try:
                os.write(pipe[1], data)
            except OSError:  # the reader went away; the output has nowhere to go
                pass

    def _finish(self, code: int) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            for _, write_fd in self._pipes.values():
                os.close(write_fd)
            self.returncode = code
        self._started.set()
        self._ended.set()

    def _await_start(self, timeout: float) -> None:
        if not self._started.wait(timeout):
            raise OSError(f"agent {self.agent.info.index} on {self.agent.info.host} did not start its worker within "
                          f"{timeout:g}s")
        if self._start_error is not None:
            raise OSError(f"agent {self.agent.info.index} on {self.agent.info.host} cannot start the worker: "
                          f"{self._start_error}")
        if self.returncode == _LOST and self.pid == self.agent.info.pid:
            raise OSError(f"agent {self.agent.info.index} on {self.agent.info.host} was lost")


class Agent:
    """One connected agent: its :class:`AgentInfo`, its connection and the worker it runs (at most one)."""

    def __init__(self, info: AgentInfo, sock: socket.socket):
        self.info = info
        self.sock = sock
        self.worker: Optional[SparkWorkerHandle] = None
        self.lost = False
        self._send_lock = threading.Lock()

    def send(self, message: spark_link.Message) -> None:
        """Send one message; a vanished agent is ignored (its loss is reported by the reader)."""
        with self._send_lock:
            if self.lost:
                return
            try:
                wire.send_frame(self.sock, wire.encode(message.to_wire()))
            except OSError:
                pass

    def launch(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> SparkWorkerHandle:
        """Start ``argv`` with ``env`` (over the agent's own environment) as this agent's worker.

        Raises:
            OSError: the agent already ran a worker, is gone, cannot start the command or does not answer in time.
        """
        if self.worker is not None:
            raise OSError(f"agent {self.info.index} on {self.info.host} already ran a worker")
        if self.lost:
            raise OSError(f"agent {self.info.index} on {self.info.host} was lost")
        self.worker = SparkWorkerHandle(self)
        self.send(Launch(tuple(argv), dict(env)))
        self.worker._await_start(timeout)
        return self.worker

    def _dispatch(self, message: spark_link.Message) -> None:
        worker, kind = self.worker, type(message)
        if worker is None:
            return
        if kind is Started:
            worker._on_started(message.pid)
        elif kind is StartError:
            worker._on_error(message.text)
        elif kind is Out:
            worker._on_output(message.stream, message.data)
        elif kind is Exit:
            worker._finish(message.code)

    def _on_lost(self) -> None:
        with self._send_lock:
            self.lost = True
        if self.worker is not None:
            self.worker._finish(_LOST)
        try:
            self.sock.close()
        except OSError:
            pass


class AgentServer:
    """The driver's end: accepts agents, keeps them by partition index, reports arrivals and losses.

    Args:
        secret: the job secret agents must prove.
        host: the address to listen on (one the executors reach: ``spark.driver.host``).
        handshake_timeout: seconds a new connection has to authenticate and say hello.
    """

    def __init__(self, secret: bytes, host: str = "127.0.0.1", handshake_timeout: float = 30.0):
        self.secret = secret
        self.host = host
        self.handshake_timeout = handshake_timeout
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._agents: Dict[int, Agent] = {}
        self._history: List[AgentInfo] = []
        self._changed = threading.Condition()
        self._closed = False
        self._accepter = threading.Thread(target=self._accept_loop, daemon=True, name="horovod-spark-agents")
        self._accepter.start()

    def agents(self) -> List[Agent]:
        """The connected agents, by partition index."""
        with self._changed:
            return [self._agents[i] for i in sorted(self._agents) if not self._agents[i].lost]

    @property
    def history(self) -> List[AgentInfo]:
        """Every agent that ever said hello, in order (tests read the Python workers' pids from it)."""
        with self._changed:
            return list(self._history)

    def wait_for(self, predicate: Callable[[List[Agent]], bool], timeout: float) -> bool:
        """Wait until ``predicate(agents())`` holds (re-checked on every arrival and loss); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.agents()):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._changed.wait(left)
            return True

    def agent_for_host(self, host: str) -> Agent:
        """The connected agent with host identity ``host`` and no worker yet.

        Raises:
            OSError: there is none.
        """
        for agent in self.agents():
            if agent.info.host == host and agent.worker is None:
                return agent
        raise OSError(f"no idle Spark task on host {host!r}")

    def close(self) -> None:
        """Tell every agent to end, stop listening and close every connection."""
        with self._changed:
            self._closed = True
            agents = list(self._agents.values())
            self._changed.notify_all()
        for agent in agents:
            agent.send(DONE)
        try:
            self._listener.close()
        except OSError:
            pass
        for agent in agents:
            try:
                agent.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True, name="horovod-spark-agent").start()

    def _hello(self, sock: socket.socket) -> AgentInfo:
        sock.settimeout(self.handshake_timeout)
        wire.handshake(sock, self.secret, _DRIVER_ID, AGENT_PURPOSE, dialer=False)
        hello = spark_link.decode(wire.decode(wire.recv_frame(sock)), Hello)
        sock.settimeout(None)
        return AgentInfo(hello.index, hello.attempt, hello.host, hello.pid, hello.python)

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            info = self._hello(sock)
        except (OSError, HorovodInternalError):
            sock.close()
            return
        except ValueError as exc:
            log.warning("a Spark agent's first message is malformed; its connection is closed: %s", exc)
            sock.close()
            return
        agent = Agent(info, sock)
        with self._changed:
            if self._closed:
                sock.close()
                return
            old = self._agents.get(info.index)
            self._agents[info.index] = agent
            self._history.append(info)
            self._changed.notify_all()
        if old is not None:
            old._on_lost()
        try:
            while True:
                agent._dispatch(spark_link.decode(wire.decode(wire.recv_frame(sock)), *_AFTER_HELLO))
        except (OSError, HorovodInternalError):
            pass
        except ValueError as exc:
            log.warning("Spark agent %d on %s sent a malformed message; it counts as lost: %s", info.index, info.host,
                        exc)
        agent._on_lost()
        with self._changed:
            if self._agents.get(info.index) is agent:
                del self._agents[info.index]
            self._changed.notify_all()


class SparkBackend:
    """Starts planned workers through agents (see :class:`~horovod.runner.backends.base.Backend`).

    Args:
        place: the agent that runs a given launch (by rank for a static job, by host for an elastic one).
        executable: the workers' Python; None: each agent's own interpreter replaces the command's first word.
        start_timeout: seconds an agent has to confirm that its worker started.
    """

    name = "spark"

    def __init__(self, place: Callable[[WorkerLaunch], Agent], executable: Optional[str] = None,
                 start_timeout: float = 30.0):
        self.place = place
        self.executable = executable
        self.start_timeout = start_timeout

    def start(self, launches: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        """Hand each launch to its agent; see :meth:`horovod.runner.backends.base.Backend.start`."""

        def start_one(launch: WorkerLaunch) -> SparkWorkerHandle:
            agent = self.place(launch)
            argv = (self.executable or agent.info.python, *launch.command[1:])
            return agent.launch(argv, launch.env, self.start_timeout)

        return start_each(launches, start_one)
