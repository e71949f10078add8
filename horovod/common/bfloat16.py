"""The one bfloat16 codec: float32 values <-> bfloat16 bit patterns (``uint16`` words), with numpy alone.

numpy has no bfloat16, so a bfloat16 tensor travels as its raw 16-bit words. Narrowing rounds to nearest even, as
every bfloat16 conversion does; NaN stays a quiet NaN with its sign (``0x7FC0`` / ``0xFFC0``, as ml_dtypes gives;
rounding a NaN's bits would carry some payloads into the exponent and make them Inf); ±Inf stays ±Inf, and finite
values beyond bfloat16's range round to ±Inf. Widening is exact: the word becomes the float32's upper half.
The engine's reductions and the asynchronous-training wire both use these two functions.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["to_bfloat16", "from_bfloat16"]

_QUIET_NAN = np.uint16(0x7FC0)
_SIGN = np.uint16(0x8000)


def to_bfloat16(values, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The bfloat16 words of ``values``, rounded to nearest even.

    Args:
        values: an array (or scalar) of numbers; anything but float32 is converted to float32 first.
        out: optional ``uint16`` array of the same shape to write into.

    Returns:
        ``out``, or a new ``uint16`` array: NaN as a quiet NaN with its sign, ±Inf as ±Inf.
    """
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = bits >> np.uint32(16)        # the kept half's lowest bit decides a tie: to even
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += bits                        # no wrap: only NaN bit patterns lie above -Inf's, and they are redone
    rounded >>= np.uint32(16)
    if out is None:
        out = np.empty(values.shape, dtype=np.uint16)
    np.copyto(out, rounded, casting="unsafe")
    nan = np.isnan(values)
    if nan.any():
        out[nan] = _QUIET_NAN | ((bits[nan] >> np.uint32(16)).astype(np.uint16) & _SIGN)
    return out


def from_bfloat16(words, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The float32 values of bfloat16 ``words`` (any 2-byte integer array of bit patterns), exactly.

    Args:
        words: the bfloat16 bit patterns.
        out: optional float32 array of the same shape to write into.

    Returns:
        ``out``, or a new float32 array.
    """
    words = np.asarray(words)
    if words.dtype.itemsize != 2 or words.dtype.kind not in "iu":
        raise TypeError(f"bfloat16 words are 2-byte integers, not {words.dtype}")
    if out is None:
        out = np.empty(words.shape, dtype=np.float32)
    np.left_shift(words.view(np.uint16), np.uint32(16), out=out.view(np.uint32), dtype=np.uint32)
    return out
