"""``horovod.common.launch_env``, Horovod's public path for :mod:`horovod.runtime.launch_env`: the same objects, not
copies. A name outside the module's public list (one of Horovod's private helpers) is read from it when asked for.
"""

from horovod.runtime import launch_env as _module
from horovod.runtime.launch_env import *  # noqa: F401,F403 — the same objects under Horovod's path

__all__ = list(_module.__all__)


def __getattr__(attribute: str):
    return getattr(_module, attribute)
