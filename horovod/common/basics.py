"""``horovod.common.basics``, Horovod's public path for :mod:`horovod.runtime.basics`: the same objects, not copies. A
name outside the module's public list (one of Horovod's private helpers) is read from it when asked for.
"""

from horovod.runtime import basics as _module
# A star import on purpose: this file mirrors Horovod's path for whatever the real module exports (its build queries
# still grow), and the names are exactly its __all__.
from horovod.runtime.basics import *  # noqa: F401,F403 — the same objects under Horovod's path

__all__ = list(_module.__all__)


def __getattr__(attribute: str):
    return getattr(_module, attribute)
