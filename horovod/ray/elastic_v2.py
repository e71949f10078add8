"""Horovod's ``horovod.ray.elastic_v2``: the adapter-era names of elastic Ray jobs, for code written against it.

``ElasticParams`` holds an elastic job's parameters and names its adapter, as Horovod's ``RayExecutor`` reads them;
:class:`~horovod.ray.elastic.ElasticAdapter` runs the job, with :class:`~horovod.ray.elastic.RayHostDiscovery` (or
:class:`~horovod.ray.elastic.TestDiscovery`) saying which nodes it may use. Everything here is the same object as
in :mod:`horovod.ray.elastic`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from horovod.ray.elastic import ElasticAdapter, RayHostDiscovery, TestDiscovery

__all__ = ["ElasticParams", "ElasticAdapter", "RayHostDiscovery", "TestDiscovery"]


@dataclasses.dataclass
class ElasticParams:
    """An elastic job's parameters (Horovod's fields and defaults).

    ``min_workers``/``max_workers`` bound the workers; ``reset_limit`` bounds how often the job may rescale;
    ``cooldown_range`` is how long (seconds, min and max) a failed host stays blacklisted; ``elastic_timeout`` how
    long the job waits for ``min_workers`` after a rescale; ``override_discovery`` discovers from Ray's nodes.
    """

    cpus_per_worker: int = 1
    use_gpu: bool = False
    gpus_per_worker: Optional[int] = None
    min_workers: int = 1
    max_workers: Optional[int] = None
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[int, int]] = None
    elastic_timeout: int = 600
    override_discovery: bool = True

    @property
    def elastic(self) -> bool:
        """Always True: these are an elastic job's parameters."""
        return True

    @property
    def adapter(self) -> type:
        """The adapter that runs a job with these parameters."""
        return ElasticAdapter
