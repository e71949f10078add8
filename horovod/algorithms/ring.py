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

from horovod.algorithms.group import Group, segment_bounds

__all__ = ["CHUNK_BYTES", "EXCHANGE_MAX_BYTES", "ring_reduce_scatter", "ring_allgather_segments", "ring_allreduce",
           "ring_allgatherv", "chain_broadcast", "pairwise_alltoall", "exchange_allreduce"]

CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 128 << 10
# When everything a rank sends in one collective fits well inside the socket buffers (4 MiB asked, and the peer's
# as many), a blocking send never waits for the peer, so the calling thread sends itself: no hand-off to the sender
# thread, whose wake-up costs a scheduler round trip per piece on a busy machine.
INLINE_TOTAL_BYTES = 2 << 20


class _Forward:
    """The sends of one collective to one peer: inline when they all fit the socket buffers, else queued."""

    __slots__ = ("transport", "peer", "inline", "pending")

    def __init__(self, transport, peer: int, total_bytes: int):
        self.transport, self.peer = transport, peer
        self.inline = total_bytes <= INLINE_TOTAL_BYTES
        self.pending = []

    def send(self, array: np.ndarray) -> None:
        if self.inline:
            self.transport.send(self.peer, _view(array))
        else:
            self.pending.append(self.transport.isend(self.peer, _view(array)))

    def finish(self) -> None:
        for future in self.pending:
            future.wait()
# Up to this size an allreduce is latency-bound: one all-to-all exchange of whole buffers (one network hop) beats the
# ring's 2(n-1) dependent steps, and at two ranks it even moves the same bytes.
EXCHANGE_MAX_BYTES = 64 << 10


