"""``import horovod.numpy as hvd``: Horovod's API on numpy arrays: ``init``/``rank``/``size``, the collectives and
their ``*_async`` handles, in-place variants, process sets, compression and object broadcasts, in this one file.

The same shape as ``horovod.torch``; it is also the binding the core's own tests use. Handles returned by the
``*_async`` functions are :class:`horovod.core.handles.Handle` objects; ``synchronize`` returns their result.
"""

from __future__ import annotations

import numpy as np

from horovod.runtime import binding_api
from horovod.runtime.binding_api import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                         ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                         cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
                                         gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                         mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                         remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.runtime.collectives import (Handle, allgather, allgather_async, allgather_object, allreduce,
                                         allreduce_async, alltoall, alltoall_async, barrier, broadcast,
                                         broadcast_async, broadcast_object, grouped_allgather_async,
                                         grouped_allreduce_async, grouped_reducescatter_async, join, reducescatter,
                                         reducescatter_async)
from horovod.runtime.compression import Compression


def poll(handle: Handle) -> bool:
    """True when the collective behind ``handle`` has completed (successfully or not)."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for ``handle`` and return its result; raises the collective's error."""
    return handle.result()


def allreduce_(array: np.ndarray, **kwargs) -> np.ndarray:
    """In-place :func:`allreduce`: ``array`` receives the result (same keyword arguments)."""
    return allreduce_async(array, output=array, **kwargs).result()


def allreduce_async_(array: np.ndarray, **kwargs) -> Handle:
    """In-place :func:`allreduce_async`."""
    return allreduce_async(array, output=array, **kwargs)


def broadcast_(array: np.ndarray, root_rank: int, **kwargs) -> np.ndarray:
    """In-place :func:`broadcast`: ``array`` receives the root's values."""
    return broadcast_async(array, root_rank, output=array, **kwargs).result()


def broadcast_async_(array: np.ndarray, root_rank: int, **kwargs) -> Handle:
    """In-place :func:`broadcast_async`."""
    return broadcast_async(array, root_rank, output=array, **kwargs)


def grouped_allreduce(arrays, **kwargs):
    """:func:`grouped_allreduce_async`, waited for: the list of reduced arrays."""
    return grouped_allreduce_async(arrays, **kwargs).result()


def grouped_allreduce_(arrays, **kwargs):
    """In-place :func:`grouped_allreduce`: each array receives its result."""
    return grouped_allreduce_async(arrays, outputs=arrays, **kwargs).result()


def grouped_allreduce_async_(arrays, **kwargs):
    """In-place :func:`grouped_allreduce_async`."""
    return grouped_allreduce_async(arrays, outputs=arrays, **kwargs)


def grouped_allgather(arrays, **kwargs):
    """:func:`grouped_allgather_async`, waited for: the list of gathered arrays."""
    return grouped_allgather_async(arrays, **kwargs).result()


def grouped_reducescatter(arrays, **kwargs):
    """:func:`grouped_reducescatter_async`, waited for: this rank's slice of each array."""
    return grouped_reducescatter_async(arrays, **kwargs).result()


__all__ = binding_api.__all__ + [
    "Handle", "Compression",
    "poll", "synchronize", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "broadcast_object",
    "allgather_object",
]
