"""Tensor fusion: which ready responses travel together in one buffer, and how a batch becomes one response.

Pure functions. Allreduces (and Adasum) of the same dtype, op and scales are packed, in readiness order, into batches
of at most ``threshold`` bytes (a tensor larger than the threshold travels alone). Tensors of one group stay in one
batch whatever its size, as Horovod keeps ``grouped_allreduce`` together. Every other op travels alone.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from horovod.common.types import OpType, Response, nbytes

_FUSIBLE = (OpType.ALLREDUCE,)


def _key(response: Response) -> Tuple:
    return (response.dtype, response.reduce_op, response.prescale, response.postscale)


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
    return batches


def merge(batch: Sequence[Response]) -> Response:
    """One response for a batch of single-tensor responses that share op, dtype and scales."""
    if len(batch) == 1:
        return batch[0]
    first = batch[0]
    return first._replace(names=tuple(r.names[0] for r in batch), shapes=tuple(r.shapes[0] for r in batch))
