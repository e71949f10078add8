"""The contract between the launch pipeline and whatever starts the workers.

A backend receives the planned workers, each a :class:`WorkerLaunch` (its slot, command line and complete
environment, rendezvous address and job secret included), and returns one :class:`WorkerHandle` per process it
started, by rank. It decides nothing about ranks, environments or failures: the pipeline
(:mod:`horovod.runner.pipeline`) plans those, and the :class:`~horovod.runner.supervisor.Supervisor` relays the
handles' output, forwards signals, fails fast and reaps them. Writing a backend (Ray actors, Spark tasks) means
implementing :meth:`Backend.start` (usually with :func:`start_each`) and, for workers that are not local ``Popen``
objects, a handle with the members of :class:`WorkerHandle`.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import IO, Callable, Dict, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

from horovod.runner.hosts import SlotInfo

__all__ = ["WorkerLaunch", "WorkerHandle", "Backend", "start_each", "start_groups"]


@dataclasses.dataclass(frozen=True)
class WorkerLaunch:
    """One worker to start: where it runs, what it runs and its whole environment (from
    :func:`horovod.runner.pipeline.worker_env`)."""

    slot: SlotInfo
    command: Tuple[str, ...]
    env: Mapping[str, str]

    @property
    def rank(self) -> int:
        """The worker's rank."""
        return self.slot.rank

    @property
    def hostname(self) -> str:
        """The host it runs on."""
        return self.slot.hostname


@runtime_checkable
class WorkerHandle(Protocol):
    """A started worker (or a process that runs several, like ``mpirun``), as the supervisor drives it.

    :class:`horovod.runner.procgroup.ProcessHandle` is the implementation for local processes.
    """

    pid: int
    """A number that names it in messages and tests (a process id where there is one)."""
    stdout: Optional[IO[bytes]]
    """Its output as a byte stream read line by line, or None when it reaches the terminal another way."""
    stderr: Optional[IO[bytes]]
    """Likewise for its error output."""

    def poll(self) -> Optional[int]:
        """The exit status if it has ended (negative: the signal that killed it), else None."""

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Block up to ``timeout`` seconds (None: until it ends); the exit status, or None if still running."""

    def signal(self, sig: int) -> None:
        """Deliver ``sig`` to it and everything it started (SIGKILL must leave nothing behind)."""

    def release(self) -> None:
        """Let go of what ties it to the launcher (a channel, a lease); called once it has exited or is stopped."""


class Backend(Protocol):
    """Starts planned workers. Implementations: :mod:`.local`, :mod:`.ssh`, :mod:`.mpirun`."""

    name: str
    """Short name for messages (``local``, ``ssh``, ``mpirun``, ``ray``...)."""

    def start(self, launches: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        """Start every worker of ``launches``; return their handles by rank.

        A backend whose one process runs several ranks (``mpirun``) returns a single handle under the lowest rank.
        ``grace_seconds`` is how long a stopped worker may take between SIGTERM and SIGKILL, for backends that stop
        workers remotely.

        Raises:
            OSError: a worker could not be started; the backend has stopped those it started (see
                :func:`start_each`).
            HorovodError: a backend-specific failure before anything started (a host that fails its check).
        """


def start_each(launches: Sequence[WorkerLaunch],
               start_one: Callable[[WorkerLaunch], WorkerHandle]) -> Dict[int, WorkerHandle]:
    """Start ``launches`` one by one with ``start_one``; if one fails, SIGKILL those started and re-raise."""
    return start_groups([[launch] for launch in launches], lambda group: {group[0].rank: start_one(group[0])})


def start_groups(groups: Sequence[Sequence[WorkerLaunch]],
                 start_group: Callable[[Sequence[WorkerLaunch]], Dict[int, WorkerHandle]]
                 ) -> Dict[int, WorkerHandle]:
    """Start each group of launches (one process serving several, like a host's ssh client) with ``start_group``,
    which returns their handles by rank; if one fails, SIGKILL those started and re-raise."""
    handles: Dict[int, WorkerHandle] = {}
    try:
        for group in groups:
            handles.update(start_group(group))
    except BaseException:
        for handle in handles.values():
            handle.signal(signal.SIGKILL)
            handle.release()
        raise
    return handles
