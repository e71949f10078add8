"""The names every binding exports alike: ``init``, ``rank``, ``size`` and the other basics, the errors, the process
sets and the reduction ops.

A binding's ``__init__`` imports these names from here by name and adds :data:`__all__` to its own list, so
``hvd.rank()`` is the same function under ``horovod.torch``, ``horovod.tensorflow``, ``horovod.keras``,
``horovod.numpy`` and ``horovod.jax``, declared once. A name added here is added to each binding's import too
(``tests/test_compat_imports.py`` checks that every binding exports all of :data:`__all__`).
"""

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError
from horovod.runtime.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
                                    shutdown, size, start_timeline, stop_timeline)
from horovod.runtime.collectives import Adasum, Average, Max, Min, Product, Sum
from horovod.runtime.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set

__all__ = [
    # basics
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    # errors
    "HorovodInternalError", "HostsUpdatedInterrupt", "TensorMismatchError",
    # process sets and ops
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
]
