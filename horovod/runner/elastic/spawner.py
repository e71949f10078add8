"""Start and stop an elastic job's workers one slot at a time, through the same backend and supervisor as a static
job.

The driver decides which slot gets a worker; :class:`ElasticSpawner` only carries it out: it gives the slot's host
its rendezvous address (served from then on), builds the worker's environment with
:func:`horovod.runner.pipeline.worker_env`, has the backend start it (:class:`~horovod.runner.backends.ssh.SshBackend`:
local hosts directly, others over ssh after a one-time check) and hands the handle to the
:class:`~horovod.runner.supervisor.Supervisor`, which relays its output under the slot key (``[host:slot]``) and
reports its exit. A host that cannot be reached or fails its check raises :class:`OSError` naming why, and the driver
blacklists it.
"""

from __future__ import annotations

from typing import Callable, Hashable, List, Mapping, Sequence, Tuple

from horovod.common import config
from horovod.common.elastic_records import slot_key
from horovod.runner.backends.base import Backend, WorkerLaunch
from horovod.runner.hosts import SlotInfo
from horovod.runner.pipeline import worker_env
from horovod.runner.network import NetworkError
from horovod.runner.rendezvous import RendezvousInfo
from horovod.runner.ssh import HostCheckError
from horovod.runner.supervisor import DEFAULT_GRACE_SECONDS, Supervisor

__all__ = ["ElasticSpawner"]


class ElasticSpawner:
    """The spawner :class:`~horovod.runner.elastic.job.ElasticJob` drives: ``spawn(slot) -> pid``, ``exits``,
    ``send_signal``, ``forget``, ``close``.

    Args:
        command: the worker command line.
        backend: what starts a worker.
        supervisor: what relays, reports and stops the workers.
        rendezvous_for: the rendezvous as a host's workers reach it (may start serving an address).
        base_env: the environment to start from; extra_env: variables for every worker.
        grace_seconds: time a stopped remote worker gets between SIGTERM and SIGKILL.
    """

    def __init__(self, command: Sequence[str], backend: Backend, supervisor: Supervisor,
                 rendezvous_for: Callable[[str], RendezvousInfo], base_env: Mapping[str, str],
                 extra_env: Mapping[str, str], grace_seconds: float = DEFAULT_GRACE_SECONDS):
        self.command = tuple(command)
        self.backend = backend
        self.supervisor = supervisor
        self.rendezvous_for = rendezvous_for
        self.base_env = dict(base_env)
        self.extra_env = {**extra_env, "HOROVOD_ELASTIC": "1"}
        config.report_variables({**self.base_env, **self.extra_env})  # once, for every worker it will start
        self.grace_seconds = grace_seconds

    def spawn(self, slot: SlotInfo) -> int:
        """Start the worker of ``slot``; returns its pid.

        Raises:
            OSError: the command cannot be started, or the host cannot be reached or fails its check.
        """
        try:
            rendezvous = self.rendezvous_for(slot.hostname)
            env = worker_env(self.base_env, slot, rendezvous, self.extra_env)
            handles = self.backend.start([WorkerLaunch(slot, self.command, env)], self.grace_seconds)
        except NetworkError as exc:
            raise OSError(str(exc)) from None
        except HostCheckError as exc:
            raise OSError(exc.failures.get(slot.hostname, str(exc))) from None
        handle = handles[slot.rank]
        self.supervisor.add(slot_key(slot.hostname, slot.local_rank), slot.hostname, handle)
        return handle.pid

    def exits(self, timeout: float) -> List[Tuple[Hashable, int, int]]:
        """``(key, pid, returncode)`` of workers that exited, waiting up to ``timeout`` for the first one."""
        return self.supervisor.exits(timeout)

    def wake(self) -> None:
        """Make a waiting :meth:`exits` return now (the store changed: a worker may be ready)."""
        self.supervisor.wake()

    def send_signal(self, key: str, sig: int) -> None:
        """Send ``sig`` to the worker of slot ``key`` if it still runs."""
        self.supervisor.send_signal(key, sig)

    def forget(self, key: str, pid: int) -> None:
        """Drop an exited worker and kill what it left behind."""
        self.supervisor.forget(key, pid)

    @property
    def pids(self) -> List[int]:
        """The live workers' pids."""
        return self.supervisor.pids

    def close(self) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after the grace period) and reap them."""
        self.supervisor.close()
