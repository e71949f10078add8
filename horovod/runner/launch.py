"""Launch a job's workers on this machine: decide each worker's environment, then start and supervise them.

The decisions (:func:`worker_env`, :func:`build_specs`) are pure functions over plain data; :func:`launch_local`
carries them out with a :class:`~horovod.runner.processes.WorkerGroup`. ``horovodrun``, ``horovod.run`` and
``horovod.testing.spawn_ranks`` all start workers through here, so a worker sees the same variables however it is
started. The job secret travels in the environment only, never on a command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple

from horovod.common import config
from horovod.common.exceptions import HorovodError
from horovod.common.rendezvous_client import make_secret, secret_to_hex
from horovod.runner.hosts import HostInfo, SlotInfo, is_local_host
from horovod.runner.processes import (DEFAULT_GRACE_SECONDS, JobResult, OutputSink, WorkerExit, WorkerGroup,
                                      WorkerSpec)
from horovod.runner.rendezvous import RendezvousServer

# Variables the launcher decides for each worker; a value inherited from the launcher's own environment (say,
# horovodrun started from inside another job) must never leak through.
_LAUNCHER_VARS = (
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_SECRET_KEY", "HOROVOD_RENDEZVOUS_SCOPE", "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS",
)


class NotAvailableYetError(HorovodError, NotImplementedError):
    """A launcher feature that this version parses but does not implement yet (ssh, elastic, MPI)."""


@dataclasses.dataclass(frozen=True)
class RendezvousInfo:
    """Where workers find the rendezvous service, and the job secret they sign requests with."""

    addr: str
    port: int
    secret: bytes
    scope: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Everything a local launch needs, decided before anything starts.

    ``extra_env`` holds the tunables (``HOROVOD_FUSION_THRESHOLD``...) and any other variable for every worker.
    """

    command: Tuple[str, ...]
    slots: Tuple[SlotInfo, ...]
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    output_filename: Optional[str] = None
    prefix_timestamp: bool = False
    verbose: bool = False
    grace_seconds: float = DEFAULT_GRACE_SECONDS


def slot_env(slot: SlotInfo) -> Dict[str, str]:
    """The topology variables of one worker (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...)."""
    return {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def worker_env(base: Mapping[str, str], slot: SlotInfo, rendezvous: RendezvousInfo,
               extra: Mapping[str, str] = ()) -> Dict[str, str]:
    """The full environment of one worker: ``base`` (the launcher's), then ``extra``, then what the launcher decides.

    Args:
        base: the environment to start from.
        slot: the worker's place in the job.
        rendezvous: where the rendezvous service is and the job secret.
        extra: tunables and other variables for every worker.

    Returns:
        A new dict; ``base`` is not modified.
    """
    env = {k: v for k, v in base.items() if k not in _LAUNCHER_VARS}
    env.update(dict(extra))
    env.update(slot_env(slot))
    env.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous.addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous.port),
        "HOROVOD_SECRET_KEY": secret_to_hex(rendezvous.secret),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "PYTHONUNBUFFERED": "1",
    })
    if rendezvous.scope:
        env["HOROVOD_RENDEZVOUS_SCOPE"] = rendezvous.scope
    return env


def build_specs(launch: LaunchConfig, rendezvous: RendezvousInfo,
                base_env: Optional[Mapping[str, str]] = None) -> List[WorkerSpec]:
    """One :class:`WorkerSpec` per slot, each with its :func:`worker_env`.

    Args:
        launch: the job.
        rendezvous: the rendezvous service of the job.
        base_env: the environment to start from (default: this process's).
    """
    base = config.environ_snapshot() if base_env is None else base_env
    return [WorkerSpec(slot.rank, slot.hostname, tuple(launch.command),
                       worker_env(base, slot, rendezvous, launch.extra_env)) for slot in launch.slots]


def package_pythonpath(include_caller_path: bool = False) -> Dict[str, str]:
    """``PYTHONPATH`` for workers started with ``python -m horovod....``: this package's parent first.

    Args:
        include_caller_path: also add this process's own ``sys.path`` entries outside the interpreter's prefix
            (a test directory, a script's folder), so functions pickled by reference import in the workers.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    entries = [root]
    if include_caller_path:
        prefixes = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
        entries += [p for p in sys.path if p and os.path.isdir(p) and p not in entries
                    and not (os.path.realpath(p) + os.sep).startswith(prefixes)]
    current = config.environ_get("PYTHONPATH")
    if current:
        entries.append(current)
    return {"PYTHONPATH": os.pathsep.join(entries)}


def check_local(hosts: Sequence[HostInfo]) -> None:
    """Raise :class:`NotAvailableYetError` if any host is not this machine (remote hosts need ssh launch)."""
    remote = [h.hostname for h in hosts if not is_local_host(h.hostname)]
    if remote:
        raise NotAvailableYetError(f"ssh launch not available yet: host(s) {', '.join(remote)} are not this "
                                   f"machine; only local hosts (localhost, 127.x, this machine's name) can be used")


@contextlib.contextmanager
def rendezvous_service(host: str = "127.0.0.1", scope: Optional[str] = None
                       ) -> Iterator[Tuple[RendezvousServer, RendezvousInfo]]:
    """Serve a fresh rendezvous store with a fresh job secret for the duration of the block."""
    secret = make_secret()
    server = RendezvousServer(secret, host=host, port=0)
    port = server.start()
    try:
        yield server, RendezvousInfo(host, port, secret, scope)
    finally:
        server.stop()


@contextlib.contextmanager
def _forward_signals(group: WorkerGroup) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers; the caller's own handling applies
        return
    handler = lambda signum, frame: group.interrupt(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def launch_local(launch: LaunchConfig, rendezvous: RendezvousInfo, stdout: Optional[TextIO] = None,
                 stderr: Optional[TextIO] = None, timeout: Optional[float] = None,
                 on_exit: Optional[Callable[[WorkerExit], None]] = None,
                 on_start: Optional[Callable[[WorkerGroup], None]] = None) -> JobResult:
    """Start every worker of ``launch`` on this machine and wait for the job, failing fast.

    SIGINT and SIGTERM received meanwhile (in the main thread) are forwarded to every worker, which are then killed
    after the grace period. Whatever happens, no worker process group outlives this call.

    Args:
        launch: the job.
        rendezvous: the job's rendezvous service (see :func:`rendezvous_service`).
        stdout, stderr: where prefixed worker output goes (default: ``sys.stdout``/``sys.stderr`` at write time).
        timeout: stop the job after this many seconds (None: never).
        on_exit: called with each worker's exit as it happens.
        on_start: called with the started group (tests read the workers' pids from it).

    Returns:
        The :class:`JobResult`.
    """
    log = (lambda text: print(text, file=stderr or sys.stderr, flush=True))
    specs = build_specs(launch, rendezvous)
    sink = OutputSink(len(specs), stdout, stderr, launch.output_filename, launch.prefix_timestamp)
    if launch.verbose:
        log(f"Launching {len(specs)} local worker(s): {' '.join(launch.command)}; "
            f"rendezvous at {rendezvous.addr}:{rendezvous.port}")
    with WorkerGroup(specs, sink, launch.grace_seconds, log=log) as group, _forward_signals(group):
        group.start()
        if on_start is not None:
            on_start(group)
        return group.wait(timeout=timeout, on_exit=on_exit)


__all__ = ["LaunchConfig", "RendezvousInfo", "NotAvailableYetError", "slot_env", "worker_env", "build_specs",
           "check_local", "package_pythonpath", "rendezvous_service", "launch_local"]
