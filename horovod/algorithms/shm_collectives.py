"""Collectives among the ranks of one host, through shared-memory segments.

Allreduce, chunk by chunk: every rank copies the slices its peers will reduce into its own segment; after a barrier
each rank reduces its own slice in its own buffer, reading that slice straight from its peers' segments, and publishes
the result; after a second barrier every rank copies the peers' reduced slices out. Each slice is reduced by exactly
one rank, so every rank gets the same bits.
Chunks alternate between the two halves of each segment, also from one collective to the next (the segments keep
the count), so no collective needs a barrier of its own at its end: the barrier that publishes chunk k+1 also proves
that everybody finished reading chunk k-1, whose half chunk k+1 reuses. Alltoall and reducescatter use whole
segments, so they first wait (``settle``) until everybody finished reading what came before.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.algorithms import reduction
from horovod.algorithms.group import Group, segment_bounds

__all__ = ["CHUNK_BYTES", "SPIN_CHUNK_BYTES", "BLOCK_BYTES", "allreduce", "allgatherv", "broadcast", "alltoall",
           "reduce_scatter"]

CHUNK_BYTES = 4 << 20   # a few barriers per large buffer, while chunks still fit in the L3 cache
# Where barriers may spin (local ranks have a core each) they are cheap, and smaller chunks are still in cache when
# the peers read them: 10-35 % more bandwidth at 4-256 MiB on two ranks. Where they sleep (ranks outnumber cores),
# fewer, larger chunks win. Every rank of a host decides alike, as the chunking must agree.
SPIN_CHUNK_BYTES = 2 << 20
BLOCK_BYTES = 256 << 10  # the reduced slice goes back to the caller's buffer in blocks that fit in the L2 cache


def _chunk_bytes(group: Group) -> int:
    return min(CHUNK_BYTES, SPIN_CHUNK_BYTES) if group.shm.spin_seconds > 0 else CHUNK_BYTES


def _half(group: Group, position: int, half: int, dtype, count: int) -> np.ndarray:
    seg = group.shm.view(position)
    half_bytes = len(seg) // 2
    start = half * half_bytes
    return seg[start:start + count * np.dtype(dtype).itemsize].view(dtype)


def allreduce(group: Group, buf: np.ndarray, ufunc, post: float = 1.0) -> None:
    """Reduce the flat contiguous ``buf`` in place across the group's ranks, then multiply by ``post``.

    The reduced slice is written straight into this rank's segment and scaled on its way out of it, on every rank
    alike, so a scaled (averaged) allreduce moves no more bytes than a sum: about 4.5 passes over the buffer at two
    ranks instead of 6.5 with a separate scaling pass. Integer buffers are scaled afterwards, as ``reduction.scale``
    truncates them through float64.
    """
    shm, n, me = group.shm, group.size, group.index
    itemsize = buf.itemsize
    fused_scale = post != 1.0 and buf.dtype.kind in "fc"
    factor = buf.dtype.type(post) if fused_scale else None
    chunk = max(1, min(buf.size, _chunk_bytes(group) // itemsize))
    shm.ensure(2 * chunk * itemsize)
    for start in range(0, buf.size, chunk):
        stop = min(buf.size, start + chunk)
        count = stop - start
        half = shm.next_half()
        mine = _half(group, me, half, buf.dtype, count)
        bounds = segment_bounds(count, n)
        lo, hi = bounds[me], bounds[me + 1]
        # Peers read only the slices they reduce: our own slice stays in ``buf`` until it is reduced.
        mine[:lo] = buf[start:start + lo]
        mine[hi:] = buf[start + hi:stop]
        shm.barrier()
        peers = [_half(group, peer, half, buf.dtype, count) for peer in range(n) if peer != me]
        _reduce_slice(buf[start + lo:start + hi], mine[lo:hi], [p[lo:hi] for p in peers], ufunc, factor)
        shm.barrier()
        for peer in range(n):
            a, b = bounds[peer], bounds[peer + 1]
            if peer != me and b > a:
                published = _half(group, peer, half, buf.dtype, count)[a:b]
                if fused_scale:
                    np.multiply(published, factor, out=buf[start + a:start + b])
                else:
                    buf[start + a:start + b] = published
    shm.unsettle()
    if post != 1.0 and not fused_scale:
        reduction.scale(buf, post)


def _reduce_slice(own: np.ndarray, result: np.ndarray, peers, ufunc, factor) -> None:
    """Reduce this rank's slice ``own`` with the peers' into ``result`` (its segment), times ``factor`` unless None,
    and copy it back into ``own``; block by block, so that each block is copied back while it is still in the cache."""
    block = max(1, BLOCK_BYTES // own.itemsize)
    for lo in range(0, own.size, block):
        hi = min(own.size, lo + block)
        mine, out = own[lo:hi], result[lo:hi]
        source = mine
        for theirs in peers:
            ufunc(source, theirs[lo:hi], out=out)
            source = out
        if factor is not None:
            np.multiply(out, factor, out=mine)
        else:
            mine[:] = out


def allgatherv(group: Group, out: np.ndarray, byte_counts: Sequence[int]) -> None:
    """``out`` (flat uint8) is laid out by rank; this rank's block is in place. Chunked by the largest block."""
    shm, n, me = group.shm, group.size, group.index
    offsets = [0]
    for count in byte_counts:
        offsets.append(offsets[-1] + count)
    largest = max(byte_counts) if byte_counts else 0
    if largest == 0:
        return
    chunk = min(largest, _chunk_bytes(group))
    shm.ensure(2 * chunk)
    for start in range(0, largest, chunk):
        half = shm.next_half()
        mine_len = max(0, min(byte_counts[me] - start, chunk))
        if mine_len:
            _half(group, me, half, np.uint8, mine_len)[:] = out[offsets[me] + start:offsets[me] + start + mine_len]
        shm.barrier()
        for peer in range(n):
            if peer == me:
                continue
            length = max(0, min(byte_counts[peer] - start, chunk))
            if length:
                out[offsets[peer] + start:offsets[peer] + start + length] = _half(group, peer, half, np.uint8, length)
    shm.unsettle()


