"""``import horovod.numpy as hvd``: Horovod's API on numpy arrays.

The same shape as ``horovod.torch``; it is also the binding the core's own tests use. Handles returned by the
``*_async`` functions are :class:`horovod.core.handles.Handle` objects; ``synchronize`` returns their result.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from horovod.runtime.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                                   gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                   mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
                                   shutdown, size, start_timeline, stop_timeline)
from horovod.runtime.collectives import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                                        allgather_object, allreduce, allreduce_async, alltoall, alltoall_async,
                                        barrier, broadcast, broadcast_async, broadcast_object,
                                        grouped_allgather_async, grouped_allreduce_async,
                                        grouped_reducescatter_async, join, reducescatter, reducescatter_async)
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.runtime.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horovod.core.handles import Handle


def poll(handle: Handle) -> bool:
    """True when the collective behind ``handle`` has completed (successfully or not)."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for ``handle`` and return its result; raises the collective's error."""
    return handle.result()


def allreduce_(array: np.ndarray, **kwargs) -> np.ndarray:
    """In-place allreduce: ``array`` receives the result."""
    return allreduce_async(array, output=array, **kwargs).result()


def allreduce_async_(array: np.ndarray, **kwargs) -> Handle:
    return allreduce_async(array, output=array, **kwargs)


def broadcast_(array: np.ndarray, root_rank: int, **kwargs) -> np.ndarray:
    """In-place broadcast: ``array`` receives the root's values."""
    return broadcast_async(array, root_rank, output=array, **kwargs).result()


def broadcast_async_(array: np.ndarray, root_rank: int, **kwargs) -> Handle:
    return broadcast_async(array, root_rank, output=array, **kwargs)


def grouped_allreduce(arrays, **kwargs):
    return grouped_allreduce_async(arrays, **kwargs).result()


def grouped_allreduce_(arrays, **kwargs):
    return grouped_allreduce_async(arrays, outputs=arrays, **kwargs).result()


def grouped_allreduce_async_(arrays, **kwargs):
    return grouped_allreduce_async(arrays, outputs=arrays, **kwargs)


def grouped_allgather(arrays, **kwargs):
    return grouped_allgather_async(arrays, **kwargs).result()


def grouped_reducescatter(arrays, **kwargs):
    return grouped_reducescatter_async(arrays, **kwargs).result()


__all__ = [name for name in dir() if not name.startswith("_") and name not in ("np", "annotations", "Optional")]
