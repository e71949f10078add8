"""How many threads each worker's math libraries start: the launchers' default for ``OMP_NUM_THREADS``.

numpy's OpenBLAS, PyTorch's intra-op pool and oneDNN start one thread per core of the host in every process, so N
workers on a host run N times as many compute threads as it has cores, and fight over them. OpenBLAS's threads also
spin when they start: ``import numpy`` cost 0.28 CPU-s on a 2-core host against 0.16 s with one thread, paid by
every worker before its first collective (256 workers: half a minute of a 2-core host's CPU). Like ``torchrun``,
which sets 1, the launchers give each worker of a host that runs several its share of the host's cores (at least
one), where the host the worker starts on computes it; a user's own ``OMP_NUM_THREADS`` always wins, and a host
with one worker is left to the libraries' defaults. Applied where workers start: this machine's workers and each
ssh host's (``ssh_host``); ``mpirun``, Spark and Ray start theirs with their own environments.
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional

__all__ = ["THREADS_VARIABLE", "host_cores", "thread_defaults"]

THREADS_VARIABLE = "OMP_NUM_THREADS"


def host_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_defaults(env: Mapping[str, str], cores: Optional[int] = None) -> Dict[str, str]:
    """``{"OMP_NUM_THREADS": share}`` for a worker that will run with environment ``env`` (its ``HOROVOD_LOCAL_SIZE``
    says how many workers its host runs), or ``{}`` where the user set the variable or the host runs one worker.

    Args:
        env: the worker's whole environment as it will start.
        cores: the host's cores (default: :func:`host_cores` of this process, which runs on the worker's host).
    """
    if THREADS_VARIABLE in env:
        return {}
    try:
        local_size = int(env.get("HOROVOD_LOCAL_SIZE", "1"))
    except ValueError:
        return {}
    if local_size <= 1:
        return {}
    cores = host_cores() if cores is None else cores
    return {THREADS_VARIABLE: str(max(1, cores // local_size))}
