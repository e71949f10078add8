"""``horovod.elastic.protocol``, the path this package's earlier layout gave :mod:`horovod.common.elastic_records` (not
one of Horovod's: 0.28.1 had no ``horovod.elastic`` package): the same objects, not copies. A name outside the
module's public list is read from it when asked for.
"""

from horovod.common import elastic_records as _module
from horovod.common.elastic_records import (ASSIGN_SCOPE, BROKEN_ROUND_KEY, ENDED, HOSTS_UPDATED_KEY, NOTIFY_SCOPE,
                                            READY_SCOPE, REMOVED, Assignment, HostUpdateResult, decode_answer,
                                            decode_update, encode_update, slot_key)

__all__ = ["ASSIGN_SCOPE", "BROKEN_ROUND_KEY", "ENDED", "HOSTS_UPDATED_KEY", "NOTIFY_SCOPE", "READY_SCOPE", "REMOVED",
           "Assignment", "HostUpdateResult", "decode_answer", "decode_update", "encode_update", "slot_key"]


def __getattr__(attribute: str):
    return getattr(_module, attribute)
