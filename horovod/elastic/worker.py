"""``horovod.elastic.worker``, the path this package's earlier layout gave :mod:`horovod.runtime.elastic_worker` (not
one of Horovod's: 0.28.1 had no ``horovod.elastic`` package): the same objects, not copies. A name outside the
module's public list is read from it when asked for.
"""

from horovod.runtime import elastic_worker as _module
from horovod.runtime.elastic_worker import (current_round, current_version, poll_host_update, resolve_elastic,
                                            round_broken)

__all__ = ["current_round", "current_version", "poll_host_update", "resolve_elastic", "round_broken"]


def __getattr__(attribute: str):
    return getattr(_module, attribute)
