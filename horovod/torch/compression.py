"""Gradient compression applied around an allreduce: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``.

A compressor is a class with static ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) -> tensor``;
only floating-point tensors are cast, anything else passes through unchanged.
"""

from __future__ import annotations

import torch

from horovod.common.compression import Compressor, NoneCompressor


def _cast_compressor(wire_dtype: torch.dtype, doc: str):
    class _Cast(Compressor):
        __doc__ = doc

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != wire_dtype:
                return tensor.type(wire_dtype), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.type(ctx)
    return _Cast


FP16Compressor = _cast_compressor(torch.float16, "Send floating-point tensors as float16, restore the dtype after.")
FP16Compressor.__name__ = FP16Compressor.__qualname__ = "FP16Compressor"
BF16Compressor = _cast_compressor(torch.bfloat16, "Send floating-point tensors as bfloat16, restore the dtype after.")
BF16Compressor.__name__ = BF16Compressor.__qualname__ = "BF16Compressor"


class Compression:
    """The available compressors: ``none``, ``fp16`` and ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
