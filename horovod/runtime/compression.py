"""Gradient compression, once for every binding: ``compress`` before a collective, ``decompress`` after it.

A compressor is a class with static ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) ->
tensor``; ``ctx`` is whatever ``decompress`` needs to undo the compression (None: nothing to undo). The cast rule of
Horovod's ``Compression.fp16`` and ``Compression.bf16`` is written here once, :func:`cast_compressor`: a
floating-point tensor of another dtype travels in the wire dtype and comes back in its own; anything else passes
through unchanged. A binding supplies only how its framework reads a dtype and casts (three small callables) and
gets its ``Compression`` namespace from :func:`compression_namespace`.

Contract (every compressor here keeps it): ``decompress(*compress(x))`` has ``x``'s dtype and shape, and
``compress`` is a pure function of its argument, so it may run inside ``tf.function``, ``jax.jit`` or autograd.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Compressor", "NoneCompressor", "cast_compressor", "wire_dtype_name", "compression_namespace",
           "compress_all", "decompress_all", "Compression", "FP16Compressor"]


class Compressor:
    """Interface: ``compress`` before the collective, ``decompress`` after it (both static)."""

    @staticmethod
    def compress(tensor) -> Tuple[Any, Any]:
        """Return ``(tensor as it travels, ctx)``; ``ctx`` is handed back to :meth:`decompress`."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Undo :meth:`compress` on the collective's result, given the ``ctx`` it returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor travels as it is."""

    wire = None     # the dtype it travels in: its own

    @staticmethod
    def compress(tensor):
        """``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """``tensor``."""
        return tensor


def cast_compressor(name: str, wire_dtype, *, dtype_of: Callable[[Any], Any], is_floating: Callable[[Any], bool],
                    cast: Callable[[Any, Any], Any], prepare: Optional[Callable[[Any], Any]] = None,
                    module: Optional[str] = None) -> type:
    """A :class:`Compressor` class that sends floating-point tensors as ``wire_dtype`` and restores their dtype.

    Args:
        name: the class name (``"FP16Compressor"``).
        wire_dtype: the framework's dtype object the tensor travels in.
        dtype_of: ``tensor -> dtype``.
        is_floating: ``dtype -> bool``, whether the cast applies.
        cast: ``(tensor, dtype) -> tensor``.
        prepare: applied to the input first (e.g. ``tf.convert_to_tensor``); None: nothing.
        module: the ``__module__`` the class reports (the binding's compression module).
    Returns:
        The class; its ``compress`` returns ``(cast tensor, original dtype)``, or ``(tensor, None)`` when the tensor
        is not floating point or already travels in ``wire_dtype``; its ``wire`` is that dtype's name
        (:func:`wire_dtype_name`: ``"float16"``, ``"bfloat16"``), the same whichever framework made it.
    """
    def compress(tensor):
        """The tensor cast to the wire dtype, and what decompress needs to restore it."""
        if prepare is not None:
            tensor = prepare(tensor)
        dtype = dtype_of(tensor)
        if is_floating(dtype) and dtype != wire_dtype:
            return cast(tensor, wire_dtype), dtype
        return tensor, None

    def decompress(tensor, ctx):
        """The tensor cast back to the dtype it had before compress."""
        return tensor if ctx is None else cast(tensor, ctx)

    compress.__doc__ = f"Cast a floating-point tensor to {wire_dtype}; returns (tensor, its dtype or None)."
    decompress.__doc__ = "Cast back to the dtype ``compress`` returned (nothing when it returned None)."
    doc = f"Send floating-point tensors as {wire_dtype}, restore their dtype after."
    return type(name, (Compressor,), {"__doc__": doc, "__module__": module or __name__,
                                      "wire": wire_dtype_name(wire_dtype),
                                      "compress": staticmethod(compress), "decompress": staticmethod(decompress)})


def wire_dtype_name(dtype) -> str:
    """A framework's dtype object by its own name, the same in every framework: ``"float16"`` for
    ``torch.float16``, ``tf.float16`` and ``np.dtype(np.float16)``; ``"bfloat16"`` likewise."""
    return str(getattr(dtype, "name", dtype)).rsplit(".", 1)[-1]


def compression_namespace(fp16: type, bf16: Optional[type] = None, module: Optional[str] = None) -> type:
    """The ``Compression`` class a binding exports: ``none``, ``fp16`` and (where the framework has it) ``bf16``."""
    attrs = {"__doc__": "The available compressors: ``none``, ``fp16``" + (" and ``bf16``." if bf16 else "."),
             "__module__": module or __name__, "none": NoneCompressor, "fp16": fp16}
    if bf16 is not None:
        attrs["bf16"] = bf16
    return type("Compression", (), attrs)


def compress_all(compression, tensors: Sequence) -> Tuple[List[Any], List[Any]]:
    """Compress each tensor: ``(compressed tensors, their ctxs)``, both in order."""
    pairs = [compression.compress(t) for t in tensors]
    return [t for t, _ in pairs], [c for _, c in pairs]


def decompress_all(compression, tensors: Sequence, ctxs: Sequence) -> List[Any]:
    """Undo :func:`compress_all` on the collectives' results."""
    return [compression.decompress(t, c) for t, c in zip(tensors, ctxs)]


def _np_dtype(array) -> np.dtype:
    return np.asarray(array).dtype


FP16Compressor = cast_compressor("FP16Compressor", np.dtype(np.float16), dtype_of=_np_dtype,
                                 is_floating=lambda d: np.issubdtype(d, np.floating),
                                 cast=lambda a, d: np.asarray(a).astype(d))

Compression = compression_namespace(FP16Compressor)
Compression.__doc__ = "Compressors for numpy arrays: ``none`` and ``fp16`` (numpy has no bfloat16)."
