"""Horovod's ``horovod.torch.mpi_ops``: every op and name that module had, for code that imports it from there.

The ops live where they belong — asynchronous and in-place ones in :mod:`horovod.torch.async_ops`, the
differentiable synchronous ones in :mod:`horovod.torch.autograd` — and the basics, op constants, process sets and
``_basics`` come from :mod:`horovod.runtime.mpi_ops_names`; each name here is the same object as ``hvd.<name>``.
"""

from horovod.runtime.mpi_ops_names import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                           ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                           check_num_rank_power_of_2, cross_rank, cross_size, cuda_built, ddl_built,
                                           global_process_set, gloo_built, gloo_enabled,
                                           handle_average_backwards_compatibility, init, is_homogeneous, is_initialized,
                                           local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                           nccl_built, rank, remove_process_set, rocm_built, shutdown, size,
                                           start_timeline, stop_timeline)
from horovod.runtime.mpi_ops_names import __all__ as _names
from horovod.runtime.mpi_ops_names import _basics  # noqa: F401 — Horovod's mpi_ops._basics
from horovod.torch.async_ops import (allgather_async, allreduce_, allreduce_async, allreduce_async_, alltoall_async,
                                     barrier, broadcast_, broadcast_async, broadcast_async_, grouped_allgather_async,
                                     grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                                     grouped_reducescatter_async, join, poll, reducescatter_async,
                                     sparse_allreduce_async, synchronize)
from horovod.torch.async_ops import __all__ as _async_names
from horovod.torch.autograd import (allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
                                    grouped_reducescatter, reducescatter)
from horovod.torch.autograd import __all__ as _sync_names

__all__ = list(_names) + list(_async_names) + list(_sync_names)
