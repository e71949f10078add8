"""Work buffers that persist between collectives and only grow, so that a steady training loop allocates nothing."""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

__all__ = ["Buffers"]


class Buffers:
    """Persistent, growing work buffers keyed by purpose and dtype."""

    def __init__(self):
        self._buffers: Dict[Tuple[str, np.dtype], np.ndarray] = {}

    def get(self, purpose: str, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` for ``purpose``; the same memory each time, grown when too small."""
        key = (purpose, np.dtype(dtype))
        buf = self._buffers.get(key)
        if buf is None or buf.size < count:
            buf = np.empty(max(count, 1), dtype=dtype)
            self._buffers[key] = buf
        return buf[:count]
