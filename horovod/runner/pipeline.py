"""The launch pipeline's shared steps: each worker's environment, then a backend starts them, then one supervisor.

``horovodrun``, ``horovod.run``, elastic jobs and ``horovod.testing.spawn_ranks`` all build workers' environments
with :func:`worker_env` and run them with :func:`run_job`; a backend that starts workers its own way (Ray actors,
Spark tasks) calls the same pieces:

1. :func:`horovod.runner.rendezvous.rendezvous_service` (or a ``RendezvousPool``): the store and the job secret;
2. :func:`worker_env` for each slot of :func:`horovod.runner.hosts.get_host_assignments`: the per-rank environment;
3. its :meth:`~horovod.runner.backends.base.Backend.start`, then a :class:`~horovod.runner.supervisor.Supervisor`
   for relaying, fail-fast and reaping (what :func:`run_job` does).

The decisions (:func:`worker_env`, :func:`plan_launches`) are pure functions over plain data. The job secret travels
in the environment only, never on a command line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable, Dict, List, Mapping, Optional, TextIO, Tuple, Union

from horovod.common import config
from horovod.common.exceptions import HorovodError
from horovod.common.liveness import probe_interval
from horovod.common.rendezvous_client import secret_to_hex
from horovod.runner.backends.base import Backend, WorkerLaunch
from horovod.runner.backends.local import LocalBackend
from horovod.runner.hosts import SlotInfo
from horovod.runner.noise import hides_notes, quiet_defaults
from horovod.runner.output import OutputSink
from horovod.runner.procgroup import forward_signals
from horovod.runner.rendezvous import RendezvousInfo
from horovod.runner.supervisor import DEFAULT_GRACE_SECONDS, JobResult, Supervisor, WorkerExit
from horovod.runner.verbose import describe_job

__all__ = ["LaunchConfig", "NotAvailableYetError", "SLOT_VARS", "LAUNCHER_VARS", "without_launcher_vars", "slot_env",
           "job_env", "worker_env", "plan_launches", "package_pythonpath", "run_job", "launch_local"]

# The variables that place one worker in the job; a backend whose one process starts every rank (mpirun) leaves them
# to the workers' own launcher.
SLOT_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
             "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# Variables the launcher decides for each worker; a value inherited from the launcher's own environment (say,
# horovodrun started from inside another job) must never leak through.
LAUNCHER_VARS = SLOT_VARS + ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_SECRET_KEY",
                             "HOROVOD_RENDEZVOUS_SCOPE", "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")


def without_launcher_vars(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` without the variables a launcher decides for each worker (:data:`LAUNCHER_VARS`): the one place an
    inherited rank, rendezvous or job secret is dropped."""
    return {k: v for k, v in env.items() if k not in LAUNCHER_VARS}


class NotAvailableYetError(HorovodError, NotImplementedError):
    """A launcher feature that this version parses but does not implement yet (jsrun, MPI for ``horovod.run``)."""


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch needs, decided before anything starts.

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
    """The topology variables of one worker (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...), and the ones torch libraries
    read (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), as torchrun sets them."""
    return {
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(slot.size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_size),
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def job_env(base: Mapping[str, str], rendezvous: RendezvousInfo, extra: Mapping[str, str] = ()) -> Dict[str, str]:
    """What every worker of a job shares: ``base`` without launcher-decided variables, ``extra``, the rendezvous
    address, the job secret and the controller, and the quiet defaults neither set
    (:func:`horovod.runner.noise.quiet_defaults`: ``TF_CPP_MIN_LOG_LEVEL=1``).

    Returns:
        A new dict; ``base`` is not modified.
    """
    env = without_launcher_vars(base)
    env.update(dict(extra))
    env.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous.addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous.port),
        "HOROVOD_SECRET_KEY": secret_to_hex(rendezvous.secret),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(quiet_defaults(env))     # TensorFlow's INFO off unless the user set its level
    if rendezvous.scope:
        env["HOROVOD_RENDEZVOUS_SCOPE"] = rendezvous.scope
    return env


def worker_env(base: Mapping[str, str], slot: SlotInfo, rendezvous: RendezvousInfo,
               extra: Mapping[str, str] = ()) -> Dict[str, str]:
    """The full environment of one worker: :func:`job_env` plus its place in the job (:func:`slot_env`).

    Args:
        base: the environment to start from.
        slot: the worker's place in the job.
        rendezvous: where the rendezvous service is and the job secret.
        extra: tunables and other variables for every worker.

    Returns:
        A new dict; ``base`` is not modified.
    """
    env = job_env(base, rendezvous, extra)
    env.update(slot_env(slot))
    return env


