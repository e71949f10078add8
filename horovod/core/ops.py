"""Execute one negotiated response on this rank's buffers: pack, run the algorithm, unpack.

Everything here is framework-free numpy. A rank that has joined contributes zeros to allreduces it never submitted.
Fusion buffers and scratch space persist between calls and only grow, so a steady training loop allocates nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from horovod.algorithms import adasum, hierarchical, reduction, ring, shm_collectives
from horovod.algorithms.group import Group, segment_bounds
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType, ReduceOp, Request, Response, nbytes, numpy_dtype
from horovod.core.handles import Handle


# Allreduces up to this size may travel inside peer negotiation frames (see allreduce_contributions).
INLINE_TENSOR_BYTES = 1024
# Alltoall and reducescatter publish whole buffers at once; past this size they use TCP instead of growing segments.
SHM_MAX_SINGLE_ROUND = 256 << 20


def _use_shm(group: Group, nbytes: int) -> bool:
    return group.shm is not None and nbytes >= group.shm.min_bytes


@dataclasses.dataclass
class Entry:
    """A submitted tensor waiting for its response. ``output`` is preallocated for in-place and reduce ops."""

    request: Request
    array: Optional[np.ndarray]
    output: Optional[np.ndarray]
    handle: Handle
    process_set_id: int = 0


class Buffers:
    """Persistent, growing work buffers keyed by purpose and dtype."""

    def __init__(self):
        self._buffers: Dict[Tuple[str, np.dtype], np.ndarray] = {}

    def get(self, purpose: str, dtype: np.dtype, count: int) -> np.ndarray:
        key = (purpose, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < count:
            buf = np.empty(max(count, 1), dtype=dtype)
            self._buffers[key] = buf
        return buf[:count]


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
    dtype = response.dtype
    carrier = numpy_dtype(dtype)
    widen = reduction.widens(dtype)
    work_dtype = np.dtype(np.float32) if widen else carrier
    counts = [_count(s) for s in response.shapes]
    total = sum(counts)
    outputs = _outputs(response, entries, carrier)

    single = len(response.names) == 1 and not widen and response.names[0] in outputs
    if single:
        name = response.names[0]
        buf = _flat(outputs[name])
        source = entries[name].array
        if source is not None and not (source is outputs[name] or np.may_share_memory(source, outputs[name])):
            np.copyto(buf, _flat(source))
    else:
        if activity:
            activity("MEMCPY_IN_FUSION_BUFFER")
        buf = buffers.get("fusion", work_dtype, total)
        sources = None if widen else [entries[name].array for name in response.names if name in entries]
        if sources is not None and len(sources) == len(response.names):
            # One C call packs the whole batch (a training step fuses hundreds of small gradients).
            np.concatenate([a if a.ndim == 1 else a.reshape(-1) for a in sources], out=buf)
        else:
            _pack(response, counts, entries, buf, widen)

    size = group.size
    if response.reduce_op == ReduceOp.ADASUM:
        if activity:
            activity("ADASUM_ALLREDUCE")
        _adasum(buf, counts, group, buffers)
        post = response.postscale
        reduction.scale(buf, response.prescale * post) if response.prescale * post != 1.0 else None
    else:
        reduction.scale(buf, response.prescale)
        post = response.postscale / size if response.reduce_op == ReduceOp.AVERAGE else response.postscale
        if _use_shm(group, buf.nbytes) and group.hierarchy is None:
            if activity:
                activity("SHM_ALLREDUCE")
            shm_collectives.allreduce(group, buf, reduction.ufunc_for(response.reduce_op), post)
            post = 1.0
        elif group.hierarchy is not None:
            if activity:
                activity("HIERARCHICAL_ALLREDUCE")
            scratch = buffers.get("scratch", work_dtype, -(-total // 2) + 1)
            hierarchical.allreduce(group.hierarchy, buf, reduction.ufunc_for(response.reduce_op), scratch)
        elif buf.nbytes <= ring.EXCHANGE_MAX_BYTES:
            if activity:
                activity("EXCHANGE_ALLREDUCE")
            scratch = buffers.get("scratch", work_dtype, (size - 1) * total + 1)
            ring.exchange_allreduce(group, buf, reduction.ufunc_for(response.reduce_op), scratch)
        else:
            if activity:
                activity("RING_ALLREDUCE")
            scratch = buffers.get("scratch", work_dtype, -(-total // size) + 1)
            ring.ring_allreduce(group, buf, reduction.ufunc_for(response.reduce_op), scratch)
        reduction.scale(buf, post)

    if not single:
        if activity:
            activity("MEMCPY_OUT_FUSION_BUFFER")
        _unpack(response, counts, outputs, buf, widen)
    return outputs


def _outputs(response: Response, entries: Dict[str, Entry], carrier: np.dtype) -> Dict[str, np.ndarray]:
    """Where each local tensor's result goes: its preallocated output, or a new array."""
    outputs: Dict[str, np.ndarray] = {}
    for name, shape in zip(response.names, response.shapes):
        entry = entries.get(name)
        if entry is None:     # joined: our contribution is zeros and nobody reads our result
            continue
        outputs[name] = entry.output if entry.output is not None else np.empty(shape, dtype=carrier)
    return outputs


