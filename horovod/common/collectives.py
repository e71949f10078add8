"""``horovod.common.collectives``, Horovod's public path for :mod:`horovod.runtime.collectives`: the same objects, not
copies. A name outside the module's public list (one of Horovod's private helpers) is read from it when asked for.
"""

from horovod.runtime import collectives as _module
from horovod.runtime.collectives import *  # noqa: F401,F403 — the same objects under Horovod's path


def __getattr__(attribute: str):
    return getattr(_module, attribute)
