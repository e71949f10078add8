"""Horovod's ``horovod.runner.common.util`` modules (``env``, ``secret``, ``timeout``, ``hosts``, ``settings``,
``network``), each a thin layer over this runner's own modules."""

__all__ = []
