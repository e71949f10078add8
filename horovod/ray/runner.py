"""``RayExecutor``: Horovod's driver for a job whose workers are Ray actors (Horovod 0.28.1's names and arguments).

With ``num_workers`` (or ``num_hosts`` x ``num_workers_per_host``) the job is static
(:class:`~horovod.ray.static.StaticAdapter`); with ``min_workers`` it is elastic
(:class:`~horovod.ray.elastic.ElasticAdapter`). Either way the driver process serves the job's rendezvous and each
worker gets the same ``HOROVOD_*`` environment a ``horovodrun`` worker gets, so ``hvd.init()`` inside the actors
works unchanged and tensors move directly between the actors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

from horovod.ray.coordinator import Coordinator
from horovod.ray.elastic import ElasticAdapter
from horovod.ray.static import StaticAdapter

__all__ = ["RayExecutor", "MiniSettings", "Coordinator"]


@dataclasses.dataclass
class MiniSettings:
    """What a Ray job needs to know beyond the executor's arguments (Horovod's ``MiniSettings``).

    ``timeout_s`` bounds the workers' start and meeting (``HOROVOD_START_TIMEOUT``); ``nics`` names the data-plane
    interfaces (``HOROVOD_GLOO_IFACE``); ``placement_group_timeout_s`` bounds placing the workers. The ssh fields are
    kept for compatibility: Ray starts the workers, nothing logs in anywhere.
    """

    nics: Optional[Any] = None
    verbose: int = 1
    key: Optional[str] = None
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    elastic: bool = False


class RayExecutor:
    """A Horovod job on a Ray cluster (``ray.init()`` first); ``start``, then ``run``/``execute`` any number of times,
    then ``shutdown``.

    Args:
        settings: from :meth:`create_settings`.
        num_workers: a static job of this many workers, packed onto as few nodes as fit.
        num_hosts, num_workers_per_host: a static job of exactly this many workers on each of this many nodes.
        cpus_per_worker, use_gpu, gpus_per_worker: resources of each worker actor.
        use_current_placement_group: inside a placement group (a Ray Tune trial), use it.
        min_workers, max_workers, reset_limit, cooldown_range, elastic_timeout, override_discovery: an elastic job
            (see :class:`~horovod.ray.elastic.ElasticAdapter`).

    Raises:
        ValueError: contradictory arguments (both ``num_workers`` and ``min_workers``, GPUs without ``use_gpu``...).
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: float = 100,
                        nics: Optional[Any] = None) -> MiniSettings:
        """The job's settings (Horovod's signature; ``ssh_identity_file`` and ``ssh_str`` are accepted and unused)."""
        return MiniSettings(ssh_identity_file=ssh_identity_file, timeout_s=timeout_s,
                            placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings=None, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, cooldown_range: Optional[Sequence[float]] = None,
                 elastic_timeout: float = 600, override_discovery: bool = True):
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set, but use_gpu is False; use_gpu must be True if gpus_per_worker "
                             "is set")
        if max_workers and (not min_workers or min_workers <= 0):
            raise ValueError("max_workers needs a positive min_workers: elastic jobs require a positive min_workers")
        if min_workers and num_workers:
            raise ValueError("both min_workers and num_workers are given; a job is either elastic or static")
        self.settings = settings if settings is not None else MiniSettings()
        self.settings.elastic = min_workers is not None
        if self.settings.elastic:
            self.adapter = ElasticAdapter(self.settings, min_workers, max_workers, use_gpu=use_gpu,
                                          cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                                          override_discovery=override_discovery, reset_limit=reset_limit,
                                          cooldown_range=cooldown_range, elastic_timeout=elastic_timeout)
        else:
            self.adapter = StaticAdapter(self.settings, num_workers, num_hosts, num_workers_per_host,
                                         cpus_per_worker, use_gpu, gpus_per_worker, use_current_placement_group)

    @property
    def workers(self) -> List[Any]:
        """The worker actors of a static job, by rank (empty before :meth:`start` and for elastic jobs)."""
        return list(getattr(self.adapter, "workers", []))

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Start the workers: each builds ``executable_cls(*executable_args, **executable_kwargs)`` (if given) after
        its Horovod environment and ``extra_env_vars`` are set. An elastic job starts its workers in :meth:`run`.

        Raises:
            TimeoutError: the workers could not be placed within ``placement_group_timeout_s``.
        """
        self.adapter.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)

    def run(self, fn: Callable, args: Optional[Sequence] = None, kwargs: Optional[Dict[str, Any]] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results by rank. ``callbacks`` is accepted and not called.

        Raises:
            Exception: the first exception a worker raised, with its remote traceback and rank.
            RuntimeError: a worker actor died; the job is stopped.
        """
        return self.adapter.run(fn, args, kwargs, callbacks)

    def run_remote(self, fn: Callable, args: Optional[Sequence] = None,
                   kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Submit ``fn(*args, **kwargs)`` to every worker; Ray object refs by rank (static jobs)."""
        if self.settings.elastic:
            raise NotImplementedError("run_remote is for static jobs; an elastic job runs to its end in run()")
        return self.adapter.run_remote(fn, args, kwargs)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every worker; the results by rank."""
        return self.adapter.execute(fn, callbacks)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on the rank 0 worker only; its result (static jobs)."""
        if self.settings.elastic:
            raise NotImplementedError("execute_single is for static jobs")
        return self.adapter.execute_single(fn)

    def shutdown(self) -> None:
        """Stop and remove every worker actor, the placement group and the rendezvous."""
        self.adapter.shutdown()
