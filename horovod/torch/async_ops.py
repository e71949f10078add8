"""Asynchronous collectives on torch tensors, and Horovod's integer handles (``poll``, ``synchronize``).

Every function here converts tensors to numpy (see :mod:`horovod.torch._tensors`), calls the one implementation in
:mod:`horovod.runtime.collectives`, and registers the core's handle under an integer id, as Horovod's torch API does.
``synchronize(handle)`` returns the output tensor. In-place variants (trailing ``_``) write into their input.
The differentiable synchronous ops live in :mod:`horovod.torch.autograd`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from horovod.common.exceptions import HorovodInternalError
from horovod.runtime import collectives as _c
from horovod.runtime import context as _context
from horovod.runtime import gradient_policy as _policy
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.torch._tensors import (as_input, as_input_view, as_output, check_tensor, inplace_view, settle,
                                    to_tensor)

__all__ = ["poll", "synchronize", "allreduce_async", "allreduce_async_", "allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "grouped_allreduce_", "sparse_allreduce_async", "allgather_async",
           "grouped_allgather_async", "broadcast_async", "broadcast_async_", "broadcast_",
           "alltoall_async", "reducescatter_async", "grouped_reducescatter_async", "join", "barrier"]

# Process-lifetime (docs/architecture.md): a handle never repeats in a process, so one kept from an earlier job is
# never taken for one of this job.
_handle_ids = itertools.count()


class _Job:
    """The torch binding's per-job state (:meth:`horovod.runtime.context.Context.binding`)."""

    def __init__(self):
        # handle -> (core handle, finisher of the core's result or None, the tensor returned without a finisher)
        self.handles: Dict[int, Tuple[Any, Optional[Callable[[Any], Any]], Any]] = {}
        self.first = next(_handle_ids)      # every handle of this job is above it, every one of an earlier job below


def _job() -> _Job:
    """This job's torch state.

    Raises:
        ValueError: Horovod is not initialized.
    """
    return _context.current().binding("torch", _Job)


def _check_not_stale(handle: int, what: str) -> None:
    """For a handle this job does not hold.

    Raises:
        HorovodInternalError: ``handle`` belongs to a job that has been shut down (its collective ended with it).
    """
    ctx = _context.get()
    if ctx is None or (isinstance(handle, int) and handle < ctx.binding("torch", _Job).first):
        raise HorovodInternalError(f"{what}: handle {handle!r} belongs to a Horovod job that has been shut down; "
                                   f"its collective ended with it")


def _register(core_handle, finish: Optional[Callable[[Any], Any]], tensor=None) -> int:
    handle = next(_handle_ids)       # (atomic under the GIL, as the dict operations here: no lock per tensor)
    _job().handles[handle] = (core_handle, finish, tensor)
    return handle


def poll(handle: int) -> bool:
    """True when the collective behind ``handle`` has finished, so ``synchronize`` will not block.

    Raises:
        ValueError: ``handle`` is not a pending handle.
        HorovodInternalError: ``handle`` belongs to a job that has been shut down.
    """
    ctx = _context.get()
    job = ctx.bindings.get("torch") if ctx is not None else None
    entry = job.handles.get(handle) if job is not None else None
    if entry is None:
        _check_not_stale(handle, "poll")
        raise ValueError(f"poll: unknown handle {handle!r} (already synchronized, or never returned by an *_async op)")
    return entry[0].done()


def synchronize(handle: int):
    """Wait for the collective behind ``handle`` and return its output tensor (a list for grouped ops, a tuple
    ``(output, received_splits)`` for alltoall); None for an unknown handle.

    Raises:
        HorovodInternalError: the job broke (a peer died, Horovod shut down), or ``handle`` belongs to a job that
            has been shut down.
        TensorMismatchError: ranks disagreed on the tensor's shape, dtype, op or root (a RuntimeError).
    """
    ctx = _context.get()        # (once per gradient per step: the lookups inline)
    job = ctx.bindings.get("torch") if ctx is not None else None
    entry = job.handles.pop(handle, None) if job is not None else None
    if entry is None:
        _check_not_stale(handle, "synchronize")
        return None
    core_handle, finish, tensor = entry
    result = core_handle.result()
    if finish is None:
        if type(result) is not np.ndarray:
            settle(result)      # a device result: the current stream waits for it
        return tensor
    return finish(result)


