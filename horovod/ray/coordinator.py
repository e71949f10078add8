"""Horovod's ``horovod.ray.runner.Coordinator``: the driver-side bookkeeping of a Ray job assembled by hand.

Code written for Horovod that builds its own worker actors (``ray.remote(BaseHorovodWorker)``) registers each
worker's host, Ray node and rank, turns the registrations into each rank's place in the job
(:meth:`Coordinator.finalize_registration`) and starts the job's rendezvous (:meth:`Coordinator.establish_rendezvous`);
the actors get both as environment variables (``update_env_vars``) and ``hvd.init()`` inside them meets the others.
:class:`~horovod.ray.RayExecutor` does all of this itself; it does not use this class.
"""

from __future__ import annotations

import collections
from typing import Any, DefaultDict, Dict, List, Optional, Set

from horovod.ray.placement import node_hostname
from horovod.ray.utils import driver_address, job_extra_env
from horovod.runner.pipeline import job_env
from horovod.runner.rendezvous import RendezvousPool

__all__ = ["Coordinator"]


class Coordinator:
    """Registers a job's workers by Ray node and starts its rendezvous (Horovod 0.28.1's class and methods).

    Args:
        settings: the job's settings (``RayExecutor.create_settings()``); ``nics``, if set, names the data-plane
            interfaces the workers use.

    Attributes:
        node_id_by_rank: Ray node id -> the world ranks registered on it, in registration order.
        rendezvous: the rendezvous service once :meth:`establish_rendezvous` ran (None before).
        global_rendezv_port: its port (None before).
    """

    rendezvous: Optional[RendezvousPool] = None
    global_rendezv_port: Optional[int] = None
    nics = None
    node_id_by_rank: DefaultDict[str, List[int]]

    def __init__(self, settings: Any):
        self.settings = settings
        self.node_id_by_rank = collections.defaultdict(list)
        self._hostnames: Set[str] = set()
        self._host_of_node: Dict[str, str] = {}

    @property
    def world_size(self) -> int:
        """The number of ranks registered."""
        return sum(len(ranks) for ranks in self.node_id_by_rank.values())

    @property
    def hostnames(self) -> Set[str]:
        """The host names registered."""
        return self._hostnames

    @property
    def node_id_string(self) -> str:
        """``node:count,...`` in registration order, as Horovod writes a host list."""
        return ",".join(f"{node_id}:{len(ranks)}" for node_id, ranks in self.node_id_by_rank.items())

    def register(self, hostname: str, node_id: str, world_rank: int) -> None:
        """Note that ``world_rank`` runs on Ray node ``node_id`` of machine ``hostname``."""
        self._hostnames.add(hostname)
        self._host_of_node.setdefault(node_id, node_hostname(hostname, str(node_id)))
        self.node_id_by_rank[node_id].append(world_rank)

    def finalize_registration(self) -> Dict[int, Dict[str, Any]]:
        """Each registered rank's place in the job, as the variables its actor needs.

        A Ray node is a host: local ranks number a node's workers in registration order; the cross rank of a worker
        is the number of nodes registered before its own that have a worker with the same local rank (Horovod's
        numbering). Besides Horovod's four ``HOROVOD_LOCAL_*``/``HOROVOD_CROSS_*`` values (ints), each dict holds
        ``HOROVOD_RANK``, ``HOROVOD_SIZE`` and the node's ``HOROVOD_HOSTNAME``, so a worker created without
        ``world_rank``/``world_size`` is placed too.
        """
        cross_sizes: DefaultDict[int, int] = collections.defaultdict(int)
        cross_ranks: Dict[int, int] = {}
        for ranks in self.node_id_by_rank.values():
            for local_rank, world_rank in enumerate(ranks):
                cross_ranks[world_rank] = cross_sizes[local_rank]
                cross_sizes[local_rank] += 1
        size = self.world_size
        info: Dict[int, Dict[str, Any]] = {}
        for node_id, ranks in self.node_id_by_rank.items():
            for local_rank, world_rank in enumerate(ranks):
                info[world_rank] = dict(HOROVOD_CROSS_RANK=cross_ranks[world_rank],
                                        HOROVOD_CROSS_SIZE=cross_sizes[local_rank], HOROVOD_LOCAL_RANK=local_rank,
                                        HOROVOD_LOCAL_SIZE=len(ranks), HOROVOD_RANK=world_rank, HOROVOD_SIZE=size,
                                        HOROVOD_HOSTNAME=self._host_of_node[node_id])
        return info

    def establish_rendezvous(self) -> Dict[str, str]:
        """Start the job's rendezvous on the driver's Ray node (once); returns the variables every worker needs:
        its address and port, the job's secret and the controller (``HOROVOD_GLOO_RENDEZVOUS_ADDR``,
        ``HOROVOD_GLOO_RENDEZVOUS_PORT``, ``HOROVOD_SECRET_KEY``, ``HOROVOD_CONTROLLER``, ...)."""
        if self.rendezvous is None:
            self.rendezvous = RendezvousPool()
        info = self.rendezvous.serve(driver_address())
        self.global_rendezv_port = info.port
        return job_env({}, info, job_extra_env(None, getattr(self.settings, "nics", None), None))

    def close(self) -> None:
        """Stop the rendezvous (this package's addition: Horovod's server lives as long as the driver)."""
        if self.rendezvous is not None:
            self.rendezvous.close()
        self.rendezvous, self.global_rendezv_port = None, None
