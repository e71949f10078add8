"""Hierarchical allreduce: reduce within each host, ring across hosts among one leader per host, share back.

With several ranks per host, only one rank per host sends each byte across the network, and the within-host steps
run at memory speed through shared memory. Enabled by ``HOROVOD_HIERARCHICAL_ALLREDUCE`` when a set spans hosts.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from horovod.algorithms import ring, shm_collectives
from horovod.algorithms.group import Group

__all__ = ["Hierarchy", "allreduce"]


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """The two levels of a set spanning hosts: this host's ranks, and one leader per host."""

    local: Group                 # the ranks of this host (with shared memory when available)
    cross: Optional[Group]       # the hosts' leaders; None on ranks that are not their host's leader


def allreduce(hierarchy: Hierarchy, buf: np.ndarray, ufunc, scratch: np.ndarray,
              cross_op: Optional[Callable[[Group, np.ndarray], None]] = None) -> None:
    """Reduce ``buf`` in place over every rank of every host.

    ``cross_op(cross_group, buf)`` combines the hosts' results among the leaders (default: a ring reduction with
    ``ufunc``; hierarchical Adasum passes its own).
    """
    local, cross = hierarchy.local, hierarchy.cross
    _local_allreduce(local, buf, ufunc, scratch)
    if cross is not None:
        if cross_op is None:
            ring.ring_allreduce(cross, buf, ufunc, scratch)
        else:
            cross_op(cross, buf)
    if local.size > 1:
        raw = buf.reshape(-1).view(np.uint8)
        if local.shm is not None:
            shm_collectives.broadcast(local, raw, 0)
        else:
            ring.chain_broadcast(local, raw, 0)


def _local_allreduce(local: Group, buf: np.ndarray, ufunc, scratch: np.ndarray) -> None:
    if local.size == 1:
        return
    if local.shm is not None:
        shm_collectives.allreduce(local, buf, ufunc)
    else:
        ring.ring_allreduce(local, buf, ufunc, scratch)
