"""Negotiation: how the ranks agree, cycle by cycle, on which named requests every member of a set executes: one
object per protocol (``peer``, ``star``, ``tree``) behind ``base.Negotiation``, and the frames they send (``frames``).

Three protocols, one object each, behind :class:`~horovod.core.negotiation.base.Negotiation`: *peer* (every rank
sends its requests to every other rank and every member decides alike; small allreduces carry their data along),
*star* (rank 0 coordinates, every rank talks to it) and *tree* (rank 0 coordinates, messages travel up and down a
3-ary tree: no rank handles more than a few frames per cycle, whatever the world size). :func:`for_loop` picks one, identically on every rank, before any process set exists.
Invariants: the decisions themselves are :class:`horovod.core.coordinator.Coordinator`'s, a pure function of the
messages; a protocol owns its state and reads the engine only through :class:`~horovod.core.negotiation.base.Loop`;
nothing from the network is used before it is validated.
"""

from __future__ import annotations

from typing import Dict

from horovod.common.exceptions import HorovodConfigError
from horovod.core.negotiation.base import Batch, Loop, Negotiation
from horovod.core.negotiation.peer import PeerNegotiation
from horovod.core.negotiation.star import StarFollower, StarRoot
from horovod.core.negotiation.tree import TreeNegotiation

__all__ = ["PEER_NEGOTIATION_MAX_RANKS", "STAR_NEGOTIATION_MAX_RANKS", "peer_negotiation", "tree_negotiation",
           "oversubscribed", "for_loop", "Batch", "Loop", "Negotiation", "PeerNegotiation", "StarRoot",
           "StarFollower", "TreeNegotiation"]

# The largest job that negotiates peer to peer when HOROVOD_NEGOTIATION is auto. Every rank sends a frame to every
# other rank per cycle, n(n-1) frames instead of the star's 2(n-1): for a few ranks one hop less matters more.
PEER_NEGOTIATION_MAX_RANKS = 4
# The largest job that negotiates through a star when HOROVOD_NEGOTIATION is auto; larger ones use the tree, where
# rank 0 handles a few frames per cycle instead of 2-3 per rank and holds no connection to most ranks.
STAR_NEGOTIATION_MAX_RANKS = 16


def peer_negotiation(config, size: int, oversubscribed: bool = False) -> bool:
    """Whether a job of ``size`` ranks negotiates peer to peer (HOROVOD_NEGOTIATION; the same on every rank).

    ``auto`` also keeps the star where some host runs more ranks than it has cores: every frame is a wake-up, and
    there the peers' n(n-1) frames per cycle cost more than the hop they save (3-4 ranks on 2 cores: 1 MiB 5-10 %
    slower, the 200-tensor step 5 % slower).

    Raises:
        HorovodConfigError: peer negotiation asked for together with autotune.
    """
    mode = config.negotiation
    if mode == "peer" and config.autotune:
        # Autotune changes the fusion threshold on rank 0 alone, and under peer negotiation every rank plans.
        raise HorovodConfigError("HOROVOD_NEGOTIATION=peer cannot run with HOROVOD_AUTOTUNE (autotune tunes on "
                                 "rank 0 alone); use auto or star")
    return size > 1 and (mode == "peer" or (
        mode == "auto" and size <= PEER_NEGOTIATION_MAX_RANKS and not config.autotune and not oversubscribed))


def tree_negotiation(config, size: int) -> bool:
    """Whether a job of ``size`` ranks negotiates up and down a tree (HOROVOD_NEGOTIATION; the same on every rank;
    only when it does not negotiate peer to peer)."""
    return config.negotiation == "tree" or (config.negotiation == "auto" and size > STAR_NEGOTIATION_MAX_RANKS)


def oversubscribed(transport) -> bool:
    """Whether some host runs more of the job's ranks than it has cores (from every rank's rendezvous record, so
    every rank answers alike); False without a transport or without the records."""
    if transport is None or len(transport.cores) != len(transport.hostnames):
        return False
    ranks: Dict[str, int] = {}
    least: Dict[str, int] = {}
    for host, count in zip(transport.hostnames, transport.cores):
        ranks[host] = ranks.get(host, 0) + 1
        least[host] = min(least.get(host, count), count)
    return any(ranks[host] > least[host] for host in ranks)


def for_loop(loop: Loop, config) -> Negotiation:
    """The protocol this rank runs in ``loop`` (decided alike on every rank: same size, settings and records).

    Raises:
        HorovodConfigError: the settings contradict each other (see :func:`peer_negotiation`).
    """
    if peer_negotiation(config, loop.size, oversubscribed(loop.transport)):
        return PeerNegotiation(loop)
    if tree_negotiation(config, loop.size):
        return TreeNegotiation(loop)
    return StarRoot(loop) if loop.rank == 0 else StarFollower(loop)
