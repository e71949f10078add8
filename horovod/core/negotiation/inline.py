"""Small allreduces whose data travels inside negotiation frames: the whole path, in one place.

Under peer negotiation every rank's frame reaches every other rank, so an allreduce of up to
:data:`INLINE_TENSOR_BYTES` can carry its input along (up to :data:`INLINE_FRAME_BYTES` a frame). Once such a tensor
is ready every member holds every contribution and folds them itself, in rank order with each contribution
prescaled, exactly as the exchange allreduce would: all members hold the same bits and there is no data phase.

Whether a tensor is folded this way is decided from the frames alone (every member sent its data), so every member
decides alike; the tensors of a batch that lack a contribution (a full frame, a joined rank, a request sent earlier)
take the ordinary path. Data is attached only for sets that span every rank (the frame goes to every rank), and is
read when the frame is sent. Held data is dropped when its tensor executes or fails.

Under star and tree negotiation the global set's messages carry the data to rank 0, which folds the tensors it
decides, in rank order, and sends their results with its reply: one round trip and no data phase, every rank holds
the very bits rank 0 folded, and nobody else folds (at 64 ranks on two cores every rank folding 64 contributions
cost more than the reply's trip). :func:`relayed_budget` bounds what travels up.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.algorithms import reduction
from horovod.algorithms.buffers import Buffers
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType, ReduceOp, Request, Response, nbytes, numpy_dtype
from horovod.core import fusion
from horovod.core.negotiation.base import Batch

__all__ = ["INLINE_TENSOR_BYTES", "INLINE_FRAME_BYTES", "RELAYED_TOTAL_BYTES", "eligible", "collect",
           "relayed_budget", "HeldData", "allreduce_contributions", "allreduce_folded", "fold"]

INLINE_TENSOR_BYTES = 1024          # the largest allreduce whose data travels with the negotiation
INLINE_FRAME_BYTES = 16 * 1024      # ... and the most such data in one frame


def eligible(request: Request) -> bool:
    """Whether a request's data may travel inside a frame (small, and folded without widening)."""
    return (request.op == OpType.ALLREDUCE and request.reduce_op != ReduceOp.ADASUM
            and not reduction.widens(request.dtype) and nbytes(request.dtype, request.shape) <= INLINE_TENSOR_BYTES)


def collect(requests: Sequence[Request], entries, budget: int) -> Tuple[Dict[str, bytes], int]:
    """The data, by name, of those ``requests`` that travel in the frame, within ``budget`` bytes; and what is left
    of the budget. ``entries`` maps names to the submitted entries (``.array``)."""
    data: Dict[str, bytes] = {}
    for request in requests:
        entry = entries.get(request.name)
        array = entry.array if entry is not None else None
        # The size first: a training step's 200 gradients mostly fail it, and it costs an attribute read.
        if array is not None and array.nbytes <= min(budget, INLINE_TENSOR_BYTES) and eligible(request):
            data[request.name] = array.tobytes()
            budget -= array.nbytes
    return data, budget