# -- allreduce ------------------------------------------------------------------------------------------------------

def _allreduce_into(tensor, output, name, op, average, prescale_factor, postscale_factor, process_set) -> int:
    source, dtype, own = as_input_view(tensor)
    if output is tensor and own:     # in place: the input's view is the output's
        return _register(_c.allreduce_async(source, name, op, average, prescale_factor, postscale_factor,
                                            process_set, source, dtype), None, tensor)
    out_view, finish = as_output(output)
    return _register(_c.allreduce_async(source, name, op, average, prescale_factor, postscale_factor, process_set,
                                        out_view, dtype), finish)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` over the ranks of ``process_set``; returns a handle for :func:`synchronize`.

    Args:
        tensor: a CPU tensor, the same shape and dtype on every rank.
        average: deprecated; use ``op``.
        name: a name unique among pending collectives (auto-numbered in submission order when None).
        op: ``hvd.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor, postscale_factor: multiply the input before and the result after the reduction.
        process_set: the ranks taking part.
    """
    check_tensor(tensor)
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _allreduce_into(tensor, output, name, op, average, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`allreduce_async`: ``tensor`` receives the result."""
    # This runs once per gradient per step: a cached view of the tensor's memory, positional arguments and no
    # closure keep the binding's own cost per tensor near the numpy binding's. The handle holds ``tensor``, whose
    # memory the view does not own, until ``synchronize``.
    found = inplace_view(tensor)
    if found is None:
        return _allreduce_into(tensor, tensor, name, op, average, prescale_factor, postscale_factor, process_set)
    view = found[2]
    core = _c.allreduce_async(view, name, op, average, prescale_factor, postscale_factor, process_set, view, found[3])
    handle = next(_handle_ids)
    (_context.current().bindings.get("torch") or _job()).handles[handle] = (core, None, tensor)   # (_register's work)
    return handle


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _grouped_allreduce_into(tensors, outputs, name, op, average, prescale_factor, postscale_factor,
                            process_set) -> int:
    inputs = [as_input(t) for t in tensors]
    views, finishers = zip(*[as_output(o) for o in outputs]) if outputs else ((), ())
    core = _c.grouped_allreduce_async([a for a, _ in inputs], name=name, op=op, average=average,
                                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                      process_set=process_set, outputs=list(views),
                                      dtypes=[d for _, d in inputs])
    return _register(core, lambda results: [f(r) for f, r in zip(finishers, results)])


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> int:
    """Start allreducing a list of tensors as one group (negotiated and fused together); see
    :func:`allreduce_async`. ``synchronize`` returns the list of outputs."""
    outputs = [torch.empty(check_tensor(t).shape, dtype=t.dtype, device=t.device) for t in tensors]
    return _grouped_allreduce_into(tensors, outputs, name, op, average, prescale_factor, postscale_factor,
                                   process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`grouped_allreduce_async`."""
    found = [inplace_view(t) for t in tensors]
    if found and all(f is not None for f in found):     # every tensor's own memory: no copies, nothing to finish
        views = [f[2] for f in found]
        core = _c.grouped_allreduce_async(views, name=name, op=op, average=average, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, process_set=process_set, outputs=views,
                                          dtypes=[f[3] for f in found])
        kept = list(tensors)       # the handle holds the tensors, whose memory the views do not own
        return _register(core, lambda _results: kept)
    return _grouped_allreduce_into(tensors, list(tensors), name, op, average, prescale_factor, postscale_factor,
                                   process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """In-place grouped allreduce; returns ``tensors``."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """Start reducing a sparse COO tensor by gathering every rank's indices and values.

    Returns a callable that waits and returns the reduced (uncoalesced) sparse tensor; with ``op=Average`` the
    values are divided by the set's size.

    Raises:
        NotImplementedError: ``op=Adasum``. ValueError: any other op but Average and Sum.
    """
    if tensor.device.type != "cpu":
        check_tensor(tensor)
    _policy.check_sparse_op(op)
    scale = _policy.reduction_scale(op, _policy.set_size(process_set))
    indices = allgather_async(tensor._indices().t().contiguous(), name=f"{name}.indices", process_set=process_set)
    values = allgather_async(tensor._values(), name=f"{name}.values", process_set=process_set)

    def wait() -> torch.Tensor:
        """Wait for both gathers and return the reduced sparse tensor."""
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if scale != 1.0:
            gathered_values = gathered_values * scale
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, tensor.size())
    return wait


# -- allgather ------------------------------------------------------------------------------------------------------

def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` on the first dimension (which may differ between ranks)."""
    source, dtype = as_input(tensor.reshape(1) if tensor.dim() == 0 else tensor)
    core = _c.allgather_async(source, name=name, process_set=process_set, dtype=dtype)
    return _register(core, lambda result: to_tensor(result, tensor.dtype))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start allgathering a list of tensors as one group; ``synchronize`` returns the list of outputs."""
    inputs = [as_input(t.reshape(1) if t.dim() == 0 else t) for t in tensors]
    core = _c.grouped_allgather_async([a for a, _ in inputs], name=name, process_set=process_set,
                                      dtypes=[d for _, d in inputs])
    dtypes = [t.dtype for t in tensors]
    return _register(core, lambda results: [to_tensor(r, d) for r, d in zip(results, dtypes)])


