"""``import horovod.tensorflow as hvd``: Horovod's TensorFlow 2 API (eager mode and ``tf.function``): the collectives
(``mpi_ops``), ``DistributedGradientTape``, compression, broadcasts, ``SyncBatchNormalization`` and elastic state.

A thin binding over :mod:`horovod.runtime`: ops convert tensors to numpy and call the core (:mod:`.mpi_ops`, which
also registers their gradients); this package adds ``DistributedGradientTape``, the Keras ``DistributedOptimizer``
(:mod:`horovod.tensorflow.keras`), variable and object broadcasts, ``SyncBatchNormalization`` and elastic state.
Importing it starts nothing; ``hvd.init()`` does.
"""

from horovod.common.extras import require_framework

require_framework("tensorflow", "horovod.tensorflow", "tensorflow")

from horovod.runtime import binding_api
from horovod.runtime.binding_api import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                         ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                         cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
                                         gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                         mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                         remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.runtime.mpi_ops_names import check_num_rank_power_of_2
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.functions import (allgather_object, broadcast_global_variables, broadcast_object,
                                          broadcast_object_fn, broadcast_variables)
from horovod.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from horovod.tensorflow.mpi_ops import (_executing_eagerly, allgather, allreduce, alltoall, barrier, broadcast,
                                        broadcast_, grouped_allgather, grouped_allreduce, grouped_reducescatter, join,
                                        local_rank_op, local_size_op, process_set_included_op, rank_op, reducescatter,
                                        size_op)
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wrap a Keras 3 optimizer so that it applies gradients averaged over the ranks; see
    :func:`horovod.tensorflow.keras.DistributedOptimizer` (TensorFlow 1 optimizers no longer exist).

    Raises:
        ValueError: ``optimizer`` is not a Keras optimizer, or the arguments are inconsistent.
    """
    import keras
    import tensorflow as tf
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):   # TensorFlow 1's optimizers, as Horovod wraps them
        from horovod.tensorflow.v1_optimizer import DistributedV1Optimizer
        return DistributedV1Optimizer(optimizer, name=name, use_locking=use_locking, compression=compression, op=op,
                                      process_set=process_set)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"Provided optimizer doesn't inherit from a Keras optimizer: {optimizer!r} "
                         f"(TensorFlow 1 optimizers are not supported by TensorFlow 2.16+)")
    if op == Adasum:
        raise ValueError("op == Adasum is not supported yet with Keras")
    from horovod.tensorflow.keras import DistributedOptimizer as _keras_optimizer
    return _keras_optimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                            compression=compression, sparse_as_dense=sparse_as_dense,
                            gradient_predivide_factor=gradient_predivide_factor, op=op,
                            backward_passes_per_step=backward_passes_per_step,
                            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
                            groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)


from horovod.tensorflow import elastic  # noqa: E402  (a submodule, as in Horovod: hvd.elastic.run)

__all__ = binding_api.__all__ + [
    "check_num_rank_power_of_2", "rank_op", "local_rank_op", "size_op", "local_size_op", "process_set_included_op",
    # collectives
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall",
    "reducescatter", "grouped_reducescatter", "join", "barrier",
    "broadcast_variables", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn",
    "allgather_object",
    # training
    "Compression", "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer",
    "SyncBatchNormalization", "elastic",
]
