"""Adasum: combine gradients so that the parallel update behaves like a sequential one.

Two vectors combine as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b`` (coefficient 1 when a squared norm is below
1e-8), each tensor of a fused buffer on its own, dot products and norms summed element by element in float64, in
index order, as Horovod's ``adasum.h`` does (so float64 results match Horovod's bit for bit).

Over ranks this runs as vector-halving, distance-doubling (VHDD), with Horovod's pairing: at distance 1, 2, 4, ...
a rank pairs with ``rank XOR distance``; the rank whose ``distance`` bit is clear keeps the first half of its current
segment (the smaller one when it is odd) and sends the second, its partner the reverse. Both then combine the half
they keep: the dot product and norms of each tensor's piece are summed over the ``2 * distance`` ranks that now hold
pieces of the same vectors (recursive doubling of 3 float64 per tensor, in a fixed pairing, so every one of them gets
the same bits and the same coefficients), and the kept half becomes ``ca * left + cb * right``. The halves then travel
back by distance halving. Each rank sends ``(n-1)/n`` of the buffer each way, like a ring, plus ``24`` bytes per tensor
per norm exchange. The number of ranks must be a power of two, as in Horovod.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from horovod.algorithms.group import Group, sendrecv
from horovod.common.util import check_adasum_ranks

__all__ = ["NORM_FLOOR", "coefficients", "combine_pair", "adasum_reduce", "vhdd_allreduce"]

NORM_FLOOR = 1e-8   # a squared norm below this keeps its vector's coefficient at 1 (Horovod's rule)


def coefficients(dot: float, anormsq: float, bnormsq: float):
    """The two coefficients of an Adasum pair, from the dot product and the squared norms."""
    ca = 1.0 - dot / anormsq * 0.5 if anormsq >= NORM_FLOOR else 1.0
    cb = 1.0 - dot / bnormsq * 0.5 if bnormsq >= NORM_FLOOR else 1.0
    return ca, cb


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a[i] * b[i])`` as Horovod's loop computes it: each product in the tensors' dtype (float32 or float64),
    accumulated one by one in index order in float64 (``np.dot`` sums in blocks, which changes the last bits)."""
    if a.size == 0:
        return 0.0
    products = a * b if a.dtype in (np.float32, np.float64) else a.astype(np.float64) * b.astype(np.float64)
    return float(np.add.accumulate(products.astype(np.float64, copy=False))[-1])


def combine_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two flat vectors (dot products and norms in float64), in ``a``'s dtype."""
    a64 = a.astype(np.float64, copy=False)
    b64 = b.astype(np.float64, copy=False)
    ca, cb = coefficients(_dot(a, b), _dot(a, a), _dot(b, b))
    return (ca * a64 + cb * b64).astype(a.dtype, copy=False)


def adasum_reduce(contributions: List[np.ndarray], tensor_bounds: Sequence[int]) -> np.ndarray:
    """The recursive formula on whole buffers (a reference): pairs ``(2i, 2i+1)`` level by level, tensor by tensor."""
    n = len(contributions)
    check_adasum_ranks(n)
    level = list(contributions)
    while len(level) > 1:
        merged = []
        for left, right in zip(level[0::2], level[1::2]):
            out = np.empty_like(left)
            for start, stop in zip(tensor_bounds[:-1], tensor_bounds[1:]):
                out[start:stop] = combine_pair(left[start:stop], right[start:stop])
            merged.append(out)
        level = merged
    return level[0]


def _pieces(tensor_bounds: Sequence[int], lo: int, hi: int):
    """Each tensor's piece of the segment ``[lo, hi)``, as (start, stop), empty pieces included."""
    return [(min(max(s, lo), hi), min(max(e, lo), hi)) for s, e in zip(tensor_bounds[:-1], tensor_bounds[1:])]


def _combine(group: Group, distance: int, mine: np.ndarray, theirs: np.ndarray, pieces, left: bool, lo: int):
    """Combine the kept segment ``mine`` with the partner's ``theirs`` (same span), tensor by tensor, in place."""
    sums = np.zeros((len(pieces), 3))
    a64 = mine.astype(np.float64, copy=False)
    b64 = theirs.astype(np.float64, copy=False)
    for i, (s, e) in enumerate(pieces):
        if e > s:
            a, b = mine[s - lo:e - lo], theirs[s - lo:e - lo]
            na, nb = _dot(a, a), _dot(b, b)
            sums[i] = (_dot(a, b), na, nb) if left else (_dot(a, b), nb, na)
    incoming = np.empty_like(sums)
    step = 1
    while step <= distance:    # sum over the 2 * distance ranks holding pieces of these vectors
        sendrecv(group, group.index ^ step, sums, incoming)
        sums += incoming
        step <<= 1
    for i, (s, e) in enumerate(pieces):
        if e > s:
            dot, nleft, nright = sums[i]
            ca, cb = coefficients(dot, nleft, nright) if left else coefficients(dot, nright, nleft)[::-1]
            a, b = a64[s - lo:e - lo], b64[s - lo:e - lo]
            mine[s - lo:e - lo] = ca * a + cb * b if left else cb * a + ca * b


def vhdd_allreduce(group: Group, buf: np.ndarray, tensor_bounds: Sequence[int], scratch: np.ndarray) -> None:
    """Adasum of ``buf`` over ``group`` in place by vector halving, distance doubling (Horovod's pairing).

    Args:
        tensor_bounds: offsets of the tensors packed in ``buf`` (``[0, ..., buf.size]``).
        scratch: at least ``buf.size // 2 + 1`` elements of ``buf``'s dtype.

    Raises:
        NotImplementedError: the group's size is not a power of two.
    """
    n, me = group.size, group.index
    check_adasum_ranks(n)
    lo, hi = 0, buf.size
    spans = []
    distance = 1
    while distance < n:
        half = (hi - lo) >> 1
        left = not me & distance
        keep, give = ((lo, lo + half), (lo + half, hi)) if left else ((lo + half, hi), (lo, lo + half))
        incoming = scratch[:keep[1] - keep[0]]
        sendrecv(group, me ^ distance, buf[give[0]:give[1]], incoming)
        _combine(group, distance, buf[keep[0]:keep[1]], incoming, _pieces(tensor_bounds, *keep), left, keep[0])
        spans.append(give)
        lo, hi = keep
        distance <<= 1
    while spans:          # distance halving: the partner sends back the half this rank gave it, now combined
        distance >>= 1
        give = spans.pop()
        sendrecv(group, me ^ distance, buf[lo:hi], buf[give[0]:give[1]])
        lo, hi = min(lo, give[0]), max(hi, give[1])