# -- broadcast ------------------------------------------------------------------------------------------------------

def _broadcast_into(tensor, output, root_rank, name, process_set) -> int:
    source, dtype = as_input(tensor)
    out_view, finish = as_output(output)
    core = _c.broadcast_async(source, root_rank, name=name, process_set=process_set, output=out_view,
                              dtype=dtype)
    return _register(core, finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start broadcasting ``tensor`` from global rank ``root_rank``; the output is a new tensor."""
    check_tensor(tensor)
    return _broadcast_into(tensor, torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device), root_rank,
                           name, process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`broadcast_async`: ``tensor`` receives the root's values."""
    return _broadcast_into(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place broadcast; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# -- alltoall -------------------------------------------------------------------------------------------------------

def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall: rows ``splits[i]`` of the first dimension go to rank i (equal parts when None).

    ``synchronize`` returns ``(output, received_splits)`` with ``received_splits`` an int32 tensor.
    """
    source, dtype = as_input(tensor)
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    core = _c.alltoall_async(source, splits, name=name, process_set=process_set, dtype=dtype)

    def finish(result) -> Tuple[torch.Tensor, torch.Tensor]:
        """The output tensor and the received splits as an int32 tensor."""
        output, received = result
        return to_tensor(output, tensor.dtype), torch.from_numpy(received.astype("int32", copy=True))
    return _register(core, finish)


# -- reducescatter --------------------------------------------------------------------------------------------------

def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = _c.Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter: reduce over the set, rank i keeps slice i of the first dimension (ranks below
    ``dim0 % size`` get one extra row). Only ``hvd.Sum`` and ``hvd.Average``.

    Raises:
        UnsupportedOperationError: another op, or a 0-d tensor (a ``RuntimeError``, as Horovod's).
    """
    _policy.check_reducescatter_op(op, [tensor.dim()])
    source, dtype = as_input(tensor)
    core = _c.reducescatter_async(source, name=name, op=op, process_set=process_set,
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor, dtype=dtype)
    return _register(core, lambda result: to_tensor(result, tensor.dtype))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None, op: int = _c.Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start reducescattering a list of tensors as one group; ``synchronize`` returns the list of outputs.

    Raises:
        UnsupportedOperationError: another op than Sum and Average, or a 0-d tensor.
    """
    _policy.check_reducescatter_op(op, [t.dim() for t in tensors])
    inputs = [as_input(t) for t in tensors]
    core = _c.grouped_reducescatter_async([a for a, _ in inputs], name=name, op=op,
                                          process_set=process_set, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, dtypes=[d for _, d in inputs])
    dtypes = [t.dtype for t in tensors]
    return _register(core, lambda results: [to_tensor(r, d) for r, d in zip(results, dtypes)])


# -- synchronisation ------------------------------------------------------------------------------------------------

def join(device: int = -1) -> int:
    """Declare that this rank has no more batches; returns the rank that joined last. Until every rank joined,
    this rank contributes zeros to the others' allreduces. ``device`` is accepted for compatibility."""
    return _c.join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` reaches the barrier."""
    _c.barrier(process_set=process_set)
