"""Tensor fusion: which ready responses travel together in one buffer, how a batch becomes one response, and how
its tensors are packed into the fusion buffer and unpacked from it.

Planning is pure functions. Allreduces (and Adasum) of the same dtype, op and scales are packed, in readiness order,
into batches of at most ``threshold`` bytes (a tensor larger than the threshold travels alone). Tensors of one group
stay in one batch whatever its size, as Horovod keeps ``grouped_allreduce`` together. Every other op travels alone.
A single tensor of a native dtype skips the fusion buffer and is reduced in its output buffer directly; 2-byte floats
are widened to float32 on the way in and narrowed on the way out. A rank that has joined contributes zeros.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.algorithms import reduction
from horovod.algorithms.buffers import Buffers
from horovod.common.types import OpType, Response, nbytes, numpy_dtype

_log = logging.getLogger("horovod")

__all__ = ["plan_batches", "merge", "counts", "outputs", "pack", "unpack"]

_FUSIBLE = (OpType.ALLREDUCE,)


def _key(response: Response) -> Tuple:
    return (response.dtype, response.reduce_op, response.prescale, response.postscale, response.device)


def plan_batches(responses: Sequence[Response], groups: Sequence[int], threshold: int) -> List[List[Response]]:
    """Split ``responses`` (single-tensor, in readiness order) into execution batches.

    Args:
        responses: ready responses; ``groups[i]`` is the group id of ``responses[i]`` (-1 for none).
        threshold: fusion buffer size in bytes (``HOROVOD_FUSION_THRESHOLD``); 0 disables fusion.
    Returns:
        batches in execution order; every rank executes the same list.
    """
    batches: List[List[Response]] = []
    open_batch: Dict[Tuple, Tuple[int, int]] = {}   # fusion key → (batch index, bytes so far)
    group_batch: Dict[Tuple, int] = {}
    for response, group in zip(responses, groups):
        if response.op not in _FUSIBLE or response.error is not None:
            batches.append([response])
            continue
        size = nbytes(response.dtype, response.shapes[0])
        key = _key(response)
        if group >= 0 and (group, key) in group_batch:
            batches[group_batch[group, key]].append(response)
            continue
        if group < 0 and threshold > 0 and key in open_batch:
            index, used = open_batch[key]
            if used + size <= threshold:
                batches[index].append(response)
                open_batch[key] = (index, used + size)
                continue
        batches.append([response])
        if group >= 0:
            group_batch[group, key] = len(batches) - 1
        elif threshold > 0:
            open_batch[key] = (len(batches) - 1, size)
    if len(batches) < len(responses) and _log.isEnabledFor(logging.DEBUG):
        _log.debug("fusion plan: %d tensors in %d batches of %s tensors (threshold %d bytes)", len(responses),
                   len(batches), [len(b) for b in batches], threshold)
    return batches


def merge(batch: Sequence[Response]) -> Response:
    """One response for a batch of single-tensor responses that share op, dtype and scales."""
    if len(batch) == 1:
        return batch[0]
    first = batch[0]
    return first._replace(names=tuple(r.names[0] for r in batch), shapes=tuple(r.shapes[0] for r in batch))


def counts(response: Response) -> List[int]:
    """The number of elements of each tensor of ``response``."""
    return [math.prod(shape) for shape in response.shapes]


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


def outputs(response: Response, entries, carrier: np.dtype) -> Dict[str, np.ndarray]:
    """Where each local tensor's result goes: its preallocated output, or a new array (none for a tensor this
    rank never submitted, having joined: nobody reads its result). ``entries`` maps names to submitted entries."""
    result: Dict[str, np.ndarray] = {}
    for name, shape in zip(response.names, response.shapes):
        entry = entries.get(name)
        if entry is not None:
            result[name] = entry.output if entry.output is not None else np.empty(shape, dtype=carrier)
    return result


def pack(response: Response, sizes: Sequence[int], entries, results: Dict[str, np.ndarray], buffers: Buffers,
         widen: bool, activity: Optional[Callable[[str], None]] = None) -> Tuple[np.ndarray, bool]:
    """The flat buffer an allreduce of ``response`` reduces in place, and whether it is the fusion buffer (then
    :func:`unpack` copies the results out); else it is the single tensor's own output, already holding its input.

    Args:
        sizes: elements per tensor (:func:`counts`); ``results``: the outputs (:func:`outputs`).
        widen: 2-byte floats are reduced as float32.
    """
    if len(response.names) == 1 and not widen and response.names[0] in results:
        name = response.names[0]
        out = results[name]
        buf = _flat(out)
        source = entries[name].array
        if source is not None and not (source is out or np.may_share_memory(source, out)):
            np.copyto(buf, _flat(source))
        return buf, False
    if activity:
        activity("MEMCPY_IN_FUSION_BUFFER")
    buf = buffers.get("fusion", np.dtype(np.float32) if widen else numpy_dtype(response.dtype), sum(sizes))
    sources = None if widen else [entries[name].array for name in response.names if name in entries]
    if sources is not None and len(sources) == len(response.names):
        # One C call packs the whole batch (a training step fuses hundreds of small gradients).
        np.concatenate([a if a.ndim == 1 else a.reshape(-1) for a in sources], out=buf)
        return buf, True
    offset = 0
    for name, count in zip(response.names, sizes):
        target = buf[offset:offset + count]
        entry = entries.get(name)
        if entry is None:
            target.fill(0)
        elif widen:
            reduction.to_float32(_flat(entry.array), response.dtype, target)
        else:
            np.copyto(target, _flat(entry.array))
        offset += count
    return buf, True


def unpack(response: Response, sizes: Sequence[int], results: Dict[str, np.ndarray], buf: np.ndarray,
           widen: bool) -> None:
    """Copy each tensor's part of the fused ``buf`` to its output, narrowing 2-byte floats."""
    offset = 0
    for name, count in zip(response.names, sizes):
        out = results.get(name)
        if out is not None:
            part = buf[offset:offset + count]
            if widen:
                reduction.from_float32(part, response.dtype, _flat(out))
            else:
                (out if out.ndim == 1 else out.reshape(-1))[...] = part
        offset += count
