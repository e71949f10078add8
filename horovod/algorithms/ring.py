"""Bandwidth-optimal ring collectives on flat numpy buffers.

Allreduce is a reduce-scatter followed by an allgather: each of the 2(n-1) steps sends one segment to the right
neighbour (from a sender thread) while receiving one from the left, so every link carries 2(n-1)/n of the buffer.
The steps are pipelined in pieces (up to ``CHUNK_BYTES``): a piece is reduced as soon as it lands and passed on at
once, so reduction and the next piece's transfer overlap and no step waits for the previous one to finish. No
per-element Python: buffers move as memoryviews and reduce with ufuncs in place.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from horovod.algorithms import reduction
from horovod.algorithms.group import Group, byte_view, segment_bounds

__all__ = ["CHUNK_BYTES", "EXCHANGE_MAX_BYTES", "ring_reduce_scatter", "ring_allgather_segments", "ring_allreduce",
           "ring_allgatherv", "chain_broadcast", "pairwise_alltoall", "exchange_allreduce"]

CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 128 << 10
# Up to this size an allreduce is latency-bound: one all-to-all exchange of whole buffers (one network hop) beats the
# ring's 2(n-1) dependent steps, and at two ranks it even moves the same bytes.
EXCHANGE_MAX_BYTES = 64 << 10


def ring_reduce_scatter(group: Group, buf: np.ndarray, bounds: Sequence[int], ufunc, scratch: np.ndarray) -> None:
    """After this, ``buf[bounds[i]:bounds[i+1]]`` on the rank at position ``i`` holds the reduction over all ranks.

    Pipelined like :func:`ring_allreduce`. ``scratch`` must hold at least the largest piece.
    """
    n, me = group.size, group.index
    if n == 1 or buf.size == 0:
        return
    left, right, step = group.peer(-1), group.peer(1), _chunk_elems(buf, n)
    duplex = group.transport.duplex()
    first = (me - 1) % n
    for lo, hi in _chunks(bounds[first], bounds[first + 1], step):
        duplex.send(right, byte_view(buf[lo:hi]))
    for k in range(n - 1):
        seg = (me - k - 2) % n
        for lo, hi in _chunks(bounds[seg], bounds[seg + 1], step):
            if hi > lo:
                duplex.recv(left, byte_view(scratch[:hi - lo]),
                            _reduce_and_forward(duplex, right, buf[lo:hi], scratch[:hi - lo], ufunc, k < n - 2))
    duplex.run()


def _reduce_and_forward(duplex, right: int, target: np.ndarray, incoming: np.ndarray, ufunc, forward: bool,
                        postscale: float = 1.0):
    def then() -> None:
        ufunc(target, incoming, out=target)
        if postscale != 1.0:
            reduction.scale(target, postscale)
        if forward:
            duplex.send(right, byte_view(target))
    return then


def _forward(duplex, peer: int, view: memoryview):
    def then() -> None:
        duplex.send(peer, view)
    return then


def ring_allgather_segments(group: Group, buf: np.ndarray, bounds: Sequence[int]) -> None:
    """Each rank owns ``buf[bounds[i]:bounds[i+1]]``; afterwards every rank holds every segment.

    Pipelined like :func:`ring_allreduce`: a piece is passed on to the right as soon as it arrived from the left.
    """
    n, me = group.size, group.index
    if n == 1:
        return
    left, right, step = group.peer(-1), group.peer(1), _chunk_elems(buf, n)
    duplex = group.transport.duplex()
    for lo, hi in _chunks(bounds[me], bounds[me + 1], step):
        if hi > lo:
            duplex.send(right, byte_view(buf[lo:hi]))
    for t in range(n - 1):
        seg = (me - t - 1) % n
        for lo, hi in _chunks(bounds[seg], bounds[seg + 1], step):
            if hi > lo:
                piece = byte_view(buf[lo:hi])
                duplex.recv(left, piece, _forward(duplex, right, piece) if t < n - 2 else None)
    duplex.run()


def _chunks(lo: int, hi: int, step: int):
    """Split ``[lo, hi)`` into nearly equal pieces of at most ``step`` elements (no small tail)."""
    count = max(1, -(-(hi - lo) // step))
    base, extra = divmod(hi - lo, count)
    start = lo
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        yield start, stop
        start = stop


def _chunk_elems(buf: np.ndarray, n: int) -> int:
    # Pieces small enough that a step pipelines (at least four per segment), large enough that Python's per-piece
    # cost (a callback, a ufunc call, a few system calls: ~10 us) stays below a few percent of the piece's transfer.
    seg_bytes = buf.nbytes // n
    piece = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, seg_bytes // 4))
    return max(1, piece // buf.itemsize)


def ring_allreduce(group: Group, buf: np.ndarray, ufunc, scratch: np.ndarray, postscale: float = 1.0) -> None:
    """Reduce the flat contiguous ``buf`` in place across the group, times ``postscale``: a pipelined ring.

    The 2(n-1) steps (reduce-scatter, then allgather) run as one stream of pieces through one
    :class:`~horovod.transport.duplex.Duplex`: a piece is queued for the right neighbour as soon as it has been
    received and reduced, so a step costs about one link transfer, the reduction hides behind the transfer of the
    next piece, and there is no barrier between steps. A piece is overwritten by the allgather only after every
    rank, this one included, reduced it, so a queued send never reads bytes that changed. ``scratch`` is a buffer
    of ``buf``'s dtype with at least one piece's elements (``ceil(buf.size / n)`` always suffices). Each rank
    scales the segment it completes before passing it on, so the scaling costs 1/n of a pass over ``buf`` and
    gives the bits of scaling the whole result afterwards.
    """
    n, me = group.size, group.index
    if n == 1 or buf.size == 0:
        return
    bounds = segment_bounds(buf.size, n)
    left, right, step = group.peer(-1), group.peer(1), _chunk_elems(buf, n)
    duplex = group.transport.duplex()
    first = (me - 1) % n
    for lo, hi in _chunks(bounds[first], bounds[first + 1], step):
        duplex.send(right, byte_view(buf[lo:hi]))
    last = 2 * (n - 1) - 1
    for k in range(last + 1):
        seg = (me - k - 2) % n if k < n - 1 else (me - k + n - 2) % n
        for lo, hi in _chunks(bounds[seg], bounds[seg + 1], step):
            if lo == hi:
                continue
            if k < n - 1:
                duplex.recv(left, byte_view(scratch[:hi - lo]),
                            _reduce_and_forward(duplex, right, buf[lo:hi], scratch[:hi - lo], ufunc, True,
                                                postscale if k == n - 2 else 1.0))
            else:
                piece = byte_view(buf[lo:hi])
                duplex.recv(left, piece, _forward(duplex, right, piece) if k < last else None)
    duplex.run()


def ring_allgatherv(group: Group, out: np.ndarray, byte_counts: List[int]) -> None:
    """``out`` is a flat uint8 buffer laid out by rank; this rank's block is already in place."""
    if group.size == 1:
        return
    bounds = [0]
    for count in byte_counts:
        bounds.append(bounds[-1] + count)
    ring_allgather_segments(group, out, bounds)


