"""``SyncBatchNorm``: batch normalization whose batch statistics are taken over every rank's batch.

In training, each rank's per-channel (count, mean, variance) are allgathered and combined exactly (so ranks may
hold batches of different sizes); the backward pass allreduces the two per-channel sums the input gradient needs.
The result equals ``BatchNorm`` on the concatenation of all ranks' batches. In eval mode, or on a single rank, it
is the plain batch norm. Works on CPU tensors.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from horovod.runtime import collectives as _c
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch import async_ops as _ops
from horovod.torch._tensors import check_tensor

__all__ = ["SyncBatchNorm"]


def _reduce_dims(x: torch.Tensor):
    return [0] + list(range(2, x.dim()))


def _channel_shape(x: torch.Tensor):
    return [1, x.size(1)] + [1] * (x.dim() - 2)


def _global_stats(x: torch.Tensor, process_set: ProcessSet) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """Mean and biased variance per channel over all ranks' batches, and the total element count per channel."""
    xf = x.detach().to(torch.float64)
    dims = _reduce_dims(x)
    count = x.numel() // x.size(1)
    mean = xf.mean(dims)
    var = xf.var(dims, unbiased=False) if count else torch.zeros_like(mean)
    row = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=mean.device), mean, var]).unsqueeze(0)
    stats = _ops.synchronize(_ops.allgather_async(row, name=None, process_set=process_set))
    c = x.size(1)
    counts, means, variances = stats[:, :1], stats[:, 1:c + 1], stats[:, c + 1:]
    total = float(counts.sum())
    if total == 0:
        raise ValueError("SyncBatchNorm got empty batches on every rank")
    global_mean = (counts * means).sum(0) / total
    global_var = (counts * (variances + (means - global_mean) ** 2)).sum(0) / total
    return global_mean, global_var, total


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, total, process_set):
        """Normalise with the mean and variance of every rank's batch."""
        shape = _channel_shape(x)
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        xhat = (x.to(compute) - mean.to(compute).view(shape)) * invstd.to(compute).view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(compute).view(shape) + bias.to(compute).view(shape)
        ctx.save_for_backward(xhat, invstd.to(compute), weight)
        ctx.total, ctx.process_set, ctx.dtype = total, process_set, x.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        """The input's, weight's and bias's gradients, with the statistics' gradients summed over the ranks."""
        xhat, invstd, weight = ctx.saved_tensors
        shape, dims = _channel_shape(xhat), _reduce_dims(xhat)
        g = grad_y.to(xhat.dtype)
        grad_bias = g.sum(dims)
        grad_weight = (g * xhat).sum(dims)
        scale = weight.to(xhat.dtype) if weight is not None else torch.ones_like(grad_bias)
        sums = torch.cat([grad_bias * scale, grad_weight * scale])
        sums = _ops.synchronize(_ops.allreduce_async(sums, op=_c.Sum, process_set=ctx.process_set))
        c = grad_bias.numel()
        mean_g, mean_g_xhat = (sums[:c] / ctx.total).view(shape), (sums[c:] / ctx.total).view(shape)
        grad_x = (g * scale.view(shape) - mean_g - xhat * mean_g_xhat) * invstd.view(shape)
        if weight is None:
            return grad_x.to(ctx.dtype), None, None, None, None, None, None
        return (grad_x.to(ctx.dtype), grad_weight.to(weight.dtype), grad_bias.to(weight.dtype),
                None, None, None, None)


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the union of all ranks' batches; a drop-in for ``torch.nn.BatchNorm{1,2,3}d``.

    Args:
        num_features: channels (dimension 1 of the input).
        eps, momentum, affine, track_running_stats: as in ``torch.nn.BatchNorm2d``.
        process_set: the ranks whose batches are normalized together.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: ProcessSet = global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input`` with statistics over every rank's batch in training, like ``BatchNorm`` otherwise."""
        self._check_input_dim(input)
        check_tensor(input, "SyncBatchNorm input")
        if not self.training or self.process_set.size() == 1:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        mean, var, total = _global_stats(input, self.process_set)
        invstd = torch.rsqrt(var + self.eps)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                unbiased = var * (total / max(total - 1.0, 1.0))
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, mean, invstd, total, self.process_set)
