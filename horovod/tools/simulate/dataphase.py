"""What a collective's data phase costs in virtual time: the algorithm the engine would choose for its size and group
(:func:`horovod.algorithms.allreduce.choose`, asked with the job's own settings), timed on the world's link model
(each message a link's latency, its bytes at the link's bandwidth, both ends' handling of a message) and memory model
(``CpuModel.copy``: a byte folded or copied in memory).

The models, per algorithm, for ``B`` bytes over ``n`` ranks on ``h`` hosts:

- exchange: one hop, ``n - 1`` messages of ``B`` each way per rank, then ``n - 1`` folds of ``B``;
- recursive doubling: ``log2 n`` dependent hops of ``B`` (two more when ``n`` is not a power of two), a fold each;
  a hop within a host or across hosts by which ranks pair at that distance;
- ring (pipelined): ``2(n-1)`` dependent steps, each a link's latency (``h`` of every ``n`` links cross hosts) and both
  ends' handling, and ``2(n-1)/n B`` through the slowest link; the reduction of ``(n-1)/n B`` hides behind the
  transfer, so the larger of the two counts;
- hierarchical: a ring within each host, then one across the hosts' leaders, then the result shared back.

Allgather and reducescatter run a ring's half (``n - 1`` steps); broadcast one hop, a binomial tree or the chain, as
:func:`horovod.algorithms.collectives.broadcast` picks; alltoall ``n - 1`` pairwise steps. Where the data phase's CPU
goes is left out of the host's cores (it is in the time): the simulated hosts give every rank a core.
"""

from __future__ import annotations

import math
from typing import Sequence

from horovod.algorithms import allreduce as algorithms, latency, ring
from horovod.algorithms.group import Group
from horovod.common.types import OpType

__all__ = ["algorithm", "seconds"]


def algorithm(world, members: Sequence[int], nbytes: int, hierarchical: bool) -> str:
    """The allreduce algorithm the engine picks for ``nbytes`` over ``members`` (shared memory is off in the
    simulation, as its job's settings say)."""
    spans = len({world.host_of(r) for r in members}) > 1
    hierarchy = object() if hierarchical and spans else None
    return algorithms.choose(Group(tuple(members), 0, None, None, hierarchy), nbytes)


def _link(world, a: int, b: int):
    """(latency, bandwidth) between ranks ``a`` and ``b``: within a host or across hosts."""
    link = world.link
    if world.host_of(a) == world.host_of(b):
        return link.local_latency, link.local_bandwidth
    return link.remote_latency, link.remote_bandwidth


def _hop(world, a: int, b: int, nbytes: float) -> float:
    """One message of ``nbytes`` from rank ``a`` to rank ``b``: the link and both ends' handling."""
    lat, bandwidth = _link(world, a, b)
    return lat + 2 * world.cpu.frame + nbytes / bandwidth


def _ring(world, members: Sequence[int], nbytes: float, steps: int, folds: bool) -> float:
    """``steps`` dependent ring steps of ``nbytes / n`` each around ``members`` (pipelined: latencies add, the
    bytes go at the slowest link's rate, a fold hides behind the transfer)."""
    n = len(members)
    if n < 2 or steps <= 0:
        return 0.0
    piece = nbytes / n
    link, frames = world.link, 2 * world.cpu.frame
    hosts = len({world.host_of(r) for r in members})
    crossing = hosts if hosts > 1 else 0        # consecutive ranks share a host: one link out of each crosses
    mean_hop = ((n - crossing) * link.local_latency + crossing * link.remote_latency) / n + frames
    slowest = link.remote_bandwidth if crossing else link.local_bandwidth
    transfer = steps * piece / slowest
    fold = (n - 1) * piece * world.cpu.copy if folds else 0.0
    return steps * mean_hop + max(transfer, fold)