def broadcast(group: Group, buf: np.ndarray, root_index: int) -> None:
    """Copy the root's flat uint8 ``buf`` to every rank, chunk by chunk through the root's segment."""
    shm, me = group.shm, group.index
    if buf.size == 0:
        return
    chunk = min(buf.size, _chunk_bytes(group))
    shm.ensure(2 * chunk)
    for start in range(0, buf.size, chunk):
        half = shm.next_half()
        length = min(chunk, buf.size - start)
        if me == root_index:
            _half(group, me, half, np.uint8, length)[:] = buf[start:start + length]
        shm.barrier()
        if me != root_index:
            buf[start:start + length] = _half(group, root_index, half, np.uint8, length)
    shm.unsettle()


def alltoall(group: Group, send: np.ndarray, recv: np.ndarray, recv_bounds: Sequence[int],
             source_offsets: Sequence[int], largest_send: int) -> None:
    """Every rank publishes its whole send buffer (flat uint8) once; each copies its block out of every peer's.

    ``source_offsets[j]`` is where, in rank j's send buffer, the block for this rank starts; ``largest_send`` the
    largest send buffer in the group (every segment must hold it).
    """
    shm, n = group.shm, group.size
    shm.ensure(max(largest_send, 1))
    shm.settle()
    shm.view(group.index)[:send.size] = send
    shm.barrier()
    for peer in range(n):
        length = recv_bounds[peer + 1] - recv_bounds[peer]
        if length:
            recv[recv_bounds[peer]:recv_bounds[peer + 1]] = \
                shm.view(peer)[source_offsets[peer]:source_offsets[peer] + length]
    shm.barrier()


def reduce_scatter(group: Group, buf: np.ndarray, bounds: Sequence[int], ufunc) -> None:
    """After this, this rank's slice ``buf[bounds[i]:bounds[i+1]]`` holds the reduction over the group."""
    shm, n, me = group.shm, group.size, group.index
    nbytes = buf.size * buf.itemsize
    shm.ensure(max(nbytes, 1))
    shm.settle()
    mine = shm.view(me)[:nbytes].view(buf.dtype)
    mine[:] = buf
    shm.barrier()
    lo, hi = bounds[me], bounds[me + 1]
    for peer in range(n):
        if peer != me and hi > lo:
            ufunc(buf[lo:hi], shm.view(peer)[:nbytes].view(buf.dtype)[lo:hi], out=buf[lo:hi])
    shm.barrier()