def plan_launches(launch: LaunchConfig, rendezvous: Union[RendezvousInfo, Mapping[str, RendezvousInfo]],
                  base_env: Optional[Mapping[str, str]] = None) -> List[WorkerLaunch]:
    """One :class:`WorkerLaunch` per slot, each with its :func:`worker_env`.

    Args:
        launch: the job.
        rendezvous: the job's rendezvous service, or one per host (where that host's workers reach it).
        base_env: the environment to start from (default: this process's).
    """
    base = config.environ_snapshot() if base_env is None else base_env
    by_host = rendezvous if isinstance(rendezvous, Mapping) else None
    return [WorkerLaunch(slot, tuple(launch.command),
                         worker_env(base, slot, by_host[slot.hostname] if by_host else rendezvous, launch.extra_env))
            for slot in launch.slots]


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


def settle_seconds(launch: LaunchConfig) -> float:
    """How long the other workers get to end by themselves after the first failure: the survivors of a lost peer
    learn of it within one keepalive probe of each other (the workers' ``HOROVOD_LIVENESS_TIMEOUT``), plus a second
    to write their error."""
    workers = config.load_config({**config.environ_snapshot(), **launch.extra_env})
    return probe_interval(workers.liveness_timeout) + 1.0


def run_job(launch: LaunchConfig, backend: Backend, rendezvous: Union[RendezvousInfo, Mapping[str, RendezvousInfo]],
            stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None, timeout: Optional[float] = None,
            on_exit: Optional[Callable[[WorkerExit], None]] = None,
            on_start: Optional[Callable[[Supervisor], None]] = None) -> JobResult:
    """Start every worker of ``launch`` with ``backend`` and supervise them until the job ends, failing fast.

    SIGINT and SIGTERM received meanwhile (in the main thread) are forwarded to every worker, which are then killed
    after the grace period. Whatever happens, no worker process group outlives this call.

    Args:
        launch: the job.
        backend: what starts the workers (:mod:`horovod.runner.backends`).
        rendezvous: the job's rendezvous service, or one per host (see :func:`plan_launches`).
        stdout, stderr: where prefixed worker output goes (default: ``sys.stdout``/``sys.stderr`` at write time).
        timeout: stop the job after this many seconds (None: never).
        on_exit: called with each worker's exit as it happens.
        on_start: called with the supervisor once every worker started (tests read the workers' pids from it).

    Raises:
        OSError: a worker could not be started (nothing is left running then).
        HorovodError: the backend refused the job before starting anything (a host failed its check).
    """
    log = (lambda text: print(text, file=stderr or sys.stderr, flush=True))
    launches = plan_launches(launch, rendezvous)
    if launches:  # every worker gets the same variables but its place: one report for the job, not one per rank
        config.report_variables(launches[0].env)
    sink = OutputSink(len(launches), stdout, stderr, launch.output_filename, launch.prefix_timestamp,
                      hide_notes=bool(launches) and hides_notes(launches[0].env))
    if launch.verbose:  # on standard output, where Horovod's verbose launcher prints
        print("\n".join(describe_job(launches, rendezvous, backend.name)), file=stdout or sys.stdout, flush=True)
    with Supervisor(sink, launch.grace_seconds, log=log, settle_seconds=settle_seconds(launch)) as supervisor, \
            forward_signals(supervisor.interrupt):
        hostnames = {w.rank: w.hostname for w in launches}
        for rank, handle in backend.start(launches, launch.grace_seconds).items():
            supervisor.add(rank, hostnames[rank], handle)
        if on_start is not None:
            on_start(supervisor)
        return supervisor.wait(timeout=timeout, on_exit=on_exit)


def launch_local(launch: LaunchConfig, rendezvous: RendezvousInfo, stdout: Optional[TextIO] = None,
                 stderr: Optional[TextIO] = None, timeout: Optional[float] = None,
                 on_exit: Optional[Callable[[WorkerExit], None]] = None,
                 on_start: Optional[Callable[[Supervisor], None]] = None) -> JobResult:
    """:func:`run_job` with every worker on this machine (:class:`~horovod.runner.backends.local.LocalBackend`)."""
    return run_job(launch, LocalBackend(), rendezvous, stdout, stderr, timeout, on_exit, on_start)