def _doubling(world, members: Sequence[int], nbytes: float) -> float:
    n = len(members)
    p2 = 1 << (n.bit_length() - 1)
    total = sum(_hop(world, members[0], members[1 << k], nbytes) for k in range(p2.bit_length() - 1))
    if p2 != n:         # the ranks past the largest power of two fold into a partner, and get the result back
        total += 2 * _hop(world, members[0], members[p2], nbytes)
    return total + latency._hops(n) * nbytes * world.cpu.copy


def _exchange(world, members: Sequence[int], nbytes: float) -> float:
    n = len(members)
    slowest = max(_hop(world, members[0], r, 0.0) for r in (members[1], members[-1]))
    bandwidth = _link(world, members[0], members[-1])[1]
    return slowest + (n - 1) * (2 * world.cpu.frame + nbytes / bandwidth + nbytes * world.cpu.copy)


def _hierarchical(world, members: Sequence[int], nbytes: float) -> float:
    first = world.host_of(members[0])
    local = [r for r in members if world.host_of(r) == first]
    leaders, seen = [], set()
    for r in members:
        if world.host_of(r) not in seen:
            seen.add(world.host_of(r))
            leaders.append(r)
    within = _ring(world, local, nbytes, 2 * (len(local) - 1), True)
    across = _ring(world, leaders, nbytes, 2 * (len(leaders) - 1), True)
    return within + across + _chain(world, local, nbytes)      # the leader's result down its host's chain


def _chain(world, members: Sequence[int], nbytes: float) -> float:
    """A chain broadcast of ``nbytes`` (``ring.chain_broadcast``): ``n - 1`` hops, then the bytes pipelined behind
    them in chunks, the last chunk ``n - 2`` chunk times behind the first."""
    n = len(members)
    if n < 2:
        return 0.0
    fill = min(nbytes, ring.CHUNK_BYTES) * (n - 2)
    return _ring(world, members, (nbytes + fill) * n / (n - 1), n - 1, False)


def allreduce_seconds(world, members: Sequence[int], nbytes: int, hierarchical: bool = False) -> float:
    """An allreduce of ``nbytes`` over ``members`` by the algorithm the engine picks."""
    n = len(members)
    if n < 2 or nbytes == 0:
        return 0.0
    chosen = algorithm(world, members, nbytes, hierarchical)
    if chosen == algorithms.HIERARCHICAL:
        return _hierarchical(world, members, nbytes)
    if chosen == algorithms.RECURSIVE_DOUBLING:
        return _doubling(world, members, nbytes)
    if chosen == algorithms.EXCHANGE:
        return _exchange(world, members, nbytes)
    if chosen == algorithms.SHM:        # two barriers and each byte in and out of the segment
        return 2 * world.link.local_latency + 2 * nbytes * world.cpu.copy
    return _ring(world, members, nbytes, 2 * (n - 1), True)


def seconds(world, op: int, members: Sequence[int], nbytes: int, hierarchical: bool = False) -> float:
    """The data phase of collective ``op`` moving ``nbytes`` (a rank's input; an allgather's whole result) over
    ``members``."""
    n = len(members)
    if n < 2:
        return 0.0
    if op == OpType.ALLREDUCE:
        return allreduce_seconds(world, members, nbytes, hierarchical)
    if op == OpType.REDUCESCATTER:
        return _ring(world, members, nbytes, n - 1, True)
    if op == OpType.ALLGATHER:
        return _ring(world, members, nbytes, n - 1, False)
    if op == OpType.ALLTOALL:
        return _ring(world, members, nbytes, n - 1, False)
    if op == OpType.BROADCAST:
        if nbytes > ring.EXCHANGE_MAX_BYTES:        # the chain: n - 1 hops, the bytes pipelined behind them
            return _chain(world, members, nbytes)
        if latency.prefer_recursive_doubling(n, nbytes):
            return math.ceil(math.log2(n)) * _hop(world, members[0], members[-1], nbytes)
        return _hop(world, members[0], members[-1], nbytes) + (n - 2) * world.cpu.frame
    return 0.0
