"""Gradient compression for JAX: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``.

The cast rule is :func:`horovod.runtime.compression.cast_compressor`'s, shared with every binding: a floating-point
array travels in the wire dtype and comes back in its own; anything else passes through. The casts are ``jnp``
operations, so compression works eagerly and inside ``jax.jit`` and ``jax.grad``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from horovod.runtime.compression import Compressor, NoneCompressor, cast_compressor, compression_namespace


def _dtype_of(array) -> np.dtype:
    return np.dtype(array.dtype) if hasattr(array, "dtype") else np.dtype(jnp.asarray(array).dtype)


def _cast(array, dtype):
    return jnp.asarray(array).astype(dtype)


FP16Compressor = cast_compressor("FP16Compressor", np.dtype(jnp.float16), dtype_of=_dtype_of,
                                 is_floating=lambda d: bool(jnp.issubdtype(d, jnp.floating)), cast=_cast,
                                 module=__name__)
BF16Compressor = cast_compressor("BF16Compressor", np.dtype(jnp.bfloat16), dtype_of=_dtype_of,
                                 is_floating=lambda d: bool(jnp.issubdtype(d, jnp.floating)), cast=_cast,
                                 module=__name__)
Compression = compression_namespace(FP16Compressor, BF16Compressor, module=__name__)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
