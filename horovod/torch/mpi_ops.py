"""Horovod's ``horovod.torch.mpi_ops``: every op and name that module had, for code that imports it from there.

The ops live where they belong — asynchronous and in-place ones in :mod:`horovod.torch.async_ops`, the
differentiable synchronous ones in :mod:`horovod.torch.autograd` — and the basics, op constants, process sets and
``_basics`` come from :mod:`horovod.runtime.mpi_ops_names`; each name here is the same object as ``hvd.<name>``.
"""

from horovod.runtime.mpi_ops_names import *  # noqa: F401,F403 — init, rank, size, op constants, process sets
from horovod.runtime.mpi_ops_names import __all__ as _names
from horovod.runtime.mpi_ops_names import _basics  # noqa: F401 — Horovod's mpi_ops._basics
from horovod.torch.async_ops import *  # noqa: F401,F403
from horovod.torch.async_ops import __all__ as _async_names
from horovod.torch.autograd import *  # noqa: F401,F403
from horovod.torch.autograd import __all__ as _sync_names

__all__ = list(_names) + list(_async_names) + list(_sync_names)
