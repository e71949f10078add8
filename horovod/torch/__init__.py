"""``import horovod.torch as hvd``: Horovod's PyTorch API on CPU tensors: the collectives with integer handles
(``mpi_ops``), autograd, compression, ``DistributedOptimizer``, broadcasts, ``SyncBatchNorm`` and elastic state.

A thin binding over :mod:`horovod.runtime`: tensors go to the core as zero-copy numpy views; this package adds
integer handles (:mod:`.mpi_ops`), autograd (:mod:`.autograd`), compression, ``DistributedOptimizer``,
parameter/optimizer-state broadcast (:mod:`.functions`) and ``SyncBatchNorm``. Importing it starts nothing;
``hvd.init()`` does.
"""

from horovod.common.extras import require_framework

require_framework("torch", "horovod.torch", "torch",
                  "; on a machine without a GPU, torch's CPU-only wheel (PyTorch's CPU wheel index) is a "
                  "tenth of the size; docs/gpu.md says what a GPU needs")

from horovod.runtime import binding_api
from horovod.runtime.binding_api import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                                         ProcessSet, Product, Sum, TensorMismatchError, add_process_set, ccl_built,
                                         cross_rank, cross_size, cuda_built, ddl_built, global_process_set, gloo_built,
                                         gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                                         mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                         remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)
from horovod.torch.autograd import (allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
                                    grouped_reducescatter, reducescatter)
from horovod.torch.compression import Compression
from horovod.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                     broadcast_parameters)
from horovod.torch.async_ops import (allgather_async, allreduce_, allreduce_async, allreduce_async_, alltoall_async,
                                   barrier, broadcast_, broadcast_async, broadcast_async_, grouped_allgather_async,
                                   grouped_allreduce_, grouped_allreduce_async,
                                   grouped_allreduce_async_, grouped_reducescatter_async, join, poll,
                                   reducescatter_async, sparse_allreduce_async, synchronize)
from horovod.torch.optimizer import DistributedOptimizer
from horovod.torch.sync_batch_norm import SyncBatchNorm
from horovod.runtime.gossip import gossip_process_sets  # noqa: E402
from horovod.torch.async_optimizers import GossipOptimizer, LocalSGDOptimizer, OuterOptimizer  # docs/async.md
from horovod.torch import elastic  # noqa: E402 — hvd.elastic, as in Horovod
from horovod.runtime.device import register_plane as _register_plane
from horovod.torch.device_plane import plane_factory as _plane_factory

_register_plane(_plane_factory)     # every later hvd.init() may give its job the NCCL (or Gloo stand-in) plane

__all__ = binding_api.__all__ + [
    # collectives
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "poll", "synchronize", "join", "barrier", "broadcast_object", "allgather_object",
    # training
    "Compression", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "SyncBatchNorm",
]
__all__ += ["LocalSGDOptimizer", "OuterOptimizer", "GossipOptimizer", "gossip_process_sets"]
