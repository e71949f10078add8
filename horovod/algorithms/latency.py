"""Latency-bound collectives: recursive doubling and the cost model that picks it over the one-hop exchange, and
the one-hop broadcast.

Below ``ring.EXCHANGE_MAX_BYTES`` a ring's 2(n-1) dependent steps cost more than the bytes. Two algorithms compete
there: the exchange (every rank sends its whole buffer to every peer: one hop, but ``n - 1`` messages per rank, each a
few microseconds of Python and ``nbytes`` on the wire), and recursive doubling (``log2 n`` hops, one message of
``nbytes`` each; with ``n`` not a power of two the ranks past the largest power of two fold into a partner first and
get the result back last, two hops more). :func:`prefer_recursive_doubling` compares the two with a simple
latency/bandwidth model, the same on every rank since it reads only ``n`` and ``nbytes``.

A small broadcast goes straight from the root to every rank (:func:`direct_broadcast`): one hop instead of the
chain's ``n - 1``, for ``n - 1`` messages from the root, which below ``ring.EXCHANGE_MAX_BYTES`` cost less than the
hops. Where the same model prefers recursive doubling (many ranks), it travels a binomial tree instead
(:func:`binomial_broadcast`): ``ceil(log2 n)`` hops, and the root talks to ``log2 n`` ranks, not to all of them, so
a large job opens no connection per rank for it.

Recursive doubling gives every rank the same bits: at each step a pair adds the same two partial results (``a + b``
and ``b + a`` are equal in IEEE arithmetic, and so are min, max and products).
"""

from __future__ import annotations

import numpy as np

from horovod.algorithms.group import Group, byte_view, sendrecv

__all__ = ["HOP_SECONDS", "MESSAGE_SECONDS", "BYTE_SECONDS", "prefer_recursive_doubling",
           "recursive_doubling_allreduce", "direct_broadcast", "binomial_broadcast"]

# The model's constants, measured on the project's machines (namespace hosts over veth, see docs/performance.md):
HOP_SECONDS = 60e-6        # one dependent network hop, wake-up included
MESSAGE_SECONDS = 15e-6    # the Python and system-call cost of one more message per rank
BYTE_SECONDS = 1e-9        # per byte sent by a rank (about 1 GB/s)


def _hops(n: int) -> int:
    p2 = 1 << (n.bit_length() - 1)
    return (p2.bit_length() - 1) + (2 if p2 != n else 0)


def prefer_recursive_doubling(n: int, nbytes: int) -> bool:
    """Whether recursive doubling beats the exchange for ``nbytes`` over ``n`` ranks (model above)."""
    if n <= 2:
        return False     # the same single exchange either way
    exchange = HOP_SECONDS + (n - 1) * (MESSAGE_SECONDS + nbytes * BYTE_SECONDS)
    doubling = _hops(n) * (HOP_SECONDS + MESSAGE_SECONDS + nbytes * BYTE_SECONDS)
    return doubling < exchange


def _swap_reduce(group: Group, partner: int, buf: np.ndarray, incoming: np.ndarray, ufunc) -> None:
    sendrecv(group, partner, send=buf, recv=incoming)   # ``buf`` changes only once the partner has it
    ufunc(buf, incoming, out=buf)


def recursive_doubling_allreduce(group: Group, buf: np.ndarray, ufunc, scratch: np.ndarray) -> None:
    """Reduce the flat ``buf`` in place over ``group`` by recursive doubling; ``scratch`` holds ``buf.size``."""
    n, me = group.size, group.index
    if n == 1 or buf.size == 0:
        return
    p2 = 1 << (n.bit_length() - 1)
    incoming = scratch[:buf.size]
    if me >= p2:
        # Fold into a partner, then take its result into ``buf``: the result comes only after the partner received
        # all of ``buf``, so no byte lands before the send has read it.
        sendrecv(group, me - p2, send=buf, recv=buf)
        return
    if me + p2 < n:
        sendrecv(group, me + p2, recv=incoming)
        ufunc(buf, incoming, out=buf)
    distance = 1
    while distance < p2:
        _swap_reduce(group, me ^ distance, buf, incoming, ufunc)
        distance <<= 1
    if me + p2 < n:
        sendrecv(group, me + p2, send=buf)


def direct_broadcast(group: Group, raw: np.ndarray, root_index: int) -> None:
    """Copy the flat uint8 ``raw`` of the rank at ``root_index`` to every rank, the root sending to all at once."""
    if group.size == 1 or raw.size == 0:
        return
    duplex = group.transport.duplex()
    if group.index == root_index:
        for position, rank in enumerate(group.ranks):
            if position != root_index:
                duplex.send(rank, byte_view(raw))
    else:
        duplex.recv(group.ranks[root_index], byte_view(raw))
    duplex.run()


def binomial_broadcast(group: Group, raw: np.ndarray, root_index: int) -> None:
    """Copy the flat uint8 ``raw`` of the rank at ``root_index`` to every rank along a binomial tree: in the step at
    distance ``d``, every rank ``d`` or fewer places after the root (which has the bytes by then) sends them ``d``
    places further."""
    n = group.size
    if n == 1 or raw.size == 0:
        return
    me = (group.index - root_index) % n      # places after the root
    distance = 1
    while distance < n:
        if me < distance and me + distance < n:
            sendrecv(group, (me + distance + root_index) % n, send=raw)
        elif distance <= me < 2 * distance:
            sendrecv(group, (me - distance + root_index) % n, recv=raw)
        distance <<= 1
