"""The compressor interface shared by the bindings: ``compress`` before a collective, ``decompress`` after it.

A compressor is a class with static ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) -> tensor``.
Each binding adds the casts its framework spells its own way (``Compression.fp16``, ``Compression.bf16``).
"""


class Compressor:
    """Interface: ``compress`` before the collective, ``decompress`` after it."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


__all__ = ["Compressor", "NoneCompressor"]
