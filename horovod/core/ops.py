"""Execute one negotiated response on this rank's buffers: from the submitted entries to flat buffers and back.

Everything here is framework-free numpy. Which algorithm runs is for :mod:`horovod.algorithms` to choose; packing
and unpacking fusion buffers is :mod:`horovod.core.fusion`'s. A rank that has joined contributes zeros to allreduces
it never submitted. Fusion buffers and scratch space persist between calls and only grow, so a steady training loop
allocates nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional

import numpy as np

from horovod.algorithms import allreduce as allreduce_algorithms
from horovod.algorithms import collectives, reduction
from horovod.algorithms.buffers import Buffers
from horovod.algorithms.group import Group
from horovod.common.types import OpType, ReduceOp, Request, Response, numpy_dtype
from horovod.core import fusion
from horovod.core.handles import Handle

__all__ = ["Entry", "Buffers", "execute", "reducescatter_rows"]


@dataclasses.dataclass
class Entry:
    """A submitted tensor waiting for its response. ``output`` is preallocated for in-place and reduce ops."""

    request: Request
    array: Optional[np.ndarray]
    output: Optional[np.ndarray]
    handle: Handle
    process_set_id: int = 0


def _count(shape) -> int:
    return math.prod(shape)


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def execute(response: Response, entries: Dict[str, Entry], group: Group, buffers: Buffers,
            activity=None) -> Dict[str, Any]:
    """Run ``response``; returns the result of each local name (output array, tuple, or join's last rank).

    ``activity(name)`` is called when a phase starts (for the timeline), if given.
    """
    op = response.op
    if op == OpType.ALLREDUCE:
        return _allreduce(response, entries, group, buffers, activity)
    name = response.names[0]
    entry = entries.get(name)
    if op == OpType.ALLGATHER:
        return {name: _allgather(response, entry, group)}
    if op == OpType.BROADCAST:
        return {name: _broadcast(response, entry, group)}
    if op == OpType.ALLTOALL:
        return {name: _alltoall(response, entry, group)}
    if op == OpType.REDUCESCATTER:
        return {name: _reducescatter(response, entry, group, buffers)}
    if op == OpType.JOIN:
        return {name: response.last_joined}
    return {name: None}   # barrier, process-set changes: negotiation itself was the work


def _allreduce(response: Response, entries: Dict[str, Entry], group: Group, buffers: Buffers, activity):
    widen = reduction.widens(response.dtype)
    counts = fusion.counts(response)
    outputs = fusion.outputs(response, entries, numpy_dtype(response.dtype))
    buf, fused = fusion.pack(response, counts, entries, outputs, buffers, widen, activity)
    allreduce_algorithms.allreduce(group, buf, response.reduce_op, response.prescale, response.postscale, counts,
                                   buffers, activity)
    if fused:
        if activity:
            activity("MEMCPY_OUT_FUSION_BUFFER")
        fusion.unpack(response, counts, outputs, buf, widen)
    return outputs


def _allgather(response: Response, entry: Entry, group: Group) -> np.ndarray:
    carrier = numpy_dtype(response.dtype)
    trailing = response.shapes[0][1:]
    dims = response.sizes[0]
    row_bytes = _count(trailing) * carrier.itemsize
    out = np.empty((sum(dims),) + tuple(trailing), dtype=carrier)
    raw = _bytes(out)
    start = sum(dims[:group.index]) * row_bytes
    mine = _bytes(np.ascontiguousarray(entry.array))
    raw[start:start + mine.size] = mine
    counts = [d * row_bytes for d in dims]
    collectives.allgatherv(group, raw, counts)
    return out


def _broadcast(response: Response, entry: Entry, group: Group) -> np.ndarray:
    carrier = numpy_dtype(response.dtype)
    root_index = group.ranks.index(response.root_rank)
    out = entry.output if entry.output is not None else np.empty(response.shapes[0], dtype=carrier)
    if group.index == root_index and entry.array is not None and not np.may_share_memory(entry.array, out):
        np.copyto(out, entry.array)
    collectives.broadcast(group, _bytes(out), root_index)
    return out


def _alltoall(response: Response, entry: Entry, group: Group):
    carrier = numpy_dtype(response.dtype)
    trailing = tuple(entry.array.shape[1:])
    row_bytes = _count(trailing) * carrier.itemsize
    matrix = response.sizes
    me = group.index
    received = [matrix[i][me] for i in range(group.size)]
    out = np.empty((sum(received),) + trailing, dtype=carrier)
    send_bounds, recv_bounds = [0], [0]
    for j in range(group.size):
        send_bounds.append(send_bounds[-1] + matrix[me][j] * row_bytes)
        recv_bounds.append(recv_bounds[-1] + received[j] * row_bytes)
    send = _bytes(np.ascontiguousarray(entry.array))
    largest = max(sum(row) for row in matrix) * row_bytes
    sources = [sum(matrix[j][:me]) * row_bytes for j in range(group.size)]
    collectives.alltoall(group, send, send_bounds, _bytes(out), recv_bounds, sources, largest)
    return out, np.asarray(received, dtype=np.int32)


def reducescatter_rows(dim0: int, size: int) -> List[int]:
    """Rows each rank receives: ranks below ``dim0 % size`` get one extra, as Horovod splits."""
    base, extra = divmod(dim0, size)
    return [base + (1 if i < extra else 0) for i in range(size)]


def _reducescatter(response: Response, entry: Entry, group: Group, buffers: Buffers) -> np.ndarray:
    dtype = response.dtype
    carrier = numpy_dtype(dtype)
    widen = reduction.widens(dtype)
    work_dtype = np.dtype(np.float32) if widen else carrier
    shape = response.shapes[0]
    trailing = tuple(shape[1:])
    row = _count(trailing)
    rows = reducescatter_rows(shape[0] if shape else 1, group.size)
    bounds = [0]
    for r in rows:
        bounds.append(bounds[-1] + r * row)
    buf = buffers.get("fusion", work_dtype, bounds[-1])
    if widen:
        reduction.to_float32(_flat(entry.array), dtype, buf)
    else:
        np.copyto(buf, _flat(entry.array))
    reduction.scale(buf, response.prescale)
    scratch = buffers.get("scratch", work_dtype, max(rows) * row + 1)
    ufunc = reduction.ufunc_for(response.reduce_op)
    collectives.reduce_scatter(group, buf, bounds, ufunc, scratch)
    mine = buf[bounds[group.index]:bounds[group.index + 1]]
    post = response.postscale / group.size if response.reduce_op == ReduceOp.AVERAGE else response.postscale
    reduction.scale(mine, post)
    out = np.empty((rows[group.index],) + trailing, dtype=carrier)
    if widen:
        reduction.from_float32(mine, dtype, _flat(out))
    else:
        np.copyto(_flat(out), mine)
    return out

