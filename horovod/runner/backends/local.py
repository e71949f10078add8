"""The local backend: each worker is a process of this machine, in its own session, its output piped to the
supervisor."""

from __future__ import annotations

import subprocess
from typing import Callable, Dict, Sequence

from horovod.runner.backends.base import WorkerHandle, WorkerLaunch, start_each
from horovod.runner.procgroup import ProcessHandle, start_session
from horovod.runner.worker_threads import thread_defaults

__all__ = ["LocalBackend", "start_local"]


def start_local(launch: WorkerLaunch, popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> ProcessHandle:
    """Start one worker on this machine: its command with its environment (and, unless that sets it, its share of
    this machine's cores as ``OMP_NUM_THREADS``: :mod:`horovod.runner.worker_threads`), in a new session.

    Raises:
        OSError: the command cannot be started.
    """
    env = {**launch.env, **thread_defaults(launch.env)}
    return ProcessHandle(start_session(launch.command, env, popen=popen))


class LocalBackend:
    """Starts every worker on this machine (``horovodrun -np 4 python train.py``).

    Args:
        popen: the process spawner (a parameter so tests can substitute it).
    """

    name = "local"

    def __init__(self, popen: Callable[..., subprocess.Popen] = subprocess.Popen):
        self._popen = popen

    def start(self, launches: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        """Start each worker as a local process; see :meth:`horovod.runner.backends.base.Backend.start`."""
        return start_each(launches, lambda launch: start_local(launch, self._popen))
