"""The shape of the tree negotiation (:mod:`horovod.core.negotiation.tree`): who reports to whom, how many ranks a
subtree holds, and how a subtree's equal messages are listed together. Also the shape of the start-up's hand-down
of every rank's address (:mod:`horovod.core.bootstrap`), which follows the same tree."""

from __future__ import annotations

from typing import List

from horovod.core.negotiation.frames import Group

__all__ = ["ARITY", "Groups", "parent", "children", "subtree_size", "merge"]

Groups = List[Group]


# Children per rank. Frames per cycle are the same for any arity (two per rank), but on a crowded host every hop waits
# for a core, so a shallower tree is faster: against two, three made 4 B allreduces at 32 and 64 ranks on 2 cores
# 5-15 % faster (A/B, three runs each); four was no faster, and an interior rank handles 2 × ARITY + 2 frames per
# cached cycle (ten for four, with requests for cycles now and then 12: the bound 2 log2 n + 2 at 32 ranks).
ARITY = 3


def parent(rank: int) -> int:
    """The rank a non-root rank reports to."""
    return (rank - 1) // ARITY


def children(rank: int, size: int) -> List[int]:
    """The ranks that report to ``rank``."""
    return list(range(ARITY * rank + 1, min(ARITY * rank + ARITY + 1, size)))


def subtree_size(rank: int, size: int) -> int:
    """How many ranks the subtree under ``rank`` holds, ``rank`` included (a level of the heap at a time)."""
    count, low, high = 0, rank, rank
    while low < size:
        count += min(high, size - 1) - low + 1
        low, high = ARITY * low + 1, ARITY * high + ARITY
    return count


def merge(groups: Groups, more: Groups) -> None:
    """Add a child's groups to ``groups``, listing ranks that sent equal messages together."""
    for ranks, message in more:
        for existing in groups:
            if existing[1] == message:
                existing[0].extend(ranks)
                break
        else:
            groups.append((list(ranks), message))


