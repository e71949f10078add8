"""Horovod on a Ray cluster: Ray schedules the workers, Horovod moves the tensors. It holds ``RayExecutor`` (static),
``ElasticRayExecutor`` (elastic) and the Ray Train ``HorovodTrainer``, with their actors and their placement.

Workers are Ray actors. The driver (:class:`RayExecutor`, :class:`ElasticRayExecutor`, or the Ray Train backend of
:class:`HorovodTrainer`) learns which Ray node each actor landed on, serves the job's rendezvous and gives each actor
the ``HOROVOD_*`` environment a ``horovodrun`` worker gets; ``hvd.init()`` in the actors then meets the others and
moves tensors directly between them (TCP between nodes, shared memory within a node). A Ray node is a host:
``hvd.local_rank()``, ``local_size()`` and ``cross_rank()`` say where Ray put each worker.

``HorovodTrainer`` is imported on first use: it needs ``ray.train``, which takes seconds to import.
"""

try:
    import ray  # noqa: F401
except ImportError as _exc:  # pragma: no cover — exercised without Ray installed
    from horovod.common.extras import install_hint
    raise ImportError(f"horovod.ray needs Ray, which is not installed: {install_hint('ray')}") from _exc

from horovod.ray.elastic import ElasticRayExecutor, RayHostDiscovery
from horovod.ray.runner import RayExecutor
from horovod.ray.worker import BaseHorovodWorker

__all__ = ["RayExecutor", "ElasticRayExecutor", "BaseHorovodWorker", "RayHostDiscovery", "HorovodTrainer",
           "HorovodConfig"]


def __getattr__(name: str):
    """``HorovodTrainer`` and ``HorovodConfig``, imported from :mod:`horovod.ray.train` on first use."""
    if name in ("HorovodTrainer", "HorovodConfig"):
        import horovod.ray.train as _train
        return getattr(_train, name)
    raise AttributeError(f"module 'horovod.ray' has no attribute {name!r}")
