"""What one cycle of one process set passes between the parts: a rank's :class:`Message` goes into the
coordinator, a :class:`Decision` comes out, and the engine executes it.

The coordinator (:mod:`horovod.core.coordinator`) decides from the messages alone; a negotiation protocol
(:mod:`horovod.core.negotiation`) carries the messages and returns the decision, with each batch's data where it
came with the negotiation; the engine (:mod:`horovod.core.engine`) executes the batches in order, reports the
stalls and ends the loop when the decision says the job shuts down. No part reads or writes another's attributes
to learn what was decided.
"""

from __future__ import annotations

import dataclasses
from typing import List, NamedTuple, Sequence, Tuple

from horovod.common.types import Request

__all__ = ["FATAL_ERROR", "Message", "StallReport", "Decision", "Contributors"]

FATAL_ERROR = 1   # ERROR response payload: raise HorovodInternalError, as Horovod shuts down on a stall


@dataclasses.dataclass(frozen=True)
class Message:
    """One rank's contribution to a cycle: whether it asks the job to shut down, the cache bits of requests
    identical to their last negotiated one, and its other requests in full."""

    shutdown: bool
    hits: Tuple[int, ...]
    requests: Tuple[Request, ...]


@dataclasses.dataclass
class StallReport:
    """Tensors waiting longer than the stall warning time, and the ranks (global) that have not sent them."""

    name: str
    missing_ranks: Tuple[int, ...]
    waited: float


class Decision(NamedTuple):
    """What one process set's cycle decided, for the engine to execute.

    ``batches`` run in order on every member (the coordinator's are lists of responses; a negotiation returns
    :class:`horovod.core.negotiation.base.Batch` records, which may carry the data that came with it);
    ``shutdown``: the job stops after this cycle; ``stalls``: the stall inspector's reports due now (non-empty only
    where they are to be logged: on the set's first rank); ``arrivals``: (name, op, global rank) of each request the
    coordinator saw in this cycle, for the timeline (empty where no coordinator ran, or no timeline reads them).
    """

    batches: List
    shutdown: bool
    stalls: Sequence[StallReport] = ()
    arrivals: Sequence[Tuple[str, int, int]] = ()

    # ``Decision.fast(fields)``: the decision from a full tuple of its fields in order, without the named tuple's
    # Python-level constructor (once per set and cycle).
    fast = classmethod(tuple.__new__)



class Contributors(NamedTuple):
    """Whose small-allreduce data travelled with the negotiation: the one key of such data, in :class:`Up` frames
    (:mod:`horovod.core.negotiation.frames`) and in what a negotiation holds (:mod:`horovod.core.negotiation.inline`).

    ``count`` 1: the input of the member at position ``first``, as it sent it (to be prescaled when folded); more:
    the whole subtree of ``count`` ranks under tree relay ``first``, folded on its way up (already prescaled). A relay
    folds only when it has children, so a folded subtree always holds more than one rank.
    """

    first: int
    count: int = 1

    @property
    def folded(self) -> bool:
        """Whether this is a subtree's data, folded (and prescaled) on the way up."""
        return self.count > 1
