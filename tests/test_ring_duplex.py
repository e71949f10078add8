"""The ring collectives over :class:`horovod.transport.duplex.PollDuplex` on real sockets (one thread per rank,
socket pairs between them), against numpy: both directions of every link move at once in one thread, a piece is
reduced and passed on as it lands, the folded postscale gives the bits of scaling afterwards, and a silent or
vanished peer is an error naming it, within the timeout."""

import socket
import threading

import numpy as np
import pytest

from horovod.algorithms import latency, ring
from horovod.algorithms.group import Group, segment_bounds
from horovod.common.exceptions import HorovodInternalError
from horovod.transport.duplex import PollDuplex


class _PairTransport:
    """Rank ``rank``'s end of socket pairs to every other rank: the part of the TCP transport a duplex uses."""

    def __init__(self, rank, size, socks, timeout):
        self.rank, self.size, self.timeout, self._socks = rank, size, timeout, socks

    def connection(self, peer):
        return self._socks[peer]

    def quiesce(self, peer):
        return None

    def waiting(self, peer, silent_for):
        raise HorovodInternalError(f"rank {self.rank}: rank {peer} sent nothing for {self.timeout} s")

    def resumed(self):
        return None

    def fail(self, peer, exc):
        return HorovodInternalError(f"rank {self.rank}: rank {peer} was lost ({exc})")

    def duplex(self):
        return PollDuplex(self)


def _run(n, fn, timeout=20.0, blocking=False):
    """``fn(group)`` on ``n`` threads joined by socket pairs; returns results by rank, or raises the first error."""
    socks = [dict() for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            sa, sb = socket.socketpair()
            for s in (sa, sb):
                s.settimeout(None if blocking else timeout)
            socks[a][b], socks[b][a] = sa, sb
    results, errors = [None] * n, []

    def body(r):
        try:
            results[r] = fn(Group(tuple(range(n)), r, _PairTransport(r, n, socks[r], timeout)))
        except BaseException as exc:  # handed to the test below
            errors.append(exc)
    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a rank hung"
        if errors:
            raise errors[0]
        return results
    finally:
        for d in socks:
            for s in d.values():
                s.close()


def _inputs(n, count, dtype=np.float32):
    rng = np.random.default_rng(count)
    return [rng.uniform(-4, 4, count).astype(dtype) for _ in range(n)]


@pytest.mark.unit
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("count", [1, 1001, 3 << 20])
def test_ring_allreduce_with_folded_postscale_matches_scaling_afterwards(n, count):
    bufs = _inputs(n, count)
    scaled = _run(n, lambda g: _ring(g, bufs[g.index].copy(), 1.0 / n))
    plain = _run(n, lambda g: _ring(g, bufs[g.index].copy(), 1.0))
    want = np.sum(np.stack(bufs).astype(np.float64), axis=0) / n
    for r in range(n):
        np.testing.assert_array_equal(scaled[r], scaled[0])                   # every rank: the same bits
        np.testing.assert_array_equal(scaled[r], plain[r] * np.float32(1.0 / n))
        np.testing.assert_allclose(scaled[r], want, rtol=1e-5, atol=1e-5)


def _ring(group, buf, post):
    ring.ring_allreduce(group, buf, np.add, np.empty(buf.size, buf.dtype), post)
    return buf


@pytest.mark.unit
def test_a_blocking_socket_is_driven_without_blocking_and_restored():
    # 8 MiB each way at once: more than both socket buffers, so sends that blocked would deadlock the pair.
    bufs = _inputs(2, 2 << 20)
    got = _run(2, lambda g: _ring(g, bufs[g.index].copy(), 1.0), blocking=True)
    np.testing.assert_allclose(got[0], bufs[0] + bufs[1], rtol=1e-6)


@pytest.mark.unit
@pytest.mark.parametrize("n", [3, 4])
def test_reduce_scatter_allgather_broadcasts_alltoall_and_doubling_match_numpy(n):
    count = 700_001
    bufs = _inputs(n, count, np.float64)
    bounds = segment_bounds(count, n)
    total = np.sum(np.stack(bufs), axis=0)

    def body(g):
        me = g.index
        rs = bufs[me].copy()
        ring.ring_reduce_scatter(g, rs, bounds, np.add, np.empty(count, np.float64))
        ag = np.zeros(count)
        ag[bounds[me]:bounds[me + 1]] = bufs[me][bounds[me]:bounds[me + 1]]
        ring.ring_allgather_segments(g, ag, bounds)
        bc = bufs[me].copy()
        ring.chain_broadcast(g, bc, 1)
        send = np.arange(n * 5, dtype=np.uint8) + me
        recv = np.empty(n * 5, np.uint8)
        ring.pairwise_alltoall(g, send, [5 * i for i in range(n + 1)], recv, [5 * i for i in range(n + 1)])
        rd = bufs[me][:1000].copy()
        latency.recursive_doubling_allreduce(g, rd, np.add, np.empty(1000))
        small = bufs[me][:999].copy()
        latency.direct_broadcast(g, small.view(np.uint8), n - 1)
        return rs[bounds[me]:bounds[me + 1]], ag, bc, recv, rd, small
    for me, (rs, ag, bc, recv, rd, small) in enumerate(_run(n, body)):
        np.testing.assert_array_equal(small, bufs[n - 1][:999])
        np.testing.assert_allclose(rs, total[bounds[me]:bounds[me + 1]], rtol=1e-12)
        np.testing.assert_array_equal(ag, np.concatenate([bufs[r][bounds[r]:bounds[r + 1]] for r in range(n)]))
        np.testing.assert_array_equal(bc, bufs[1])
        np.testing.assert_array_equal(recv, np.concatenate([np.arange(5 * me, 5 * me + 5) + r for r in range(n)]))
        np.testing.assert_allclose(rd, total[:1000], rtol=1e-12)


@pytest.mark.unit
def test_a_silent_peer_is_named_within_the_timeout():
    def body(g):
        if g.index == 1:
            return None                 # never sends its half
        duplex = g.transport.duplex()
        duplex.recv(1, memoryview(bytearray(16)))
        duplex.run()
    with pytest.raises(HorovodInternalError, match="rank 1 sent nothing for 0.3 s"):
        _run(2, body, timeout=0.3)


@pytest.mark.unit
def test_a_vanished_peer_is_named_at_once():
    closed = threading.Event()

    def body(g):
        if g.index == 1:
            g.transport._socks[0].close()
            closed.set()
            return None
        closed.wait(10)
        duplex = g.transport.duplex()
        duplex.recv(1, memoryview(bytearray(16)))
        duplex.run()
    with pytest.raises(HorovodInternalError, match="rank 1 was lost"):
        _run(2, body, timeout=30.0)
