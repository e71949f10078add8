"""Horovod 0.28.1's CPU Adasum (``horovod/common/ops/adasum/adasum.h``), simulated for every rank at once in numpy.

Written from Horovod's definition, independently of ``horovod.algorithms.adasum``:

* vector halving, distance doubling over ``n`` ranks (a power of two; Horovod refuses any other count): at level
  1, 2, 4, ... a rank pairs with ``rank ^ level``; the rank whose ``level`` bit is clear keeps the first
  ``count >> 1`` elements of its segment, its partner the rest;
* on the kept segment, per tensor: ``dot``, ``|a|²``, ``|b|²`` accumulated element by element in double
  (``x += a[i] * b[i]``, each product and sum rounded, in index order), stored as ``[dot, |left|², |right|²]``;
* those triples summed over the ``2 * level`` ranks of the reduction communicator by recursive doubling
  (``rank ^ 1``, then ``rank ^ 2``, ...: the tree ``((v0 + v1) + (v2 + v3))``; MPI's small-message allreduce);
* ``a = ca * a + cb * b`` with ``c = 1 - dot / |x|² * 0.5``, or 1 when ``|x|² < 1e-8``;
* then the segments travel back unchanged (distance halving).

Each multiply and add is rounded on its own, as the source is written (a compiler contracting them into fused
multiply-adds would change the last bits).
"""

from typing import List, Sequence

import numpy as np

__all__ = ["horovod_adasum", "sequential_dot"]


def sequential_dot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a[i] * b[i])`` accumulated in index order in float64, as Horovod's loop does."""
    if a.size == 0:
        return 0.0
    return float(np.add.accumulate(a.astype(np.float64) * b.astype(np.float64))[-1])


def _pieces(counts: Sequence[int], lo: int, hi: int):
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [(min(max(s, lo), hi), min(max(e, lo), hi)) for s, e in zip(bounds[:-1], bounds[1:])]


def _level(bufs: List[np.ndarray], spans: List[tuple], counts, level: int):
    n = len(bufs)
    keep, triples = [], []
    for r in range(n):
        lo, hi = spans[r]
        half = (hi - lo) >> 1
        keep.append((lo, lo + half) if not r & level else (lo + half, hi))
    for r in range(n):
        a, b = bufs[r], bufs[r ^ level]
        left = not r & level
        t = []
        for s, e in _pieces(counts, *keep[r]):
            dot, na, nb = sequential_dot(a[s:e], b[s:e]), sequential_dot(a[s:e], a[s:e]), sequential_dot(b[s:e],
                                                                                                        b[s:e])
            t.append([dot, na, nb] if left else [dot, nb, na])
        triples.append(np.array(t, dtype=np.float64).reshape(len(counts), 3))
    step = 1
    while step <= level:       # recursive doubling over the 2 * level ranks sharing the higher bits
        triples = [triples[r] + triples[r ^ step] for r in range(n)]
        step <<= 1
    out = [buf.copy() for buf in bufs]
    for r in range(n):
        left = not r & level
        for (s, e), (dot, nleft, nright) in zip(_pieces(counts, *keep[r]), triples[r]):
            if e == s:
                continue
            na, nb = (nleft, nright) if left else (nright, nleft)
            ca = 1.0 - dot / na * 0.5 if na >= 1e-8 else 1.0
            cb = 1.0 - dot / nb * 0.5 if nb >= 1e-8 else 1.0
            out[r][s:e] = ca * bufs[r][s:e] + cb * bufs[r ^ level][s:e]
    return out, keep


def horovod_adasum(contributions: Sequence[np.ndarray], counts: Sequence[int] = None) -> np.ndarray:
    """The result every rank holds after Horovod's Adasum of one fused float64 buffer per rank.

    Args:
        contributions: each rank's flat buffer, the tensors packed one after another.
        counts: the elements of each tensor in the buffer (one tensor when None).
    """
    n = len(contributions)
    if n & (n - 1):
        raise ValueError(f"Horovod's Adasum needs a power-of-two number of ranks, not {n}")
    bufs = [np.asarray(c, dtype=np.float64).reshape(-1).copy() for c in contributions]
    size = bufs[0].size
    counts = [size] if counts is None else list(counts)
    spans = [(0, size)] * n
    level = 1
    while level < n:
        bufs, spans = _level(bufs, spans, counts, level)
        level <<= 1
    result = np.empty(size)
    for r in range(n):
        lo, hi = spans[r]
        result[lo:hi] = bufs[r][lo:hi]
    return result
