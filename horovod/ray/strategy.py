"""Placement-group strategies: how a static job's worker actors are spread over the Ray cluster.

* :class:`PGStrategy` (``num_workers``): one bundle per worker in a ``PACK`` placement group: Ray fills a node
  before the next, so workers share nodes (and shared memory) where they fit. Inside an existing placement group
  (a Ray Tune trial) it uses that group unless told not to.
* :class:`ColocatedStrategy` (``num_hosts`` x ``num_workers_per_host``): one bundle per host in a ``STRICT_SPREAD``
  placement group, each holding that host's workers: exactly ``num_workers_per_host`` workers on each of
  ``num_hosts`` distinct nodes.

A placement group that cannot be placed within ``placement_group_timeout_s`` is removed and the start fails with a
:class:`TimeoutError` naming what was asked and what the cluster has.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import ray
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from horovod.ray.worker import BaseHorovodWorker, remote_worker_cls

__all__ = ["create_placement_group", "BaseStrategy", "PGStrategy", "ColocatedStrategy"]


def create_placement_group(resources_per_bundle: Dict[str, float], num_bundles: int, pg_timeout: float,
                           pg_strategy: str) -> Tuple[Any, List[Dict[str, float]]]:
    """Create a placement group of ``num_bundles`` copies of ``resources_per_bundle`` and wait until it is placed.

    Raises:
        TimeoutError: not placed within ``pg_timeout`` seconds; the group is removed, the message says what was asked
            and what the cluster has.
    """
    bundles = [{k: v for k, v in resources_per_bundle.items() if v} for _ in range(num_bundles)]
    group = placement_group(bundles, strategy=pg_strategy)
    ready, _ = ray.wait([group.ready()], timeout=pg_timeout)
    if not ready:
        remove_placement_group(group)
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        per_node = "; ".join(", ".join(f"{k}={v:g}" for k, v in sorted(r.items()) if k in ("CPU", "GPU"))
                             for r in nodes)
        raise TimeoutError(
            f"Ray could not place {num_bundles} bundle(s) of {bundles[0] if bundles else {}} with strategy "
            f"{pg_strategy} within {pg_timeout:g} s (placement_group_timeout_s): the cluster has {len(nodes)} "
            f"node(s) ({per_node or 'none'}) and {ray.available_resources()} free. Ask for fewer workers or "
            f"resources per worker, add nodes, or raise placement_group_timeout_s.")
    return group, bundles


class BaseStrategy:
    """Creates a static job's worker actors; :meth:`shutdown` removes what it created."""

    placement_group = None
    workers: Optional[List[Any]] = None

    def __init__(self, *, settings, use_gpu: bool, cpus_per_worker: float, gpus_per_worker: Optional[float],
                 worker_cls: type = BaseHorovodWorker):
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.worker_cls = worker_cls
        self._created_placement_group = False

    @property
    def num_workers(self) -> int:
        """How many workers the strategy creates."""
        raise NotImplementedError

    def create_workers(self) -> List[Any]:
        """Create the actors (not yet configured); returns them in creation order."""
        raise NotImplementedError

    def _actor(self, bundle_index: int):
        return remote_worker_cls(self.worker_cls).options(
            num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle_index,
                placement_group_capture_child_tasks=False)).remote()

    def _timeout(self) -> float:
        return float(getattr(self.settings, "placement_group_timeout_s", 100))

    def shutdown(self) -> None:
        """Remove the placement group this strategy created (an inherited one stays)."""
        if self._created_placement_group and self.placement_group is not None:
            remove_placement_group(self.placement_group)
        self.placement_group = None
        self._created_placement_group = False
        self.workers = []


class PGStrategy(BaseStrategy):
    """``num_workers`` workers, one bundle each, packed onto as few nodes as Ray can (``PACK``)."""

    def __init__(self, *, settings, num_workers: int, use_gpu: bool, cpus_per_worker: float,
                 gpus_per_worker: Optional[float], placement_group=None, force_create_placement_group: bool = False,
                 worker_cls: type = BaseHorovodWorker):
        super().__init__(settings=settings, use_gpu=use_gpu, cpus_per_worker=cpus_per_worker,
                         gpus_per_worker=gpus_per_worker, worker_cls=worker_cls)
        self._num_workers = int(num_workers)
        if not force_create_placement_group:
            self.placement_group = placement_group or get_current_placement_group()

    @property
    def num_workers(self) -> int:
        """How many workers the strategy creates."""
        return self._num_workers

    def create_workers(self) -> List[Any]:
        """Place the group (unless inherited), then one actor per bundle (any bundle of an inherited group)."""
        if self.placement_group is None:
            self.placement_group, _ = create_placement_group(
                {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker}, self.num_workers, self._timeout(),
                "PACK")
            self._created_placement_group = True
        self.workers = [self._actor(i if self._created_placement_group else -1) for i in range(self.num_workers)]
        return list(self.workers)


class ColocatedStrategy(BaseStrategy):
    """``num_workers_per_host`` workers on each of ``num_hosts`` distinct nodes (``STRICT_SPREAD`` of per-host
    bundles)."""

    def __init__(self, *, settings, num_hosts: int, num_workers_per_host: int, use_gpu: bool,
                 cpus_per_worker: float, gpus_per_worker: Optional[float], worker_cls: type = BaseHorovodWorker):
        super().__init__(settings=settings, use_gpu=use_gpu, cpus_per_worker=cpus_per_worker,
                         gpus_per_worker=gpus_per_worker, worker_cls=worker_cls)
        self.num_hosts = int(num_hosts)
        self.num_workers_per_host = int(num_workers_per_host)

    @property
    def num_workers(self) -> int:
        """How many workers the strategy creates."""
        return self.num_hosts * self.num_workers_per_host

    def create_workers(self) -> List[Any]:
        """Place one bundle per host on distinct nodes, then that host's actors in its bundle."""
        per_host = {"CPU": self.cpus_per_worker * self.num_workers_per_host,
                    "GPU": self.gpus_per_worker * self.num_workers_per_host}
        self.placement_group, _ = create_placement_group(per_host, self.num_hosts, self._timeout(), "STRICT_SPREAD")
        self._created_placement_group = True
        self.workers = [self._actor(host) for host in range(self.num_hosts)
                        for _ in range(self.num_workers_per_host)]
        return list(self.workers)
