"""``import horovod.jax as hvd``: Horovod's API on JAX arrays and pytrees, eagerly and inside ``jax.jit``: the
collectives (``mpi_ops``), an optax ``DistributedOptimizer``, compression, broadcasts and elastic state.

A thin binding like ``horovod.torch``: leaves of a pytree become numpy buffers for the one engine
(:mod:`horovod.runtime.collectives`) and come back as jax arrays with the same structure and dtypes. Inside
``jax.jit`` collectives are ordered host callbacks, named after their call sites; ``jax.grad`` differentiates
them with Horovod's rules and ``jax.vmap`` batches them (:mod:`horovod.jax._transforms`). The training helpers are
an optax ``DistributedOptimizer``, ``broadcast_parameters``/``broadcast_optimizer_state`` and elastic
``hvd.elastic.JaxState``. Importing starts nothing; ``hvd.init()`` does.

Needs the ``jax`` extra (jax and optax): ``pip install -e '.[jax]'`` in a checkout, ``'<wheel>[jax]'`` with a wheel.
"""

from horovod.common.extras import require_framework

require_framework("jax", "horovod.jax", "jax")

from horovod.runtime import binding_api
from horovod.runtime.binding_api import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                         ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                         cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
                                         gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                         mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                         remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.jax.compression import Compression
from horovod.jax.functions import allgather_object, broadcast_object, broadcast_optimizer_state, \
    broadcast_parameters
from horovod.jax.mpi_ops import (Handle, allgather, allgather_async, allreduce, allreduce_async, alltoall,
                                 alltoall_async, barrier, broadcast, broadcast_async, grouped_allgather,
                                 grouped_allgather_async, grouped_allreduce, grouped_allreduce_async,
                                 grouped_reducescatter, grouped_reducescatter_async, join, poll, reducescatter,
                                 reducescatter_async, synchronize)
from horovod.jax.optimizer import DistributedOptimizer, allreduce_gradients
from horovod.jax import elastic  # noqa: E402 — hvd.elastic, as in the other bindings

__all__ = binding_api.__all__ + [
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
