"""Gossip averaging, once for every binding: the schedule of peers and the pairwise exchanges.

The schedule is a list of rounds; a round is a matching (disjoint pairs of ranks), so in each round a rank averages
with at most one peer and the pair's two ranks end with the same bits. Step ``t`` uses round ``t % len(rounds)``.
It is a pure function of the job's size and the topology, so every rank derives the same one:

* ``"ring"``: the edges ``(i, i+1 mod n)`` split greedily, in order, into matchings (two rounds for an even ``n``,
  ``n`` rounds of ``(n-1)/2`` pairs for an odd one).
* ``"exponential"``: round ``k`` pairs ``i`` with ``i XOR 2^k`` (a hypercube; for a power of two ``n`` the
  ``log2 n`` rounds average every rank's values exactly); a rank whose partner would be ``>= n`` sits the round out.

Every pairwise average keeps the sum over ranks, and the rounds together connect all ranks, so repeated rounds take
every rank to the global average.

An exchange is an allreduce on the pair's own two-rank process set. The engine negotiates a set among its members
only (its first rank coordinates), so a pair completes as soon as both partners submitted, whatever the other ranks
are doing (their engine threads still take part in each cycle's global-set round, which needs no call from their
training loop). The pair sets are registered once, alike on every rank: statically
(``hvd.init(process_sets=gossip_process_sets(size, topology))``) or, in dynamic mode, on the first exchange.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.runtime import basics
from horovod.runtime.async_policy import TOPOLOGIES, Schedule, average_arrays
from horovod.runtime.process_sets import ProcessSet, add_process_set, global_process_set

__all__ = ["gossip_rounds", "gossip_pairs", "gossip_process_sets", "partner", "Gossip"]

Pair = Tuple[int, int]


def _ring_edges(size: int) -> List[Pair]:
    edges = []
    for i in range(size):
        edge = tuple(sorted((i, (i + 1) % size)))
        if edge[0] != edge[1] and edge not in edges:
            edges.append(edge)
    return edges


def _matchings(edges: Sequence[Pair]) -> List[List[Pair]]:
    rounds: List[List[Pair]] = []
    for a, b in edges:
        for chosen in rounds:
            if all(a not in pair and b not in pair for pair in chosen):
                chosen.append((a, b))
                break
        else:
            rounds.append([(a, b)])
    return rounds


def gossip_rounds(size: int, topology: str = "ring") -> List[List[Pair]]:
    """The schedule: rounds of disjoint pairs ``(low rank, high rank)``; empty for a single rank.

    Raises:
        ValueError: an unknown topology or a size below 1.
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown gossip topology {topology!r}: use one of {', '.join(TOPOLOGIES)}")
    if size < 1:
        raise ValueError(f"gossip needs at least one rank, not {size}")
    if topology == "ring":
        return _matchings(_ring_edges(size))
    rounds, k = [], 0
    while (1 << k) < size:
        rounds.append([(i, i ^ (1 << k)) for i in range(size) if i < i ^ (1 << k) < size])
        k += 1
    return rounds


def gossip_pairs(size: int, topology: str = "ring") -> List[Pair]:
    """Every pair the schedule uses, once, in schedule order (the process sets to register)."""
    return [pair for chosen in gossip_rounds(size, topology) for pair in chosen]


def gossip_process_sets(size: int, topology: str = "ring") -> List[ProcessSet]:
    """The pair process sets to hand to ``hvd.init(process_sets=...)`` (a pair spanning the whole job uses the
    global set and is left out)."""
    return [ProcessSet(list(pair)) for pair in gossip_pairs(size, topology) if len(set(pair)) < size]


def partner(rounds: Sequence[Sequence[Pair]], rank: int, step: int) -> Optional[Pair]:
    """The pair ``rank`` belongs to at ``step`` (None: it sits this round out)."""
    if not rounds:
        return None
    for pair in rounds[step % len(rounds)]:
        if rank in pair:
            return pair
    return None


def _pair_set(pair: Pair, size: int, registered: Dict[Tuple[int, ...], int]) -> ProcessSet:
    if size == 2:
        return global_process_set
    ranks = tuple(pair)
    if ranks in registered:
        ps = ProcessSet(list(ranks))
        ps.process_set_id = registered[ranks]
        return ps
    if not basics.context().dynamic_sets:
        raise ValueError(f"gossip needs the process set {list(ranks)}: start Horovod with "
                         f"hvd.init(process_sets='dynamic') (or HOROVOD_DYNAMIC_PROCESS_SETS=1), or register the "
                         f"pairs statically with hvd.init(process_sets=hvd.gossip_process_sets(size, topology))")
    return add_process_set(list(ranks))


class Gossip(Schedule):
    """Pairwise gossip averaging of parameters: :meth:`before_step`, the local step, :meth:`after_step`.

    Args:
        topology: ``"ring"`` or ``"exponential"``.
        every: local steps between exchanges (>= 1).
        name: the reductions' names.
    """

    kind = "gossip"

    def __init__(self, topology: str = "ring", every: int = 1, name: Optional[str] = None):
        super().__init__(global_process_set, name)
        gossip_rounds(2, topology)      # validates the topology
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, not {every!r}")
        self.topology, self.every = topology, every
        self.rounds: List[List[Pair]] = []
        self._sets: Dict[Pair, ProcessSet] = {}

    def _started(self, params: Sequence[np.ndarray]) -> None:
        # The schedule for the job's size; its pair sets registered in schedule order, alike on every rank.
        size = basics.size()
        self.rounds = gossip_rounds(size, topology=self.topology)
        registered = {tuple(r): i for i, r in basics.engine().set_ids().items() if i != 0}
        self._sets = {pair: _pair_set(pair, size, registered) for pair in gossip_pairs(size, self.topology)}

    def after_step(self, params: Sequence[np.ndarray]) -> bool:
        """Count a step; when an exchange is due, average ``params`` in place with this round's partner.
        True when it did (the pair then holds the same bits)."""
        self.step += 1
        self.averaged = False
        if self.step % self.every:
            return False
        pair = partner(self.rounds, basics.rank(), self.step // self.every - 1)
        if pair is None:
            return False
        averages = average_arrays(params, f"{self.name}.{pair[0]}.{pair[1]}", self._sets[pair])()
        for p, a in zip(params, averages):
            p[...] = a
        self.averaged = True
        return True

    def average_all(self, params: Sequence[np.ndarray]) -> None:
        """Average ``params`` over every rank, synchronously (before evaluating or checkpointing)."""
        self.before_step(params)
        for p, a in zip(params, average_arrays(params, f"{self.name}.all", global_process_set)()):
            p[...] = a
