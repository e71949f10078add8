"""The gradients of the collectives, once for every binding.

Horovod defines them so (``dy`` is the cotangent, the gradient of the loss with respect to the op's output):

=================  ==================================================================================================
op                 gradient with respect to the input
=================  ==================================================================================================
allreduce          the same allreduce of ``dy``: same op, same prescale and postscale factors
grouped allreduce  the same grouped allreduce of the ``dy`` list
allgather          the averaged allreduce of ``dy``, of which this rank keeps the rows it contributed
grouped allgather  the same, tensor by tensor (the averaged allreduces run as one grouped allreduce)
broadcast          the averaged allreduce of ``dy`` on the root rank, zeros on every other rank
alltoall           an alltoall of ``dy`` back, sending each rank the rows it sent here (the received splits)
reducescatter      the allgather of ``dy``, times ``size`` for Sum (1 for Average), times the scale factors
=================  ==================================================================================================

A binding supplies the framework's spelling of a handful of primitives as a :class:`GradientOps` (the collectives
it calls are its own differentiable ones, so gradients of gradients work), and calls these functions from its
``autograd.Function.backward``, ``tf.custom_gradient`` or ``jax.custom_vjp`` rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Sequence

from horovod.runtime import basics
from horovod.runtime.collectives import Average, Sum
from horovod.runtime.gradient_policy import set_rank, set_size
from horovod.runtime.process_sets import ProcessSet

__all__ = ["GradientOps", "allreduce_grad", "grouped_allreduce_grad", "allgather_grad", "grouped_allgather_grad",
           "broadcast_grad", "alltoall_grad", "reducescatter_grad", "reducescatter_grad_scale"]


@dataclass(frozen=True)
class GradientOps:
    """The framework primitives the gradient rules are written in. Every callable takes and returns the
    framework's tensors.

    Attributes:
        grouped_allreduce: ``(tensors, op, prescale_factor, postscale_factor, process_set) -> tensors``; a list of
            one is a plain allreduce.
        allgather: ``(tensor, process_set) -> tensor``, concatenated on the first dimension.
        alltoall: ``(tensor, splits, process_set) -> tensor``, the output only.
        scale: ``(tensor, factor: float) -> tensor``.
        zeros_like: ``tensor -> tensor``.
        row_count: ``tensor -> a one-element int64 tensor`` holding its first dimension (1 for a scalar).
        rows: ``(tensor, counts, index, like) -> tensor``: block ``index`` of ``tensor`` split on its first
            dimension into blocks of ``counts`` rows, shaped like ``like`` (a scalar input's block is a scalar).
    """

    grouped_allreduce: Callable[..., List[Any]]
    allgather: Callable[[Any, ProcessSet], Any]
    alltoall: Callable[[Any, Any, ProcessSet], Any]
    scale: Callable[[Any, float], Any]
    zeros_like: Callable[[Any], Any]
    row_count: Callable[[Any], Any]
    rows: Callable[[Any, Any, int, Any], Any]


def allreduce_grad(ops: GradientOps, dy, op, prescale_factor: float, postscale_factor: float,
                   process_set: ProcessSet):
    """An allreduce's input gradient: the same allreduce of ``dy``."""
    return ops.grouped_allreduce([dy], op, prescale_factor, postscale_factor, process_set)[0]


def grouped_allreduce_grad(ops: GradientOps, dys: Sequence, op, prescale_factor: float, postscale_factor: float,
                           process_set: ProcessSet) -> List[Any]:
    """A grouped allreduce's input gradients: the same grouped allreduce of the ``dys``."""
    return list(ops.grouped_allreduce(list(dys), op, prescale_factor, postscale_factor, process_set))


def allgather_grad(ops: GradientOps, dy, x, process_set: ProcessSet):
    """An allgather's input gradient: the averaged allreduce of ``dy``, sliced to the rows ``x`` contributed.

    ``x`` is the forward input (its row count is gathered again, so ranks may have contributed different counts).
    """
    return grouped_allgather_grad(ops, [dy], [x], process_set)[0]


def grouped_allgather_grad(ops: GradientOps, dys: Sequence, xs: Sequence, process_set: ProcessSet) -> List[Any]:
    """A grouped allgather's input gradients: one grouped averaged allreduce of the ``dys``, each sliced to the rows
    its ``x`` contributed (a list of one is a plain allgather's)."""
    reduced = ops.grouped_allreduce(list(dys), Average, 1.0, 1.0, process_set)
    me = set_rank(process_set)
    return [ops.rows(r, ops.allgather(ops.row_count(x), process_set), me, x) for r, x in zip(reduced, xs)]


def broadcast_grad(ops: GradientOps, dy, root_rank: int, process_set: ProcessSet):
    """A broadcast's input gradient: the averaged allreduce of ``dy`` on the root (a global rank), zeros elsewhere.

    Every member runs the allreduce, so the ranks stay in step.
    """
    reduced = ops.grouped_allreduce([dy], Average, 1.0, 1.0, process_set)[0]
    return reduced if basics.rank() == root_rank else ops.zeros_like(reduced)


def alltoall_grad(ops: GradientOps, dy, received_splits, process_set: ProcessSet):
    """An alltoall's input gradient: ``dy`` sent back with the splits the forward op received."""
    return ops.alltoall(dy, received_splits, process_set)


def reducescatter_grad(ops: GradientOps, dys: Sequence, op, prescale_factor: float, postscale_factor: float,
                       process_set: ProcessSet) -> List[Any]:
    """A (grouped) reducescatter's input gradients: the allgather of each ``dy``, times
    :func:`reducescatter_grad_scale`."""
    scale = reducescatter_grad_scale(op, set_size(process_set), prescale_factor, postscale_factor)
    grads = [ops.allgather(dy, process_set) for dy in dys]
    return grads if scale == 1.0 else [ops.scale(g, scale) for g in grads]


def reducescatter_grad_scale(op, size: int, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> float:
    """Horovod's factor on a reducescatter's gradient: ``size`` for Sum, 1 for Average, times both scale factors.

    So a cotangent of ones gives ``size`` on every input element of a Sum and 1 of an Average (Horovod's rule,
    not the plain vector-Jacobian product, which would be 1 and ``1/size``).
    """
    return (size if op == Sum else 1) * prescale_factor * postscale_factor
