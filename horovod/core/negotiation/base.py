"""The protocol between the engine and a negotiation, and what both protocols share.

The engine drives a :class:`Negotiation` in two calls per cycle: :meth:`Negotiation.await_cycle` returns once the
next cycle starts on this rank (it sleeps through :meth:`Loop.select`, so a waiting caller may run it), then
:meth:`Negotiation.negotiate` says, for each process set in id order, what to execute. A protocol owns every piece
of state it needs between those calls; it reads the engine only through :class:`Loop`, and never calls back into the
engine's cycle.
"""

from __future__ import annotations

import abc
import logging
from typing import Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple

from horovod.common.types import Response
from horovod.core.decision import Decision, StallReport
from horovod.core.set_state import IDLE, NEW, PENDING, SetState
from horovod.core.waiters import Waiters, Wakeup
from horovod.transport.base import Transport

__all__ = ["POLL_SECONDS", "BATCH_SPACING_SECONDS", "spacing_for", "IDLE", "PENDING", "NEW", "Batch", "View", "Loop",
           "Negotiation", "report_stalls", "plain_batches"]

POLL_SECONDS = 0.05    # while tensors wait for other ranks, the loop looks again this often (stall checks)
# Cycles that nobody waits for (a backward pass submitting gradients one by one) are spaced by at least this much
# unless HOROVOD_CYCLE_TIME is set: each cycle costs every rank a few wake-ups, a CPU-bound training step loses that
# time, and a few milliseconds let a burst of gradients fuse into one buffer. A caller waiting for a result never
# waits for it.
BATCH_SPACING_SECONDS = 0.010


def spacing_for(cycle_time: float, explicit: bool) -> float:
    """How long requests gather before a cycle nobody waits for: the cycle time, and at least
    :data:`BATCH_SPACING_SECONDS` unless it was chosen (``explicit``: HOROVOD_CYCLE_TIME set, or autotune's). The one
    copy of the rule: the engine and the simulation's ranks both ask it."""
    return cycle_time if explicit else max(cycle_time, BATCH_SPACING_SECONDS)
log = logging.getLogger("horovod")


class Batch(NamedTuple):
    """Responses that execute together. When their data came with the negotiation nothing travels to execute them:
    ``contributions[p]`` is the input of the member at position p for all of them, in order (peer: every rank
    folds; under the tree, at rank 0, some are a subtree's, folded on the way up: ``partial`` says which), or
    ``folded`` is their result, in order, as the coordinator folded it (star and tree)."""

    responses: List[Response]
    contributions: Optional[List[bytes]] = None
    folded: Optional[bytes] = None
    partial: Tuple[bool, ...] = ()


class View(Protocol):
    """What a negotiation protocol reads of the engine: the job, its process sets, who waits, the pacing settings.
    Nothing here does I/O or reads a clock (a protocol is given the time: :mod:`horovod.core.negotiation.events`)."""

    rank: int
    size: int
    sets: Dict[int, SetState]       # by id; changed only between cycles, by the loop itself
    waiters: Waiters
    cycle_time: float               # seconds (HOROVOD_CYCLE_TIME, or autotune's choice)

    def shutting_down(self) -> bool:
        """Whether this rank asked the job to stop."""

    def batch_spacing(self) -> float:
        """How long requests gather before a cycle nobody waits for."""

    def work(self) -> int:
        """NEW when requests wait to be negotiated (or shutdown), PENDING when only answers are awaited, else IDLE."""


class Loop(View, Protocol):
    """What the engine lends a negotiation's pump: the view, and the loop's transport, wake-up, clock and one way to
    sleep."""

    transport: Transport
    wake: Wakeup

    def select(self, fds: list, timeout: Optional[float]) -> list:
        """Wait for some of ``fds`` to be readable; the engine may lend the loop to a waiting caller meanwhile."""

    def clock(self) -> float:
        """Seconds on a monotonic clock: the engine's is the OS's, a simulation's is virtual."""


class Negotiation(abc.ABC):
    """One way for the ranks to agree, cycle by cycle, on what every member of a process set executes."""

    name = ""                           # "peer" or "star"
    every_member_coordinates = False    # whether every member of a set runs its Coordinator
    presented = False                   # this rank's messages for the coming cycle are out: it waits for the cycle

    def __init__(self, loop: Loop):
        self.loop = loop

    def start(self) -> None:
        """The connections are up: learn what to listen to."""

    @abc.abstractmethod
    def await_cycle(self) -> None:
        """Send what is due and wait until the next cycle starts on this rank (through ``loop.select``).

        Raises:
            HorovodInternalError: a peer failed, hung or sent something malformed.
        """

    @abc.abstractmethod
    def negotiate(self, state: SetState, shutdown: bool) -> Decision:
        """One process set's negotiation in the cycle that started: what the engine executes (batches in order,
        whether the job shuts down, the stall reports to log, the arrivals for the timeline)."""

    def wake_on_wait(self) -> bool:
        """Whether a thread starting to wait on a handle must wake the loop (a cycle or a message may be due)."""
        return True

    def forget(self, set_id: int) -> None:
        """A process set was removed: drop whatever is held for it."""


def report_stalls(reports: Sequence[StallReport]) -> None:
    """Log the stall inspector's reports, in Horovod's words."""
    for report in reports:
        log.warning("One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
                    "ranks and are waiting for remainder of ranks for more than %.0f seconds. Stalled "
                    "tensor %s, missing ranks: %s", report.waited, report.name, list(report.missing_ranks))


def plain_batches(batches: List[List[Response]]) -> List[Batch]:
    """Batches whose data travels in the data phase."""
    return [Batch(batch) for batch in batches]
