"""``HorovodTrainer``: Horovod as a Ray Train backend, on Ray Train's public data-parallel trainer API.

Ray Train starts the workers, places them, hands out dataset shards and collects ``ray.train.report`` metrics and
checkpoints into a ``Result``, as for ``TorchTrainer``. This module adds the Horovod backend
(:class:`HorovodConfig`): before the training function runs, it learns every worker's Ray node, serves the job's
rendezvous from the Train controller and gives each worker the environment a ``horovodrun`` worker gets
(:func:`horovod.runner.pipeline.plan_launches`), with Horovod's ranks equal to Ray Train's world ranks. The training
function then calls ``hvd.init()`` as under ``horovodrun``.

Built on Ray Train V2 (the default since Ray 2.43): ``ray.train.v2.api.data_parallel_trainer.DataParallelTrainer``
and its ``backend_config`` hook (``ray.train.backend.BackendConfig``/``Backend``, a Ray developer API). With
``RAY_TRAIN_V2_ENABLED=0`` Ray refuses V2 trainers; use :class:`~horovod.ray.RayExecutor` there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Set

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from horovod.common import config
from horovod.ray.placement import node_hostname, slots_in_rank_order
from horovod.ray.utils import driver_address, job_extra_env, settings_env
from horovod.runner.pipeline import LaunchConfig, plan_launches
from horovod.runner.rendezvous import RendezvousPool

__all__ = ["HorovodConfig", "HorovodTrainer"]


def _node_hostname() -> str:
    return node_hostname(ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id())


def _set_env(env: Dict[str, str]) -> None:
    for name, value in env.items():
        config.environ_set(name, value)


@dataclasses.dataclass
class HorovodConfig(BackendConfig):
    """Horovod's settings for a Ray Train run (the fields of Ray's former ``HorovodConfig`` that apply here).

    Args:
        nics: network interfaces for the data plane (``HOROVOD_GLOO_IFACE``).
        verbose: accepted for compatibility.
        timeout_s: seconds for the workers to start and meet (``HOROVOD_START_TIMEOUT``).
        placement_group_timeout_s: accepted for compatibility (Ray Train places the workers).
    """

    nics: Optional[Set[str]] = None
    verbose: int = 1
    timeout_s: int = 300
    placement_group_timeout_s: int = 100

    @property
    def backend_cls(self):
        """The backend Ray Train runs for this config."""
        return _HorovodBackend

    @property
    def framework(self) -> Optional[str]:
        """Not one of Ray's own frameworks."""
        return None


class _HorovodBackend(Backend):
    """Sets every worker's Horovod environment at the start of a run; stops the rendezvous at its end."""

    share_cuda_visible_devices = True

    def on_start(self, worker_group, backend_config: HorovodConfig) -> None:
        hostnames = worker_group.execute(_node_hostname)
        slots = slots_in_rank_order(hostnames)
        self._pool = RendezvousPool()
        extra = job_extra_env(backend_config.timeout_s, backend_config.nics, None)
        launches = plan_launches(LaunchConfig((), tuple(slots), extra_env=extra),
                                 self._pool.serve(driver_address()), base_env=settings_env())
        config.report_variables(launches[0].env)  # once here; the actors leave it to the driver
        ray.get([worker_group.execute_single_async(launch.rank, _set_env, dict(launch.env)) for launch in launches])

    def on_shutdown(self, worker_group, backend_config: HorovodConfig) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
            self._pool = None


class HorovodTrainer(DataParallelTrainer):
    """A Ray Train trainer whose workers run Horovod (call ``hvd.init()`` in ``train_loop_per_worker``).

    Args:
        train_loop_per_worker: the training function, with or without a ``config`` argument.
        train_loop_config: passed to it.
        horovod_config: Horovod's settings (:class:`HorovodConfig`).
        scaling_config, run_config, datasets, dataset_config: as for any Ray Train trainer.
        metadata, resume_from_checkpoint: refused by Ray Train V2 as for every trainer.
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict] = None,
                 horovod_config: Optional[HorovodConfig] = None, scaling_config=None, dataset_config=None,
                 run_config=None, datasets: Optional[Dict[str, Any]] = None, metadata: Optional[Dict] = None,
                 resume_from_checkpoint=None):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=horovod_config or HorovodConfig(), scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, dataset_config=dataset_config,
                         metadata=metadata, resume_from_checkpoint=resume_from_checkpoint)
