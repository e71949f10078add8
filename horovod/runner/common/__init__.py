"""Horovod's ``horovod.runner.common`` namespace: the ``util`` helpers code written for Horovod imports."""

__all__ = []