def _recv_reduce(group: Group, src: int, target: np.ndarray, scratch: np.ndarray, ufunc) -> None:
    """Receive ``target.size`` elements from ``src`` chunk by chunk, combining each into ``target``."""
    itemsize = target.itemsize
    step = max(1, CHUNK_BYTES // itemsize)
    incoming = scratch[:target.size]
    raw = memoryview(incoming.view(np.uint8))
    for start in range(0, target.size, step):
        stop = min(target.size, start + step)
        group.transport.recv_into(src, raw[start * itemsize:stop * itemsize])
        ufunc(target[start:stop], incoming[start:stop], out=target[start:stop])


def _view(array: np.ndarray) -> memoryview:
    return memoryview(array.view(np.uint8)) if array.size else memoryview(b"")


def ring_reduce_scatter(group: Group, buf: np.ndarray, bounds: Sequence[int], ufunc, scratch: np.ndarray) -> None:
    """After this, ``buf[bounds[i]:bounds[i+1]]`` on the rank at position ``i`` holds the reduction over all ranks.

    ``scratch`` must hold at least the largest segment.
    """
    n, me = group.size, group.index
    right, left = group.peer(1), group.peer(-1)
    for step in range(n - 1):
        send_seg = (me - step - 1) % n
        recv_seg = (me - step - 2) % n
        out = buf[bounds[send_seg]:bounds[send_seg + 1]]
        inc = buf[bounds[recv_seg]:bounds[recv_seg + 1]]
        pending = group.transport.isend(right, _view(out)) if out.size else None
        if inc.size:
            _recv_reduce(group, left, inc, scratch, ufunc)
        if pending is not None:
            pending.wait()


def ring_allgather_segments(group: Group, buf: np.ndarray, bounds: Sequence[int]) -> None:
    """Each rank owns ``buf[bounds[i]:bounds[i+1]]``; afterwards every rank holds every segment.

    Pipelined like :func:`ring_allreduce`: a piece is passed on to the right as soon as it arrived from the left.
    """
    n, me = group.size, group.index
    if n == 1:
        return
    left, step = group.peer(-1), _chunk_elems(buf, n)
    forward = _Forward(group.transport, group.peer(1), (buf.nbytes * (n - 1)) // n)
    for lo, hi in _chunks(bounds[me], bounds[me + 1], step):
        if hi > lo:
            forward.send(buf[lo:hi])
    for t in range(n - 1):
        seg = (me - t - 1) % n
        for lo, hi in _chunks(bounds[seg], bounds[seg + 1], step):
            if lo == hi:
                continue
            group.transport.recv_into(left, _view(buf[lo:hi]))
            if t < n - 2:
                forward.send(buf[lo:hi])
    forward.finish()


def _chunks(lo: int, hi: int, step: int):
    """Split ``[lo, hi)`` into nearly equal pieces of at most ``step`` elements (no small tail: every piece of a
    large segment is at least half a chunk, so it goes through the sender thread)."""
    count = max(1, -(-(hi - lo) // step))
    base, extra = divmod(hi - lo, count)
    start = lo
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        yield start, stop
        start = stop


def _chunk_elems(buf: np.ndarray, n: int) -> int:
    # Pieces small enough that a step pipelines (at least four per segment), large enough that Python's per-piece
    # cost (a queued send, a recv_into, a ufunc call: ~20 us) stays below a few percent of the piece's transfer.
    seg_bytes = buf.nbytes // n
    piece = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, seg_bytes // 4))
    return max(1, piece // buf.itemsize)


def ring_allreduce(group: Group, buf: np.ndarray, ufunc, scratch: np.ndarray) -> None:
    """Reduce the flat contiguous ``buf`` in place across the group: a pipelined ring.

    The 2(n-1) steps (reduce-scatter, then allgather) run as one stream of pieces: a piece is sent on to the right
    neighbour (by the sender thread) as soon as it has been received and reduced, so a step costs about one link
    transfer and the reduction hides behind the transfer of the next piece; there is no barrier between steps.
    A piece is overwritten by the allgather only after every rank, this one included, reduced it, so a queued send
    never reads bytes that changed. ``scratch`` is a buffer of ``buf``'s dtype with at least
    ``ceil(buf.size / n)`` elements.
    """
    n, me = group.size, group.index
    if n == 1 or buf.size == 0:
        return
    bounds = segment_bounds(buf.size, n)
    left, transport, step = group.peer(-1), group.transport, _chunk_elems(buf, n)
    forward = _Forward(transport, group.peer(1), 2 * (n - 1) * buf.nbytes // n)
    first = (me - 1) % n
    for lo, hi in _chunks(bounds[first], bounds[first + 1], step):
        forward.send(buf[lo:hi])
    last = 2 * (n - 1) - 1
    for k in range(last + 1):
        seg = (me - k - 2) % n if k < n - 1 else (me - k + n - 2) % n
        for lo, hi in _chunks(bounds[seg], bounds[seg + 1], step):
            if lo == hi:
                continue
            target = buf[lo:hi]
            if k < n - 1:
                incoming = scratch[:hi - lo]
                transport.recv_into(left, _view(incoming))
                ufunc(target, incoming, out=target)
            else:
                transport.recv_into(left, _view(target))
            if k < last:
                forward.send(target)
    forward.finish()


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
    raw = _view(buf)
    prev, nxt = group.peer(-1), group.peer(1)
    pending = []
    for start in range(0, len(raw), CHUNK_BYTES):
        chunk = raw[start:start + CHUNK_BYTES]
        if pos > 0:
            group.transport.recv_into(prev, chunk)
        if pos < n - 1:
            pending.append(group.transport.isend(nxt, chunk))
    for future in pending:
        future.wait()


def pairwise_alltoall(group: Group, send: np.ndarray, send_bounds: Sequence[int], recv: np.ndarray,
                      recv_bounds: Sequence[int]) -> None:
    """Rank i's block ``send[send_bounds[j]:send_bounds[j+1]]`` lands in rank j's ``recv`` block i (uint8 buffers)."""
    n, me = group.size, group.index
    recv[recv_bounds[me]:recv_bounds[me + 1]] = send[send_bounds[me]:send_bounds[me + 1]]
    for step in range(1, n):
        dst = (me + step) % n
        src = (me - step) % n
        out = send[send_bounds[dst]:send_bounds[dst + 1]]
        inc = recv[recv_bounds[src]:recv_bounds[src + 1]]
        pending = group.transport.isend(group.ranks[dst], _view(out)) if out.size else None
        if inc.size:
            group.transport.recv_into(group.ranks[src], _view(inc))
        if pending is not None:
            pending.wait()


def exchange_allreduce(group: Group, buf: np.ndarray, ufunc, scratch: np.ndarray) -> None:
    """Small-buffer allreduce: every rank sends its whole ``buf`` to every peer and folds all of them locally.

    The fold runs in rank order on every rank, so every rank gets the same bits. ``scratch`` holds at least
    ``(n - 1) * buf.size`` elements.
    """
    n, me = group.size, group.index
    if n == 1 or buf.size == 0:
        return
    pending = [group.transport.isend(group.ranks[j], _view(buf)) for j in range(n) if j != me]
    contributions = []
    slot = 0
    for j in range(n):
        if j == me:
            contributions.append(buf)
            continue
        incoming = scratch[slot * buf.size:(slot + 1) * buf.size]
        group.transport.recv_into(group.ranks[j], _view(incoming))
        contributions.append(incoming)
        slot += 1
    for p in pending:
        p.wait()          # ``buf`` may be overwritten only once every peer has been sent our contribution
    acc = contributions[0]
    for c in contributions[1:]:
        ufunc(acc, c, out=acc)
    if acc is not buf:
        buf[...] = acc