def relayed_budget(size: int) -> int:
    """Bytes of allreduce data a rank's message may carry under star and tree negotiation: rank 0 receives every
    member's, at most ``size`` times this, kept to :data:`RELAYED_TOTAL_BYTES`."""
    return min(INLINE_FRAME_BYTES, RELAYED_TOTAL_BYTES // max(size, 1))


RELAYED_TOTAL_BYTES = 64 * 1024


class HeldData:
    """Contributions that came with the members' frames, by set, name and member position, until the tensor
    executes or fails."""

    def __init__(self):
        self._sets: Dict[int, Dict[str, Dict[int, bytes]]] = {}

    def hold(self, set_id: int, position: int, data: Dict[str, bytes]) -> None:
        """Keep the member at ``position``'s contributions."""
        held = self._sets.setdefault(set_id, {})
        for name, contribution in data.items():
            held.setdefault(name, {})[position] = contribution

    def forget(self, set_id: int) -> None:
        """Drop everything held for a removed set."""
        self._sets.pop(set_id, None)

    def batches(self, set_id: int, size: int, batches: List[List[Response]]) -> List[Batch]:
        """The decided ``batches`` of a set of ``size`` members, with the allreduces every member sent data for
        split off to be folded (they come first); held data of every tensor decided here is dropped."""
        held = self._sets.get(set_id)
        if not held:
            return [Batch(batch) for batch in batches]
        out: List[Batch] = []
        for batch in batches:
            op = batch[0].op
            if op == OpType.ALLREDUCE:
                folded, contributions, rest = _split(held, size, batch)
                if folded:
                    out.append(Batch(folded, contributions))
                if rest:
                    out.append(Batch(rest))
                continue
            if op == OpType.ERROR:
                for response in batch:
                    for name in response.names:
                        held.pop(name, None)
            out.append(Batch(batch))
        return out


def _split(held: Dict[str, Dict[int, bytes]], size: int, batch: Sequence[Response]
           ) -> Tuple[List[Response], Optional[List[bytes]], List[Response]]:
    """(the single-tensor allreduces every member sent data for, each member's contributions to all of them
    concatenated in order, the rest). Every member splits alike: the data came with frames every member received."""
    folded: List[Response] = []
    rest: List[Response] = []
    complete: List[Dict[int, bytes]] = []
    for response in batch:
        got = held.pop(response.names[0], None)
        if got is not None and len(got) == size:
            folded.append(response)
            complete.append(got)
        else:
            rest.append(response)
    if not folded:
        return folded, None, rest
    if len(complete) == 1:
        return folded, [complete[0][p] for p in range(size)], rest
    return folded, [b"".join(h[p] for h in complete) for p in range(size)], rest


def allreduce_contributions(response: Response, entries, contributions: List[bytes],
                            buffers: Buffers) -> Dict[str, np.ndarray]:
    """Fold an allreduce whose data came with the negotiation; returns each local tensor's result.

    ``contributions[p]`` is the member at position p's input for every tensor of the batch, in order.

    Raises:
        HorovodInternalError: a contribution has the wrong size.
    """
    return _unpacked(response, entries, fold(response, contributions, buffers))


def allreduce_folded(response: Response, entries, folded: bytes) -> Dict[str, np.ndarray]:
    """Each local tensor's result of an allreduce the coordinator folded (``folded``: every tensor's, in order).

    Raises:
        HorovodInternalError: the result has the wrong size.
    """
    carrier = numpy_dtype(response.dtype)
    if len(folded) != sum(fusion.counts(response)) * carrier.itemsize:
        raise HorovodInternalError(f"the allreduce result for {', '.join(response.names)} that came with the "
                                   f"negotiation has the wrong size")
    return _unpacked(response, entries, np.frombuffer(folded, dtype=carrier))


def fold(response: Response, contributions: List[bytes], buffers: Optional[Buffers] = None) -> np.ndarray:
    """The result of ``response`` (an allreduce, its tensors in order) from every member's contribution.

    Folded as the exchange allreduce folds (each contribution prescaled, in rank order, then postscaled), so a
    result folded on any rank has the same bits.

    Raises:
        HorovodInternalError: a contribution has the wrong size.
    """
    carrier = numpy_dtype(response.dtype)
    total = sum(fusion.counts(response))
    if any(len(c) != total * carrier.itemsize for c in contributions):
        raise HorovodInternalError(f"allreduce data for {', '.join(response.names)} that came with the negotiation "
                                   f"has the wrong size")
    ufunc = reduction.ufunc_for(response.reduce_op)
    acc = buffers.get("negotiated", carrier, total) if buffers is not None else np.empty(total, carrier)
    acc[...] = np.frombuffer(contributions[0], dtype=carrier)
    reduction.scale(acc, response.prescale)
    other = None
    if response.prescale != 1.0:
        other = buffers.get("negotiated-peer", carrier, total) if buffers is not None else np.empty(total, carrier)
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
    return acc


def _unpacked(response: Response, entries, acc: np.ndarray) -> Dict[str, np.ndarray]:
    carrier = numpy_dtype(response.dtype)
    outputs = fusion.outputs(response, entries, carrier)
    fusion.unpack(response, fusion.counts(response), outputs, acc, widen=False)
    return outputs
