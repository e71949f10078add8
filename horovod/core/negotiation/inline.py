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
decides and sends their results with its reply: one round trip and no data phase, every rank holds the very bits rank
0 folded, and the members do not fold (at 64 ranks on two cores every rank folding 64 contributions cost more than the
reply's trip). Under the tree a relay folds each tensor that every rank of its subtree sent into one contribution
(:func:`fold_subtree`), so rank 0 folds a few contributions per tensor, not one per rank: decoding, holding and adding
a member's contribution cost rank 0 about 3 µs, which at 4,096 ranks would be 12 ms of every cycle on one core. The
order of addition then follows the tree rather than the ranks, which changes a float sum's last bits, never which bits
the ranks hold. :func:`relayed_budget` bounds what travels up.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.algorithms import reduction
from horovod.algorithms.buffers import Buffers
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import CPU_DEVICE, OpType, ReduceOp, Request, Response, nbytes, numpy_dtype
from horovod.core import fusion
from horovod.core.decision import Contributors
from horovod.core.negotiation.base import Batch

__all__ = ["INLINE_TENSOR_BYTES", "INLINE_FRAME_BYTES", "RELAYED_TOTAL_BYTES", "eligible", "collect",
           "relayed_budget", "HeldData", "allreduce_contributions", "allreduce_folded", "fold", "fold_subtree"]

INLINE_TENSOR_BYTES = 1024          # the largest allreduce whose data travels with the negotiation
INLINE_FRAME_BYTES = 16 * 1024      # ... and the most such data in one frame


def eligible(request: Request) -> bool:
    """Whether a request's data may travel inside a frame (small, and folded without widening)."""
    return (request.op == OpType.ALLREDUCE and request.reduce_op != ReduceOp.ADASUM and request.device == CPU_DEVICE
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

Key = Contributors     # whose contribution held data is: a member's, or a subtree's folded on the way up
Data = Dict[str, bytes]


def fold_subtree(rank: int, ranks: int, requests: Dict[str, Request], datas: List[Tuple[Key, Data]]
                 ) -> List[Tuple[Key, Data]]:
    """A relay's subtree data (``datas``: its own and its children's, as received) with every small allreduce that
    all ``ranks`` of the subtree sent, the same size as this rank's own, folded into one contribution keyed
    ``Contributors(rank, ranks)``; the rest passes on as it came. ``requests``: this rank's own requests with data, by name (their
    op, dtype and prescale: a rank whose differ makes the coordinator fail the tensor, and its data is dropped)."""
    whole = _fold_whole(rank, ranks, requests, datas)
    if whole is not None:
        return whole
    by_name: Dict[str, List[Tuple[Key, bytes]]] = {}
    for key, data in datas:
        for name, value in data.items():
            by_name.setdefault(name, []).append((key, value))
    # Tensors alike (op, dtype, prescale, contributors) fold together: one add per contribution, not per tensor.
    alike: Dict[tuple, List[str]] = {}
    left: Dict[Key, Data] = {}
    for name, items in by_name.items():
        request = requests.get(name)
        size = len(items[0][1])
        if request is None or sum(key.count for key, _ in items) != ranks or any(
                len(value) != size for _, value in items) or size != nbytes(request.dtype, request.shape):
            for key, value in items:
                left.setdefault(key, {})[name] = value
            continue
        keys = tuple(key for key, _ in items)
        alike.setdefault((request.dtype, request.reduce_op, request.prescale, keys), []).append(name)
    folded: Dict[str, bytes] = {}
    for (dtype, reduce_op, prescale, keys), names in alike.items():
        per_key = [{name: by_name[name][index][1] for name in names} for index in range(len(keys))]
        folded.update(_fold_alike((dtype, reduce_op, prescale), keys, names, per_key))
    return ([(Contributors(rank, ranks), folded)] if folded else []) + list(left.items())


def _fold_whole(rank: int, ranks: int, requests: Dict[str, Request], datas: List[Tuple[Key, Data]]
                ) -> Optional[List[Tuple[Key, Data]]]:
    # The steady state, without a look at each tensor: every contributor sent the same names, all alike. (A rank
    # whose tensor has another shape under the same name made the coordinator fail it: what is folded here is
    # dropped.)
    if not datas or sum(key.count for key, _ in datas) != ranks:
        return None
    own = datas[0][1]
    names = list(own)
    if any(data.keys() != own.keys() for _, data in datas[1:]) or any(name not in requests for name in names):
        return None
    kind = (requests[names[0]].dtype, requests[names[0]].reduce_op, requests[names[0]].prescale)
    if any((request.dtype, request.reduce_op, request.prescale) != kind for request in map(requests.get, names)):
        return None
    folded = _fold_alike(kind, [key for key, _ in datas], names, [data for _, data in datas])
    return None if folded is None else [(Contributors(rank, ranks), folded)]


def _fold_alike(kind: tuple, keys: Sequence[Key], names: List[str], per_key: List[Data]) -> Optional[Data]:
    # Tensors alike in (dtype, op, prescale) from the same contributors, each contributor's joined in ``names``'s
    # order and folded in one go, then cut back into tensors; None where the contributors' lengths differ.
    joined = [b"".join([data[name] for name in names]) for data in per_key]
    if any(len(value) != len(joined[0]) for value in joined):
        return None
    result = _fold_joined(*kind, keys, joined)
    folded, at = {}, 0
    for name in names:
        width = len(per_key[0][name])
        folded[name] = result[at:at + width]
        at += width
    return folded


def _fold_joined(dtype: str, reduce_op: int, prescale: float, keys: Sequence[Key], joined: List[bytes]) -> bytes:
    carrier = numpy_dtype(dtype)
    count = len(joined[0]) // carrier.itemsize
    acc = np.empty(count, carrier)
    other = np.empty(count, carrier) if prescale != 1.0 else None
    _accumulate(acc, joined, tuple(key.folded for key in keys), prescale, reduction.ufunc_for(reduce_op), other)
    return acc.tobytes()


def _accumulate(acc: np.ndarray, contributions: Sequence[bytes], folded: Sequence[bool], prescale: float, ufunc,
                other: Optional[np.ndarray]) -> None:
    # Into ``acc``: the contributions in order, each prescaled but those ``folded`` on the way up (they already are);
    # ``other`` is the scratch a prescaled one is read into.
    acc[...] = np.frombuffer(contributions[0], dtype=acc.dtype)
    if not (folded and folded[0]):
        reduction.scale(acc, prescale)
    for index, data in enumerate(contributions[1:], 1):
        incoming = np.frombuffer(data, dtype=acc.dtype)
        if other is not None and not (folded and folded[index]):
            other[...] = incoming
            reduction.scale(other, prescale)
            incoming = other
        ufunc(acc, incoming, out=acc)


class HeldData:
    """Contributions that came with the members' frames, by set, name and member position, until the tensor
    executes or fails."""

    def __init__(self):
        self._sets: Dict[int, Dict[str, Dict[Key, bytes]]] = {}

    def hold(self, set_id: int, key: Key, data: Dict[str, bytes]) -> None:
        """Keep the contributions of ``key``: a member (``Contributors(position)``) or a folded subtree."""
        held = self._sets.setdefault(set_id, {})
        for name, contribution in data.items():
            held.setdefault(name, {})[key] = contribution

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
                folded, contributions, partial, rest = _split(held, size, batch)
                if folded:
                    out.append(Batch(folded, contributions, partial=partial))
                if rest:
                    out.append(Batch(rest))
                continue
            if op == OpType.ERROR:
                for response in batch:
                    for name in response.names:
                        held.pop(name, None)
            out.append(Batch(batch))
        return out


def _split(held: Dict[str, Dict[Key, bytes]], size: int, batch: Sequence[Response]
           ) -> Tuple[List[Response], Optional[List[bytes]], Tuple[bool, ...], List[Response]]:
    """(the single-tensor allreduces every member sent data for, the contributions to all of them concatenated in
    order, by member or folded subtree (which of them are folded subtrees, if any), the rest). Every member splits
    alike: the data came with frames every member received (under the tree only rank 0 splits)."""
    folded: List[Response] = []
    rest: List[Response] = []
    complete: List[Dict[Key, bytes]] = []
    for response in batch:
        got = held.pop(response.names[0], None)
        if got is not None and sum(key.count for key in got) == size and (
                not complete or got.keys() == complete[0].keys()):
            folded.append(response)
            complete.append(got)
        else:
            rest.append(response)
    if not folded:
        return folded, None, (), rest
    keys = sorted(complete[0])      # by first member (a relay's own and its subtree's are never both one tensor's)
    partial = tuple(key.folded for key in keys)
    if len(complete) == 1:
        return folded, [complete[0][key] for key in keys], partial if any(partial) else (), rest
    return folded, [b"".join(h[key] for h in complete) for key in keys], partial if any(partial) else (), rest


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


def fold(response: Response, contributions: List[bytes], buffers: Optional[Buffers] = None,
         partial: Sequence[bool] = (), members: int = 0) -> np.ndarray:
    """The result of ``response`` (an allreduce, its tensors in order) from every member's contribution (``partial``:
    which are subtrees folded on the way up, already prescaled; ``members``: how many ranks they hold together,
    default one each).

    Folded as the exchange allreduce folds (each contribution prescaled, in order, then postscaled), so a result
    folded from the same contributions on any rank has the same bits.

    Raises:
        HorovodInternalError: a contribution has the wrong size.
    """
    carrier = numpy_dtype(response.dtype)
    total = sum(fusion.counts(response))
    if any(len(c) != total * carrier.itemsize for c in contributions):
        raise HorovodInternalError(f"allreduce data for {', '.join(response.names)} that came with the negotiation "
                                   f"has the wrong size")
    acc = buffers.get("negotiated", carrier, total) if buffers is not None else np.empty(total, carrier)
    other = None
    if response.prescale != 1.0:
        other = buffers.get("negotiated-peer", carrier, total) if buffers is not None else np.empty(total, carrier)
    _accumulate(acc, contributions, partial, response.prescale, reduction.ufunc_for(response.reduce_op), other)
    post = response.postscale / (members or len(contributions)) if response.reduce_op == ReduceOp.AVERAGE \
        else response.postscale
    reduction.scale(acc, post)
    return acc


def _unpacked(response: Response, entries, acc: np.ndarray) -> Dict[str, np.ndarray]:
    carrier = numpy_dtype(response.dtype)
    outputs = fusion.outputs(response, entries, carrier)
    fusion.unpack(response, fusion.counts(response), outputs, acc, widen=False)
    return outputs
