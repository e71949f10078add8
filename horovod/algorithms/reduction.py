"""Elementwise reductions into preallocated buffers, and the float32 accumulators for 2-byte floats."""

from __future__ import annotations

import numpy as np

from horovod.common.bfloat16 import from_bfloat16, to_bfloat16
from horovod.common.types import ReduceOp

__all__ = ["ufunc_for", "widens", "to_float32", "from_float32", "scale"]

_UFUNCS = {
    ReduceOp.SUM: np.add, ReduceOp.AVERAGE: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def ufunc_for(op: int):
    """The numpy ufunc that combines two contributions under ``op`` (Average sums, then divides)."""
    try:
        return _UFUNCS[ReduceOp(op)]
    except (KeyError, ValueError):
        raise ValueError(f"reduce op {op} has no elementwise ufunc") from None


def widens(dtype: str) -> bool:
    """2-byte floats are reduced in float32 so that sums do not lose precision hop by hop."""
    return dtype in ("float16", "bfloat16")


def to_float32(words: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """Widen 2-byte floats ``words`` (``dtype`` float16 or bfloat16) into the float32 ``out``."""
    if dtype == "bfloat16":
        from_bfloat16(words, out=out)
    else:
        np.copyto(out, words, casting="unsafe")


def from_float32(values: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """Narrow float32 ``values`` into ``out`` of ``dtype``, rounding to nearest even (bfloat16 NaN stays NaN)."""
    if dtype == "bfloat16":
        to_bfloat16(values, out=out.view(np.uint16))
    else:
        np.copyto(out, values, casting="unsafe")


def scale(buf: np.ndarray, factor: float) -> None:
    """Multiply in place; integers are scaled in float64 and truncated, as Horovod does."""
    if factor == 1.0:
        return
    if buf.dtype.kind in "iu":
        np.copyto(buf, np.trunc(buf * factor), casting="unsafe")
    elif buf.dtype.kind == "b":
        raise ValueError("boolean tensors cannot be scaled or averaged")
    else:
        np.multiply(buf, buf.dtype.type(factor), out=buf)
