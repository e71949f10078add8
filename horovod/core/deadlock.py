"""The deadlock detector of the stall inspector: a set whose every live rank waits for a collective no other rank
will complete.

Stalls only warn by default (as in Horovod): a rank may be late. A deadlock is different: every rank of the set that
has not joined has submitted at least one collective, and none of the waiting names has been submitted by every
live rank (else it would have run), so no name can become ready until some rank submits something new, and a rank
blocked in a collective never will. Typical causes: unnamed collectives whose generated names drifted apart (one rank
skipped an op, e.g. before a join), or the same names submitted in a different order under blocking calls.

When that state has not changed for :attr:`DeadlockWatch.after` seconds, the watch reports each live rank's waiting
names, and the coordinator fails every waiting tensor of the set on every rank with that report (each rank
raises in its blocked call; the job goes on). It is a pure function of the coordinator's state and clock, looked at
only every :attr:`DeadlockWatch.interval` seconds, so that every member of a set under peer negotiation (one clock)
decides alike, and the steady state pays one comparison per cycle.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = ["DEADLOCK_PREFIX", "DeadlockWatch", "describe"]

DEADLOCK_PREFIX = "Deadlock: "


class DeadlockWatch:
    """Tracks how long a set has been deadlocked.

    Args:
        after: seconds the deadlocked state must last unchanged before it is reported.
        interval: the clock is looked at no more often than this.
    """

    def __init__(self, after: float, interval: float = 1.0):
        self.after = after
        self.interval = min(interval, after / 4) if after > 0 else interval
        self._next_look = float("-inf")
        self._state: Optional[FrozenSet[Tuple[str, int]]] = None
        self._since = 0.0

    def due(self, now: float) -> bool:
        """Whether :meth:`check` should look at the state now (at most every :attr:`interval` seconds)."""
        return now >= self._next_look

    def check(self, now: float, waiting: Mapping[str, Iterable[int]], live: Sequence[int]
              ) -> Optional[Tuple[Dict[int, List[str]], float]]:
        """Each live index's waiting names and for how long, once every live index has waited, unchanged, for
        :attr:`after` seconds; None otherwise.

        Args:
            now: the coordinator's clock.
            waiting: name -> the set indices that submitted it, for every name not yet ready.
            live: the set indices that have not joined.
        """
        self._next_look = now + self.interval
        by_rank: Dict[int, List[str]] = {index: [] for index in live}
        state = []
        for name, indices in waiting.items():
            for index in indices:
                if index in by_rank:
                    by_rank[index].append(name)
                    state.append((name, index))
        if len(by_rank) < 2 or not all(by_rank.values()):
            self._state = None
            return None
        key = frozenset(state)
        if key != self._state:
            self._state, self._since = key, now
            return None
        if now - self._since < self.after:
            return None
        waited = now - self._since
        self._state = None      # reported once; a deadlock that forms again is timed afresh
        return by_rank, waited


def describe(by_rank: Mapping[int, Sequence[str]], ranks: Sequence[int], joined: Iterable[int],
             waited: float) -> str:
    """The error every waiting tensor fails with: each rank's waiting names (``ranks`` maps indices to global
    ranks), the joined ranks, and what to do."""
    listing = "; ".join(f"rank {ranks[i]} waits for {', '.join(sorted(names))}" for i, names in sorted(by_rank.items()))
    gone = sorted(ranks[i] for i in joined)
    return (f"{DEADLOCK_PREFIX}for {waited:.0f} s every rank of the process set that has not joined has been waiting for "
            f"collectives that no other rank submitted ({listing}" + (f"; ranks {gone} have joined" if gone else "")
            + "). Every rank must submit the same names; unnamed collectives are numbered in submission order on "
            "each rank, so a rank that skipped one (e.g. before a join) shifts its names: name them.")
