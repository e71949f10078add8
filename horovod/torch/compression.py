"""Gradient compression applied around an allreduce: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``.

The rule (only floating-point tensors are cast; the dtype comes back after the collective) is
:func:`horovod.runtime.compression.cast_compressor`; this module only says how torch reads a dtype and casts.
"""

from __future__ import annotations

import torch

from horovod.runtime.compression import Compressor, NoneCompressor, cast_compressor, compression_namespace

_TORCH = dict(dtype_of=lambda t: t.dtype, is_floating=lambda d: d.is_floating_point, cast=lambda t, d: t.type(d),
              module=__name__)

FP16Compressor = cast_compressor("FP16Compressor", torch.float16, **_TORCH)
BF16Compressor = cast_compressor("BF16Compressor", torch.bfloat16, **_TORCH)
Compression = compression_namespace(FP16Compressor, BF16Compressor, module=__name__)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