def _unpack(response: Response, counts: List[int], outputs: Dict[str, np.ndarray], buf: np.ndarray,
            widen: bool) -> None:
    """Copy each tensor's part of the fused ``buf`` to its output, narrowing 2-byte floats."""
    offset = 0
    for name, count in zip(response.names, counts):
        out = outputs.get(name)
        if out is not None:
            part = buf[offset:offset + count]
            if widen:
                reduction.from_float32(part, response.dtype, _flat(out))
            else:
                (out if out.ndim == 1 else out.reshape(-1))[...] = part
        offset += count


def inline_eligible(request: Request) -> bool:
    """Whether a request's data may travel inside a peer negotiation frame (small, and folded without widening)."""
    return (request.op == OpType.ALLREDUCE and request.reduce_op != ReduceOp.ADASUM
            and not reduction.widens(request.dtype) and nbytes(request.dtype, request.shape) <= INLINE_TENSOR_BYTES)


def allreduce_contributions(response: Response, entries: Dict[str, Entry], contributions: List[bytes],
                            buffers: Buffers) -> Dict[str, np.ndarray]:
    """An allreduce whose data came with the negotiation: ``contributions[p]`` is the member at position p's input
    for every tensor of the batch, in order. Folded as the exchange allreduce folds (each contribution prescaled, in
    rank order, then postscaled), so every member gets the same bits."""
    carrier = numpy_dtype(response.dtype)
    counts = [_count(s) for s in response.shapes]
    total = sum(counts)
    if any(len(c) != total * carrier.itemsize for c in contributions):
        raise HorovodInternalError(f"allreduce data for {', '.join(response.names)} that came with the negotiation "
                                   f"has the wrong size")
    ufunc = reduction.ufunc_for(response.reduce_op)
    acc = buffers.get("negotiated", carrier, total)
    acc[...] = np.frombuffer(contributions[0], dtype=carrier)
    reduction.scale(acc, response.prescale)
    other = buffers.get("negotiated-peer", carrier, total) if response.prescale != 1.0 else None
    for data in contributions[1:]:
        incoming = np.frombuffer(data, dtype=carrier)
        if other is not None:
            other[...] = incoming
            reduction.scale(other, response.prescale)
            incoming = other
        ufunc(acc, incoming, out=acc)
    post = response.postscale / len(contributions) if response.reduce_op == ReduceOp.AVERAGE \
        else response.postscale
    reduction.scale(acc, post)
    outputs = _outputs(response, entries, carrier)
    _unpack(response, counts, outputs, acc, widen=False)
    return outputs


def _pack(response: Response, counts: List[int], entries: Dict[str, Entry], buf: np.ndarray, widen: bool) -> None:
    """Copy each tensor into the fusion buffer, widening 2-byte floats; a joined rank contributes zeros."""
    offset = 0
    for name, count in zip(response.names, counts):
        target = buf[offset:offset + count]
        entry = entries.get(name)
        if entry is None:
            target.fill(0)
        elif widen:
            reduction.to_float32(_flat(entry.array), response.dtype, target)
        else:
            np.copyto(target, _flat(entry.array))
        offset += count


def _adasum(buf: np.ndarray, counts: List[int], group: Group, buffers: Buffers) -> None:
    if group.size == 1:
        return
    size = group.size
    gathered = buffers.get("adasum", buf.dtype, buf.size * size)
    raw = _bytes(gathered)
    per = buf.size * buf.itemsize
    raw[group.index * per:(group.index + 1) * per] = _bytes(buf)
    ring.ring_allgatherv(group, raw, [per] * size)
    contributions = [gathered[i * buf.size:(i + 1) * buf.size] for i in range(size)]
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    np.copyto(buf, adasum.adasum_reduce(contributions, bounds))


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
    if _use_shm(group, raw.size):
        shm_collectives.allgatherv(group, raw, counts)
    else:
        ring.ring_allgatherv(group, raw, counts)
    return out


def _broadcast(response: Response, entry: Entry, group: Group) -> np.ndarray:
    carrier = numpy_dtype(response.dtype)
    root_index = group.ranks.index(response.root_rank)
    out = entry.output if entry.output is not None else np.empty(response.shapes[0], dtype=carrier)
    if group.index == root_index and entry.array is not None and not np.may_share_memory(entry.array, out):
        np.copyto(out, entry.array)
    if _use_shm(group, out.nbytes):
        shm_collectives.broadcast(group, _bytes(out), root_index)
    else:
        ring.chain_broadcast(group, _bytes(out), root_index)
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
    if _use_shm(group, largest) and largest <= SHM_MAX_SINGLE_ROUND:
        sources = [sum(matrix[j][:me]) * row_bytes for j in range(group.size)]
        shm_collectives.alltoall(group, send, _bytes(out), recv_bounds, sources, largest)
    else:
        ring.pairwise_alltoall(group, send, send_bounds, _bytes(out), recv_bounds)
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
    if group.size > 1 and _use_shm(group, buf.nbytes) and buf.nbytes <= SHM_MAX_SINGLE_ROUND:
        shm_collectives.reduce_scatter(group, buf, bounds, ufunc)
    elif group.size > 1:
        ring.ring_reduce_scatter(group, buf, bounds, ufunc, scratch)
    mine = buf[bounds[group.index]:bounds[group.index + 1]]
    post = response.postscale / group.size if response.reduce_op == ReduceOp.AVERAGE else response.postscale
    reduction.scale(mine, post)
    out = np.empty((rows[group.index],) + trailing, dtype=carrier)
    if widen:
        reduction.from_float32(mine, dtype, _flat(out))
    else:
        np.copyto(_flat(out), mine)
    return out


__all__ = ["Entry", "Buffers", "execute", "reducescatter_rows", "segment_bounds"]
