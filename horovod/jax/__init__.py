"""``import horovod.jax as hvd``: Horovod's API on JAX arrays and pytrees, eagerly and inside ``jax.jit``.

A thin binding like ``horovod.torch``: leaves of a pytree become numpy buffers for the one engine
(:mod:`horovod.runtime.collectives`) and come back as jax arrays with the same structure and dtypes. Inside
``jax.jit`` collectives are ordered host callbacks, named after their call sites; ``jax.grad`` differentiates
them with Horovod's rules and ``jax.vmap`` batches them (:mod:`horovod.jax._transforms`). The training helpers are
an optax ``DistributedOptimizer``, ``broadcast_parameters``/``broadcast_optimizer_state`` and elastic
``hvd.elastic.JaxState``. Importing starts nothing; ``hvd.init()`` does.

Needs the ``jax`` extra: ``pip install horovod-py[jax]`` (jax and optax).
"""

try:
    import jax as _jax  # noqa: F401
except ImportError as _error:  # pragma: no cover - exercised by a test that hides jax
    raise ImportError("horovod.jax needs JAX: pip install horovod-py[jax] (installs jax and optax)") from _error

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError
from horovod.jax.compression import Compression
from horovod.jax.functions import allgather_object, broadcast_object, broadcast_optimizer_state, \
    broadcast_parameters
from horovod.jax.mpi_ops import (Handle, allgather, allgather_async, allreduce, allreduce_async, alltoall,
                                 alltoall_async, barrier, broadcast, broadcast_async, grouped_allgather,
                                 grouped_allgather_async, grouped_allreduce, grouped_allreduce_async,
                                 grouped_reducescatter, grouped_reducescatter_async, join, poll, reducescatter,
                                 reducescatter_async, synchronize)
from horovod.jax.optimizer import DistributedOptimizer, allreduce_gradients
from horovod.runtime.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                                    gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
                                    shutdown, size, start_timeline, stop_timeline)
from horovod.runtime.collectives import Adasum, Average, Max, Min, Product, Sum
from horovod.runtime.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horovod.jax import elastic  # noqa: E402 — hvd.elastic, as in the other bindings

__all__ = [
    # basics
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "HorovodInternalError", "HostsUpdatedInterrupt", "TensorMismatchError",
    # process sets and ops
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    # collectives
    "allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "synchronize", "poll", "Handle", "barrier", "join", "broadcast_object", "allgather_object",
    # training
    "Compression", "DistributedOptimizer", "allreduce_gradients", "broadcast_parameters",
    "broadcast_optimizer_state", "elastic",
]
from horovod.jax.async_optimizers import GossipOptimizer, LocalSGDOptimizer, OuterOptimizer, StaleGradients  # noqa
__all__ += ["LocalSGDOptimizer", "OuterOptimizer", "GossipOptimizer", "StaleGradients"]
