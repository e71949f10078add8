"""Horovod's ``horovod.runner.util`` helpers that code outside the package imports (``threads``)."""

__all__ = []
