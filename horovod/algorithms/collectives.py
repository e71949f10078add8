"""Which algorithm runs allgather, broadcast, alltoall and reducescatter over a group: shared memory or the network.

Shared memory serves a group whose ranks all live on this host, for buffers of at least ``HOROVOD_SHM_MIN_BYTES``;
alltoall and reducescatter publish whole buffers at once, so past :data:`SHM_MAX_SINGLE_ROUND` they use the
connections instead of growing segments. Every rank of a group decides alike (the sizes are negotiated).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.algorithms import latency, ring, shm_collectives
from horovod.algorithms.group import Group

__all__ = ["SHM_MAX_SINGLE_ROUND", "use_shm", "allgatherv", "broadcast", "alltoall", "reduce_scatter"]

SHM_MAX_SINGLE_ROUND = 256 << 20


def use_shm(group: Group, nbytes: int) -> bool:
    """Whether ``nbytes`` move through the group's shared memory."""
    return group.shm is not None and nbytes >= group.shm.min_bytes


def allgatherv(group: Group, raw: np.ndarray, byte_counts: Sequence[int]) -> None:
    """``raw`` (flat uint8) is laid out by rank with this rank's block in place; afterwards every block is."""
    if use_shm(group, raw.size):
        shm_collectives.allgatherv(group, raw, byte_counts)
    else:
        ring.ring_allgatherv(group, raw, list(byte_counts))


def broadcast(group: Group, raw: np.ndarray, root_index: int) -> None:
    """Copy the flat uint8 ``raw`` of the rank at ``root_index`` to every rank."""
    if use_shm(group, raw.size):
        shm_collectives.broadcast(group, raw, root_index)
    elif group.size > 2 and raw.size <= ring.EXCHANGE_MAX_BYTES:
        if latency.prefer_recursive_doubling(group.size, raw.size):
            latency.binomial_broadcast(group, raw, root_index)  # log2 n hops; the root sends log2 n messages
        else:
            latency.direct_broadcast(group, raw, root_index)  # one hop; the chain's n - 1 cost more than the bytes
    else:
        ring.chain_broadcast(group, raw, root_index)


def alltoall(group: Group, send: np.ndarray, send_bounds: Sequence[int], recv: np.ndarray,
             recv_bounds: Sequence[int], source_offsets: Sequence[int], largest_send: int) -> None:
    """Rank i's block ``send[send_bounds[j]:send_bounds[j+1]]`` lands in rank j's ``recv`` block i (uint8).

    ``source_offsets[j]`` is where the block for this rank starts in rank j's send buffer, ``largest_send`` the
    largest send buffer of the group.
    """
    if use_shm(group, largest_send) and largest_send <= SHM_MAX_SINGLE_ROUND:
        shm_collectives.alltoall(group, send, recv, recv_bounds, source_offsets, largest_send)
    else:
        ring.pairwise_alltoall(group, send, send_bounds, recv, recv_bounds)


def reduce_scatter(group: Group, buf: np.ndarray, bounds: Sequence[int], ufunc, scratch: np.ndarray) -> None:
    """After this, ``buf[bounds[i]:bounds[i+1]]`` on the rank at position i holds the reduction over the group.

    ``scratch`` holds at least the largest segment.
    """
    if group.size == 1:
        return
    if use_shm(group, buf.nbytes) and buf.nbytes <= SHM_MAX_SINGLE_ROUND:
        shm_collectives.reduce_scatter(group, buf, bounds, ufunc)
    else:
        ring.ring_reduce_scatter(group, buf, bounds, ufunc, scratch)
