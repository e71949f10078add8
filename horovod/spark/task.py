"""The agent that runs inside each Spark task of a ``horovod.spark`` job.

It dials the driver (:class:`horovod.runner.backends.spark.AgentServer`), authenticates with the job secret, says
where it runs, then carries out the driver's orders: start the worker command (a session of its own started as the
runner starts every worker, :func:`horovod.runner.procgroup.start_session`: the kernel kills it if the agent dies,
``PR_SET_PDEATHSIG``, and the agent's guardian ends what is left of it), forward signals to it, stream its output, report its exit, and
end when told ``done`` or when the driver's connection closes. Nothing of the worker outlives the agent's task.

The agent runs in Spark's Python worker, in the task's main thread; the worker process is started from that thread,
which lives as long as the agent (the parent-death signal follows the thread that forked).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from typing import IO, Dict, Iterator, List, Mapping, Optional, Sequence

from pyspark import BarrierTaskContext, TaskContext

from horovod.common import config
from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.runner.backends import spark_link
from horovod.runner.backends.spark import AGENT_PURPOSE
from horovod.runner.backends.spark_link import Done, Exit, Hello, Launch, Out, Signal, StartError, Started
from horovod.runner.pipeline import without_launcher_vars
from horovod.runner.procgroup import release_session, signal_group, start_session

__all__ = ["AgentSpec", "run_agent", "barrier_agent", "elastic_agent", "merge_env"]

_CHUNK = 64 * 1024


class AgentSpec:
    """What every agent of a job needs (pickled into the Spark job's closure): the driver's address and the secret.

    ``elastic``: each attempt of a task is a host of its own (``<host>-spark<index>.<attempt>``), and a task whose
    worker failed fails too, so that Spark starts a fresh attempt the elastic driver can use.
    """

    def __init__(self, addr: str, port: int, secret: bytes, elastic: bool = False, timeout: float = 600.0):
        self.addr = addr
        self.port = port
        self.secret = secret
        self.elastic = elastic
        self.timeout = timeout


def merge_env(own: Mapping[str, str], planned: Mapping[str, str]) -> Dict[str, str]:
    """The worker's environment: the task's own without launcher-decided variables, then the planned ones.

    ``PYTHONPATH`` is joined (the planned entries first), so the worker imports what the driver and the task can.
    """
    env = without_launcher_vars(own)
    env.update(planned)
    paths = [p for p in (planned.get("PYTHONPATH"), own.get("PYTHONPATH")) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


class _Link:
    """The agent's connection to the driver; sends from several threads under one lock."""

    def __init__(self, spec: AgentSpec, index: int):
        self.sock = socket.create_connection((spec.addr, spec.port), timeout=spec.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.handshake(self.sock, spec.secret, index, AGENT_PURPOSE, dialer=True)
        self.sock.settimeout(None)
        self._lock = threading.Lock()

    def send(self, message: spark_link.Message) -> None:
        with self._lock:
            try:
                wire.send_frame(self.sock, wire.encode(message.to_wire()))
            except OSError:  # the driver is gone; the command loop sees it too
                pass

    def recv(self) -> Optional[spark_link.Message]:
        """The driver's next order, checked; None when the connection is gone.

        Raises:
            HorovodInternalError: the driver's message is malformed (it names the kind and the field).
        """
        try:
            raw = wire.decode(wire.recv_frame(self.sock))
        except (OSError, HorovodInternalError):
            return None
        try:
            return spark_link.decode(raw, *spark_link.FROM_DRIVER)
        except ValueError as exc:
            raise HorovodInternalError(f"the Spark driver sent this agent a malformed message: {exc}") from None


class _Worker:
    """The worker process and the threads that stream its output and report its exit."""

    def __init__(self, link: _Link, argv: Sequence[str], env: Mapping[str, str]):
        self.link = link
        self.proc = start_session(argv, env)   # its own session, dies with the agent, nothing of it outlives it
        self.relays: List[threading.Thread] = [
            threading.Thread(target=self._relay, args=(name, pipe), daemon=True)
            for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))]
        for relay in self.relays:
            relay.start()
        self.waiter = threading.Thread(target=self._report_exit, daemon=True)
        self.waiter.start()

    def _relay(self, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            while True:
                data = pipe.read1(_CHUNK)
                if not data:
                    return
                self.link.send(Out(stream, data))

    def _report_exit(self) -> None:
        code = self.proc.wait()
        for relay in self.relays:
            relay.join(2.0)
        self.link.send(Exit(code))

    def stop(self) -> Optional[int]:
        """Kill whatever is left of the worker's process group; its exit status."""
        signal_group(self.proc.pid, signal.SIGKILL)
        code = self.proc.wait()
        release_session(self.proc.pid)     # and the groups its members made
        self.waiter.join(3.0)
        return code


def _command_loop(link: _Link) -> Optional[int]:
    worker: Optional[_Worker] = None
    try:
        while True:
            message = link.recv()
            if message is None or type(message) is Done:
                break
            if type(message) is Launch and worker is None:
                try:
                    worker = _Worker(link, message.argv, merge_env(config.environ_snapshot(), message.env))
                except OSError as exc:
                    link.send(StartError(f"{message.argv[0]}: {exc}"))
                    continue
                link.send(Started(worker.proc.pid))
            elif type(message) is Signal and worker is not None:
                signal_group(worker.proc.pid, message.sig)
    finally:
        code = worker.stop() if worker is not None else None
    return code


def run_agent(spec: AgentSpec, index: int, attempt: int, host: str) -> Optional[int]:
    """Serve the driver as the agent of Spark partition ``index``; returns the worker's exit status (None: none ran).

    Raises:
        RuntimeError: an elastic agent's worker failed (so Spark retries the task as a fresh host).
        OSError: the driver cannot be reached or authenticated.
        HorovodInternalError: the driver sent a malformed message (the worker is stopped first).
    """
    link = _Link(spec, index)
    try:
        link.send(Hello(index, attempt, host, os.getpid(), sys.executable))
        code = _command_loop(link)
    finally:
        link.sock.close()
    if spec.elastic and code not in (None, 0):
        raise RuntimeError(f"the Horovod worker of Spark task {index} (attempt {attempt}) on {host} ended with "
                           f"status {code}; failing the task so that Spark starts a fresh one")
    return code


def barrier_agent(spec: AgentSpec):
    """The ``mapPartitions`` function of a static job's barrier stage: one agent per task, placed on the host that
    Spark reports for the task."""

    def agent(_: Iterator) -> Iterator:
        context = BarrierTaskContext.get()
        index = context.partitionId()
        host = context.getTaskInfos()[index].address.rsplit(":", 1)[0]
        yield index, run_agent(spec, index, context.attemptNumber(), host)

    return agent


def elastic_agent(spec: AgentSpec):
    """The ``mapPartitions`` function of an elastic job: each attempt of each task is a host of its own."""

    def agent(_: Iterator) -> Iterator:
        context = TaskContext.get()
        index, attempt = context.partitionId(), context.attemptNumber()
        host = f"{socket.gethostname()}-spark{index}.{attempt}"
        yield index, run_agent(spec, index, attempt, host)

    return agent
