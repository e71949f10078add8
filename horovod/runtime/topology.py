"""Who this worker is: its rank and place in the job, and where its job's rendezvous is.

:func:`resolve` is the one place that turns a worker's environment into a :class:`Topology`. Every way of starting
workers ends here: ``horovodrun``/``horovod.run``/``spawn_ranks`` set ``HOROVOD_RANK``... and the rendezvous address;
a worker started by hand with none of them is a single process.
"""

from __future__ import annotations

from typing import Optional

from horovod.common.rendezvous_client import secret_from_hex
from horovod.common.types import Topology
from horovod.runtime import failure_report
from horovod.runtime.affinity import apply_thread_affinity
from horovod.runtime.elastic_worker import resolve_elastic as _ask_driver
from horovod.runtime.launch_env import resolve_communicator, resolve_external
from horovod.runtime.mpi_bootstrap import is_communicator

__all__ = ["Topology", "resolve", "resolve_elastic"]


def resolve(config, comm=None) -> Topology:
    """The topology given by the launcher's ``HOROVOD_*`` variables (see :mod:`horovod.common.config`); then this
    rank's threads are pinned as ``HOROVOD_THREAD_AFFINITY`` says (:mod:`horovod.runtime.affinity`) and, under a
    launcher, an uncaught exception will be reported to it (:mod:`horovod.runtime.failure_report`).

    A worker started by ``mpirun``, ``srun`` or ``torchrun`` without ``horovodrun`` is placed by
    :func:`_started_by_others`; with an mpi4py communicator ``comm`` (``hvd.init(comm=...)``), its ranks form the
    job and meet over it.
    """
    topo = resolve_communicator(config, comm) if is_communicator(comm) else _resolve(config)
    apply_thread_affinity(config.thread_affinity, topo.local_rank, topo.local_size)
    if config.gloo_rendezvous_addr and not config.elastic and topo.rendezvous_addr and topo.secret:
        # A launcher serves this job's store: tell it how this rank fails, if it does (the root cause).
        failure_report.install(topo.rank, topo.rendezvous_addr, topo.rendezvous_port, topo.secret)
    return topo


def _resolve(config) -> Topology:
    external = _started_by_others(config)
    if external is not None:
        return external
    if config.elastic and config.gloo_rendezvous_addr:
        return resolve_elastic(config)
    if not 0 <= config.rank < config.size:
        raise ValueError(f"HOROVOD_RANK={config.rank} is outside 0..{config.size - 1} (HOROVOD_SIZE={config.size})")
    return Topology(config.rank, config.size, config.local_rank, config.local_size, config.cross_rank,
                    config.cross_size, config.hostname, config.gloo_rendezvous_addr,
                    config.gloo_rendezvous_port, secret_from_hex(config.secret_key) if config.secret_key else None,
                    config.rendezvous_scope)


def resolve_elastic(config) -> Topology:
    """An elastic worker's topology: its place in the driver's next round (see :mod:`horovod.runtime.elastic_worker`)."""
    return _ask_driver(config)


def _started_by_others(config) -> Optional[Topology]:
    """mpirun/srun workers: rank from their variables, peers met through a rendezvous (:mod:`launch_env`)."""
    return resolve_external(config)
