"""The ranks an algorithm runs among: a process set's members, this rank's position, and the transport."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from horovod.transport.base import Transport
from horovod.transport.shm import ShmSegments

__all__ = ["Group", "segment_bounds", "byte_view", "sendrecv"]


@dataclasses.dataclass(frozen=True)
class Group:
    """The ranks of one process set (or of one host, or the hosts' leaders) as an algorithm sees them."""

    ranks: Tuple[int, ...]     # global ranks, in set order
    index: int                 # this rank's position in ``ranks``
    transport: Transport
    shm: Optional[ShmSegments] = None  # when every rank of the group shares this host
    hierarchy: Optional[Any] = None  # horovod.algorithms.hierarchical.Hierarchy for hierarchical allreduce

    @property
    def size(self) -> int:
        """The number of ranks in the group."""
        return len(self.ranks)

    def peer(self, offset: int) -> int:
        """Global rank ``offset`` positions away along the ring."""
        return self.ranks[(self.index + offset) % len(self.ranks)]


def segment_bounds(total: int, parts: int):
    """Offsets splitting ``total`` elements into ``parts`` nearly equal segments (earlier ones one larger)."""
    base, extra = divmod(total, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def byte_view(array: np.ndarray) -> memoryview:
    """The bytes of a contiguous ``array`` (of any shape), without a copy, for the transport."""
    return memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")


def sendrecv(group: Group, partner: int, send: Optional[np.ndarray] = None,
             recv: Optional[np.ndarray] = None) -> None:
    """Send ``send`` to the rank at position ``partner`` while receiving ``recv`` from it (either may be None)."""
    duplex = group.transport.duplex()
    if send is not None:
        duplex.send(group.ranks[partner], byte_view(send))
    if recv is not None:
        duplex.recv(group.ranks[partner], byte_view(recv))
    duplex.run()
