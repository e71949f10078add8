"""Gradient compression around a collective: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``.

The rule (only floating-point tensors are cast; the dtype comes back after the collective) is
:func:`horovod.runtime.compression.cast_compressor`; this module only says how TensorFlow reads a dtype and casts.
"""

from __future__ import annotations

import tensorflow as tf

from horovod.runtime.compression import Compressor, NoneCompressor, cast_compressor, compression_namespace

_TF = dict(dtype_of=lambda t: t.dtype, is_floating=lambda d: d.is_floating, cast=tf.cast,
           prepare=tf.convert_to_tensor, module=__name__)

FP16Compressor = cast_compressor("FP16Compressor", tf.float16, **_TF)
BF16Compressor = cast_compressor("BF16Compressor", tf.bfloat16, **_TF)
Compression = compression_namespace(FP16Compressor, BF16Compressor, module=__name__)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
