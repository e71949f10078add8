"""``horovod.common.topology``, Horovod's public path for :mod:`horovod.runtime.topology`: the same objects, not
copies. A name outside the module's public list (one of Horovod's private helpers) is read from it when asked for.
"""

from horovod.runtime import topology as _module
from horovod.runtime.topology import *  # noqa: F401,F403 — the same objects under Horovod's path

__all__ = list(_module.__all__)


def __getattr__(attribute: str):
    return getattr(_module, attribute)