def chain_broadcast(group: Group, buf: np.ndarray, root_index: int) -> None:
    """Pipelined broadcast along the ring starting at the root: each rank forwards a chunk while receiving the next."""
    n = group.size
    if n == 1 or buf.size == 0:
        return
    pos = (group.index - root_index) % n
    raw = byte_view(buf)
    prev, nxt = group.peer(-1), group.peer(1)
    duplex = group.transport.duplex()
    for start in range(0, len(raw), CHUNK_BYTES):
        chunk = raw[start:start + CHUNK_BYTES]
        if pos == 0:
            duplex.send(nxt, chunk)
        elif pos < n - 1:
            duplex.recv(prev, chunk, _forward(duplex, nxt, chunk))
        else:
            duplex.recv(prev, chunk)
    duplex.run()


def pairwise_alltoall(group: Group, send: np.ndarray, send_bounds: Sequence[int], recv: np.ndarray,
                      recv_bounds: Sequence[int]) -> None:
    """Rank i's block ``send[send_bounds[j]:send_bounds[j+1]]`` lands in rank j's ``recv`` block i (uint8 buffers)."""
    n, me = group.size, group.index
    recv[recv_bounds[me]:recv_bounds[me + 1]] = send[send_bounds[me]:send_bounds[me + 1]]
    if n == 1:
        return
    duplex = group.transport.duplex()
    for step in range(1, n):       # every pair's block in flight at once; the links progress as they can
        dst = (me + step) % n
        src = (me - step) % n
        duplex.send(group.ranks[dst], byte_view(send[send_bounds[dst]:send_bounds[dst + 1]]))
        duplex.recv(group.ranks[src], byte_view(recv[recv_bounds[src]:recv_bounds[src + 1]]))
    duplex.run()


def exchange_allreduce(group: Group, buf: np.ndarray, ufunc, scratch: np.ndarray) -> None:
    """Small-buffer allreduce: every rank sends its whole ``buf`` to every peer and folds all of them locally.

    The fold runs in rank order on every rank, so every rank gets the same bits. ``scratch`` holds at least
    ``(n - 1) * buf.size`` elements.
    """
    n, me = group.size, group.index
    if n == 1 or buf.size == 0:
        return
    duplex = group.transport.duplex()
    contributions = []
    slot = 0
    for j in range(n):
        if j == me:
            contributions.append(buf)
            continue
        duplex.send(group.ranks[j], byte_view(buf))
        incoming = scratch[slot * buf.size:(slot + 1) * buf.size]
        duplex.recv(group.ranks[j], byte_view(incoming))
        contributions.append(incoming)
        slot += 1
    duplex.run()          # ``buf`` may be overwritten only once every peer has been sent our contribution
    acc = contributions[0]
    for c in contributions[1:]:
        ufunc(acc, c, out=acc)
    if acc is not buf:
        buf[...] = acc
