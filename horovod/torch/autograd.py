"""The synchronous, differentiable collectives; their gradients are Horovod's, as written once in
:mod:`horovod.runtime.collective_gradients` (this module only spells the primitives those rules use in torch).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from horovod.runtime import collective_gradients as _grads
from horovod.runtime import collectives as _c
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.compression import compress_all, decompress_all
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch import async_ops as _ops
from horovod.torch.compression import Compression

__all__ = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
           "reducescatter", "grouped_reducescatter"]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _ops.synchronize(_ops.allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                                     postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (_grads.allreduce_grad(_OPS, grad_output, *ctx.args),) + (None,) * 5


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(_ops.synchronize(_ops.grouped_allreduce_async(
            tensors, name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            process_set=process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None,) * 5 + tuple(_grads.grouped_allreduce_grad(_OPS, grad_outputs, *ctx.args))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.shape, ctx.process_set = tensor.shape, process_set
        return _ops.synchronize(_ops.allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        like = torch.empty(ctx.shape, device="meta")    # the input's shape, without keeping the input
        return _grads.allgather_grad(_OPS, grad_output, like, ctx.process_set), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.shapes, ctx.process_set = [t.shape for t in tensors], process_set
        return tuple(_ops.synchronize(_ops.grouped_allgather_async(tensors, name=name, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        likes = [torch.empty(shape, device="meta") for shape in ctx.shapes]
        return (None, None) + tuple(_grads.grouped_allgather_grad(_OPS, grad_outputs, likes, ctx.process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _ops.synchronize(_ops.broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return _grads.broadcast_grad(_OPS, grad_output, ctx.root_rank, ctx.process_set), None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _ops.synchronize(_ops.alltoall_async(tensor, splits, name=name, process_set=process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_splits):
        return _grads.alltoall_grad(_OPS, grad_output, ctx.received, ctx.process_set), None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        kwargs = dict(name=name, op=op, process_set=process_set, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)
        if len(tensors) == 1:
            return _ops.synchronize(_ops.reducescatter_async(tensors[0], **kwargs))
        return tuple(_ops.synchronize(_ops.grouped_reducescatter_async(tensors, **kwargs)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None,) * 5 + tuple(_grads.reducescatter_grad(_OPS, grad_outputs, *ctx.args))


def _grouped_allreduce(tensors, op, prescale_factor, postscale_factor, process_set) -> List[torch.Tensor]:
    if len(tensors) == 1:
        return [_Allreduce.apply(tensors[0], None, op, prescale_factor, postscale_factor, process_set)]
    return list(_GroupedAllreduce.apply(None, op, prescale_factor, postscale_factor, process_set, *tensors))


def _rows(tensor, counts, index, like):
    offset = int(counts[:index].sum())
    block = tensor.narrow(0, offset, int(counts[index]))
    return block.reshape(like.shape)


_OPS = _grads.GradientOps(
    grouped_allreduce=_grouped_allreduce,
    allgather=lambda t, ps: _Allgather.apply(t, None, ps),
    alltoall=lambda t, splits, ps: _Alltoall.apply(t, splits, None, ps)[0],
    scale=lambda t, factor: t * factor,
    zeros_like=torch.zeros_like,
    row_count=lambda x: torch.tensor([x.shape[0] if x.dim() else 1], dtype=torch.int64),
    rows=_rows,
)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks of ``process_set`` and return the result (differentiable: the gradient is
    the same allreduce of the output's gradient).

    Args:
        tensor: a CPU tensor, the same shape and dtype on every rank.
        average: deprecated; use ``op``.
        name: a name unique among pending collectives (auto-numbered when None).
        compression: applied before the reduction and undone after it (``hvd.Compression.fp16``...).
        op: ``hvd.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor, postscale_factor: multiply the input before and the result after the reduction.
        process_set: the ranks taking part.
    Raises:
        ValueError: ``op`` and ``average`` both given, a GPU tensor, or an op the dtype cannot take.
        TensorMismatchError: ranks disagree on shape, dtype or op.
    """
    return _allreduce([tensor], False, average, name, compression, op, prescale_factor, postscale_factor,
                      process_set)[0]


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                      compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allreduce a list of tensors as one group, negotiated and fused together (differentiable); see
    :func:`allreduce`."""
    return _allreduce(list(tensors), True, average, name, compression, op, prescale_factor, postscale_factor,
                      process_set)


def _allreduce(tensors, grouped, average, name, compression, op, prescale_factor, postscale_factor, process_set):
    op = _policy.resolve_op(op, average)
    prescale_factor, postscale_factor = _policy.check_scale_factors(prescale_factor, postscale_factor)
    if not tensors:
        return []
    compressed, ctxs = compress_all(compression, tensors)
    if grouped:
        outputs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, *compressed)
    else:
        outputs = [_Allreduce.apply(compressed[0], name, op, prescale_factor, postscale_factor, process_set)]
    return decompress_all(compression, outputs, ctxs)


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` on the first dimension, which may differ between ranks (differentiable:
    the gradient is the averaged allreduce of the output's gradient, sliced to this rank's rows)."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allgather a list of tensors as one group, negotiated together (differentiable: each gradient is the
    averaged allreduce of its output's gradient, sliced to this rank's rows, the allreduces run as one group)."""
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return global rank ``root_rank``'s ``tensor`` on every rank of the set (differentiable: the gradient is the
    averaged allreduce of the output's gradient on the root, zeros elsewhere).

    Raises:
        ValueError: ``root_rank`` is not in the set. TensorMismatchError: ranks disagree on shape, dtype or root.
    """
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Send rows ``splits[i]`` of ``tensor`` to rank i of the set (equal parts when None), gather what the others
    send (differentiable: the gradient travels back with the received splits). Returns the output, or
    ``(output, received_splits)`` when ``splits`` is given.

    Raises:
        ValueError: no ``splits`` and the first dimension does not divide by the set's size, or bad ``splits``.
    """
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression=Compression.none,
                  op: int = _c.Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the set and return this rank's slice of the first dimension; ranks below
    ``dim0 % size`` get one extra row (differentiable, by Horovod's rule: the gradient is the allgather of the
    output's gradient, times the set's size for ``hvd.Sum``, times the scale factors).

    Raises:
        UnsupportedOperationError: ``op`` other than ``hvd.Sum`` or ``hvd.Average`` (Adasum...), or a 0-d tensor;
            a ``RuntimeError``, as Horovod raises.
    """
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                                 postscale_factor)[0]


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression=Compression.none, op: int = _c.Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatter a list of tensors as one group (differentiable); see :func:`reducescatter`. A list of one
    tensor is a plain reducescatter."""
    _policy.check_reducescatter_op(op, [t.dim() for t in tensors])
    prescale_factor, postscale_factor = _policy.check_scale_factors(prescale_factor, postscale_factor)
    if not tensors:
        return []
    compressed, ctxs = compress_all(compression, tensors)
    outputs = _Reducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *compressed)
    return decompress_all(compression, [outputs] if len(compressed) == 1 else outputs, ctxs)
