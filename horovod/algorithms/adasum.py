"""Adasum: combine gradients so that the parallel update behaves like a sequential one.

Pairs combine as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b`` (coefficient 1 when a norm is ~0), level by level
over partners ``rank XOR 2^k`` as in Horovod's recursive halving; the result is the same on every rank. Each tensor of
a fused buffer is combined on its own. Dot products and norms are taken in float64.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

__all__ = ["combine_pair", "adasum_reduce"]

_TINY = np.sqrt(np.finfo(np.float64).tiny)


def combine_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two flat vectors (dot products and norms in float64), in ``a``'s dtype."""
    a64 = a.astype(np.float64, copy=False)
    b64 = b.astype(np.float64, copy=False)
    dot = float(np.dot(a64, b64))
    na, nb = float(np.dot(a64, a64)), float(np.dot(b64, b64))
    ca = 1.0 if na < _TINY else 1.0 - dot / (2.0 * na)
    cb = 1.0 if nb < _TINY else 1.0 - dot / (2.0 * nb)
    return (ca * a64 + cb * b64).astype(a.dtype, copy=False)


def adasum_reduce(contributions: List[np.ndarray], tensor_bounds: Sequence[int]) -> np.ndarray:
    """Combine one flat buffer per rank (power-of-two count) tensor by tensor; returns the combined buffer."""
    n = len(contributions)
    if n & (n - 1):
        raise ValueError(f"Adasum needs a power-of-two number of ranks, got {n}")
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
