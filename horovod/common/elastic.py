"""``horovod.common.elastic``, Horovod's public path for :mod:`horovod.elastic`: the same objects, not copies. A name
outside the module's public list (one of Horovod's private helpers) is read from it when asked for.
"""

from horovod import elastic as _module
from horovod.elastic import (ElasticIndexSampler, HorovodInternalError, HostUpdateResult, HostsUpdatedInterrupt,
                             ObjectState, State, reset_horovod, run, run_fn)

__all__ = ["State", "ObjectState", "run", "run_fn", "reset_horovod", "ElasticIndexSampler", "HostUpdateResult",
           "HorovodInternalError", "HostsUpdatedInterrupt"]


def __getattr__(attribute: str):
    return getattr(_module, attribute)
