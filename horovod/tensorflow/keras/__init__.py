"""``import horovod.tensorflow.keras as hvd``: Horovod's Keras API for Keras 3 on the TensorFlow backend: the
``DistributedOptimizer`` (``optimizer``), the training ``callbacks``, value-level collectives and elastic state.

``DistributedOptimizer`` wraps any Keras 3 optimizer (:mod:`.optimizer`); :mod:`.callbacks` holds the training
callbacks and :mod:`.elastic` the elastic state. The value-level collectives here take and return numpy values (as
Horovod's Keras API returns ``backend.get_value`` results); use :mod:`horovod.tensorflow` for tensors.
"""

from __future__ import annotations

from horovod.common.extras import require_framework

require_framework("keras", "horovod.tensorflow.keras", "tensorflow")


from typing import Optional

import keras
import numpy as np

from horovod.runtime import binding_api
from horovod.runtime.binding_api import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                         ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                         cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
                                         gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                         mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                         remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.tensorflow import mpi_ops as _ops
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.functions import allgather_object, broadcast_object, broadcast_variables
from horovod.tensorflow.keras import callbacks
from horovod.tensorflow.keras.optimizer import (DistributedOptimizer, PartialDistributedOptimizer,
                                                distribute_in_place)
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization


def broadcast_global_variables(root_rank: int):
    """TensorFlow 1's global variables do not exist in Keras 3.

    Raises:
        NotImplementedError: always; use ``hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)`` in ``fit``
            or ``hvd.broadcast_variables(model.variables, root_rank)``.
    """
    raise NotImplementedError("Keras 3 has no global variables: use "
                              "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) in model.fit, or "
                              "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank)")


def allreduce(value, name: Optional[str] = None, average=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None, compression=Compression.none,
              process_set=global_process_set) -> np.ndarray:
    """Reduce a value (array, tensor or number) over the ranks and return the result as a numpy value."""
    return _ops.allreduce(value, average=average, name=name, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, compression=compression,
                          process_set=process_set).numpy()


def allgather(value, name: Optional[str] = None, process_set=global_process_set) -> np.ndarray:
    """Concatenate every rank's value on the first dimension; returns a numpy array."""
    return _ops.allgather(value, name=name, process_set=process_set).numpy()


def broadcast(value, root_rank: int, name: Optional[str] = None, process_set=global_process_set) -> np.ndarray:
    """``root_rank``'s value on every rank, as a numpy value."""
    return _ops.broadcast(value, root_rank, name=name, process_set=process_set).numpy()


def reducescatter(value, name: Optional[str] = None, op=Average, process_set=global_process_set) -> np.ndarray:
    """Reduce a value over the ranks and return this rank's rows, as a numpy array."""
    return _ops.reducescatter(value, name=name, op=op, process_set=process_set).numpy()


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """Load a saved Keras model and wrap its optimizer in a :func:`DistributedOptimizer`, keeping its state.

    Args:
        filepath: a ``.keras`` file (or anything ``keras.models.load_model`` takes).
        custom_optimizers: optimizer classes the model may use beyond Keras' own.
        custom_objects: as for ``keras.models.load_model``.
        compression: the wrapped optimizer's gradient compression.
        legacy_opts: accepted for compatibility (Keras 3 has no legacy optimizers).
    Returns:
        The model; ``model.optimizer`` reduces gradients over the ranks.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        distribute_in_place(optimizer, compression)
    return model


from horovod.runtime.gossip import gossip_process_sets  # noqa: E402
from horovod.tensorflow.keras.async_optimizers import GossipOptimizer, LocalSGDOptimizer, OuterOptimizer  # noqa: E402
from horovod.tensorflow.keras import elastic  # noqa: E402  (needs the names above)

__all__ = binding_api.__all__ + [
    "Compression",
    "DistributedOptimizer", "PartialDistributedOptimizer", "SyncBatchNormalization", "broadcast_global_variables",
    "broadcast_variables", "broadcast_object", "allgather_object", "allreduce", "allgather", "broadcast",
    "reducescatter", "load_model", "callbacks", "elastic",
]
__all__ += ["LocalSGDOptimizer", "OuterOptimizer", "GossipOptimizer", "gossip_process_sets"]
