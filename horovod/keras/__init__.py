"""``import horovod.keras as hvd``: Horovod's standalone-Keras API, which with Keras 3 is the same as
:mod:`horovod.tensorflow.keras` (Keras 3 on the TensorFlow backend), except that ``allreduce`` averages by default
as Horovod's ``horovod.keras`` did."""

from typing import Optional

from horovod.tensorflow.keras import (Adasum, Average, Compression, DistributedOptimizer, GossipOptimizer,
                                      HorovodInternalError, HostsUpdatedInterrupt, LocalSGDOptimizer, Max, Min,
                                      OuterOptimizer, PartialDistributedOptimizer, ProcessSet, Product, Sum,
                                      SyncBatchNormalization, TensorMismatchError, add_process_set, allgather,
                                      allgather_object, broadcast, broadcast_global_variables, broadcast_object,
                                      broadcast_variables, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                      global_process_set, gloo_built, gloo_enabled, gossip_process_sets, init,
                                      is_homogeneous, is_initialized, load_model, local_rank, local_size, mpi_built,
                                      mpi_enabled, mpi_threads_supported, nccl_built, rank, reducescatter,
                                      remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.tensorflow.keras import __all__ as _tf_keras_all
from horovod.tensorflow.keras import allreduce as _allreduce
from horovod.keras import callbacks, elastic  # noqa: F401


def allreduce(value, name: Optional[str] = None, average=True, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None, compression=Compression.none,
              process_set=global_process_set):
    """Reduce a value over the ranks and return a numpy value (averaged unless ``average=False`` or ``op``)."""
    if op is not None:
        average = None
    return _allreduce(value, name=name, average=average, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, op=op, compression=compression, process_set=process_set)


__all__ = list(_tf_keras_all)
