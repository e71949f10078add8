"""The synchronous, differentiable collectives, with Horovod's gradients.

- allreduce / grouped_allreduce: the gradient is the same allreduce (same op and scale factors) of the gradient.
- allgather: the averaged allreduce of the gradient, of which each rank keeps its own rows.
- broadcast: the averaged allreduce of the gradient on the root, zeros elsewhere.
- alltoall: the gradient travels back by an alltoall with the received splits.
- reducescatter: the allgather of the gradient, times the op's scale (1/size for Average, and the scale factors).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch import mpi_ops as _ops
from horovod.torch.compression import Compression


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return _ops.synchronize(_ops.allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                                     postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, process_set = ctx.args
        grad = _Allreduce.apply(grad_output, None, op, pre, post, process_set)
        return grad, None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(_ops.synchronize(_ops.grouped_allreduce_async(
            tensors, name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            process_set=process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        op, pre, post, process_set = ctx.args
        grads = _GroupedAllreduce.apply(None, op, pre, post, process_set, *grad_outputs)
        return (None, None, None, None, None) + tuple(grads)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.process_set = (tensor.shape[0] if tensor.dim() else 1), process_set
        return _ops.synchronize(_ops.allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        process_set = ctx.process_set
        grad = _Allreduce.apply(grad_output, None, _c.Average, 1.0, 1.0, process_set)
        rows = _ops.synchronize(_ops.allgather_async(torch.tensor([ctx.rows], dtype=torch.int64),
                                                     process_set=process_set))
        offset = int(rows[:process_set.rank()].sum())
        return grad.narrow(0, offset, ctx.rows), None, None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _ops.synchronize(_ops.broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = _Allreduce.apply(grad_output, None, _c.Average, 1.0, 1.0, ctx.process_set)
        if basics.rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _ops.synchronize(_ops.alltoall_async(tensor, splits, name=name, process_set=process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_splits):
        grad, _ = _Alltoall.apply(grad_output, ctx.received, None, ctx.process_set)
        return grad, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.process_set = process_set
        ctx.scale = prescale_factor * postscale_factor / (process_set.size() if op == _c.Average else 1)
        return _ops.synchronize(_ops.reducescatter_async(tensor, name=name, op=op, process_set=process_set,
                                                         prescale_factor=prescale_factor,
                                                         postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = _Allgather.apply(grad_output, None, ctx.process_set)
        grad = grad if ctx.scale == 1.0 else grad * ctx.scale
        return grad, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks of ``process_set`` and return the result (differentiable).

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
    op = _c.resolve_op(op, average)
    compressed, cctx = compression.compress(tensor)
    output = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(output, cctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                      compression=Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Allreduce a list of tensors as one group (differentiable); see :func:`allreduce`."""
    op = _c.resolve_op(op, average)
    compressed = [compression.compress(t) for t in tensors]
    outputs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                      *[t for t, _ in compressed])
    return [compression.decompress(o, cctx) for o, (_, cctx) in zip(outputs, compressed)]


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` on the first dimension, which may differ between ranks
    (differentiable)."""
    return _Allgather.apply(tensor, name, process_set)


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return global rank ``root_rank``'s ``tensor`` on every rank of the set (differentiable).

    Raises:
        ValueError: ``root_rank`` is not in the set. TensorMismatchError: ranks disagree on shape, dtype or root.
    """
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Send rows ``splits[i]`` of ``tensor`` to rank i of the set (equal parts when None), gather what the others
    send (differentiable). Returns the output, or ``(output, received_splits)`` when ``splits`` is given.

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
    """Reduce ``tensor`` over the set and return this rank's slice of the first dimension (differentiable).

    Raises:
        ValueError: ``op`` other than ``hvd.Sum`` or ``hvd.Average``.
    """
    compressed, cctx = compression.compress(tensor)
    output = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(output, cctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression=Compression.none, op: int = _c.Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatter a list of tensors as one group; see :func:`reducescatter` (not differentiable)."""
    compressed = [compression.compress(t) for t in tensors]
    outputs = _ops.synchronize(_ops.grouped_reducescatter_async(
        [t for t, _ in compressed], name=name, op=op, process_set=process_set, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor))
    return [compression.decompress(o, cctx) for o, (_, cctx) in zip(outputs, compressed)]
