"""``horovod.common.process_sets``, Horovod's public path for :mod:`horovod.runtime.process_sets`: the same objects,
not copies. A name outside the module's public list (one of Horovod's private helpers) is read from it when asked
for.
"""

from horovod.runtime import process_sets as _module
from horovod.runtime.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


def __getattr__(attribute: str):
    return getattr(_module, attribute)
