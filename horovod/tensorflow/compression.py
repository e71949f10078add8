"""Gradient compression around a collective: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``.

A compressor has static ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) -> tensor``; only
floating-point tensors are cast, anything else passes through unchanged.
"""

from __future__ import annotations

import tensorflow as tf

from horovod.common.compression import Compressor, NoneCompressor


def _cast_compressor(name: str, wire_dtype: tf.DType, doc: str):
    def compress(tensor):
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype.is_floating and tensor.dtype != wire_dtype:
            return tf.cast(tensor, wire_dtype), tensor.dtype
        return tensor, None

    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)

    return type(name, (Compressor,), {"__doc__": doc, "__module__": __name__,
                                      "compress": staticmethod(compress), "decompress": staticmethod(decompress)})


FP16Compressor = _cast_compressor("FP16Compressor", tf.float16,
                                  "Send floating-point tensors as float16, restore the dtype after.")
BF16Compressor = _cast_compressor("BF16Compressor", tf.bfloat16,
                                  "Send floating-point tensors as bfloat16, restore the dtype after.")


class Compression:
    """The available compressors: ``none``, ``fp16`` and ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
