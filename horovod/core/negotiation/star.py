"""Star negotiation: rank 0 coordinates, for jobs above 4 ranks or with more ranks than cores on a host.

Every rank sends its requests to rank 0 (a follower ahead of the cycle, unasked: its *early message*), whose
coordinator decides and replies with the batches to execute, cached responses as bits. Rank 0 starts a cycle (a GO
frame, or the reply itself for a follower whose message is already there) only when it can make something ready,
so a backward pass does not pay a cycle per gradient. Rank 0 plays :class:`StarRootProtocol`, every other rank
:class:`StarFollowerProtocol`: state machines (:mod:`horovod.core.negotiation.events`) that a pump runs
(:class:`StarRoot`, :class:`StarFollower`); each set's round in the cycle is :mod:`horovod.core.negotiation.
star_round`'s. The design and its measurements: docs/engine.md, "When a cycle runs (star)".
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType
from horovod.core import buggify
from horovod.core.negotiation import inline
from horovod.core.negotiation.base import IDLE, NEW, POLL_SECONDS, Loop, View
from horovod.core.negotiation.events import BEGIN, DRAIN, HEARD, Send, Silent
from horovod.core.negotiation.frames import GO, WANT_NOW, Go, Msg, Reply, Want
from horovod.core.negotiation.pump import Pumped, patience
from horovod.core.negotiation.star_round import StarRound, decode_reply, message_and_data
from horovod.core.set_state import SetState

__all__ = ["StarRootProtocol", "StarFollowerProtocol", "StarRoot", "StarFollower", "ANNOUNCED_POLL_SECONDS",
           "decode_reply", "message_and_data"]

ANNOUNCED_POLL_SECONDS = 0.01   # rank 0 looks again this often while a follower's early message waits for a cycle
_WANT_WIRE = Want(WANT_NOW).encode()
_GO_WIRE = GO.encode()
_GO_ONLY = (Go,)
_GO_OR_REPLY = (Go, Reply)
_MSG_OR_WANT = (Msg, Want)


class _StarProtocol:
    """What both roles share: the set rounds of a cycle, and the protocol's standing interest."""

    name = "star"
    every_member_coordinates = False
    frames = 0      # (only the tree counts its frames)
    decides_at_once = False

    def __init__(self, view: View, patience: float):
        self.view = view
        self.patience = patience                    # seconds of silence before the transport hears (0: never)
        self.held = inline.HeldData()
        self.presented = False
        self.listening: Tuple[int, ...] = ()
        self.expects: tuple = _MSG_OR_WANT
        self.timeout: Optional[float] = None
        self._round = StarRound(self.held)
        self._in_cycle = False                      # a set's round may run: frames go to it
        self._out: List = []

    def frame(self, peer: int, frame, now: float) -> List:
        """In a set's round, the round's frame; before the cycle, the role's (:meth:`_before_cycle`)."""
        if self._in_cycle:
            return self._in_round(self._round.frame(peer, frame, now))
        out = self._out
        out.clear()
        return self._before_cycle(peer, frame, out)

    def forget(self, set_id: int) -> None:
        """Drop the data held for a removed set."""
        self.held.forget(set_id)

    def began(self, now: float) -> None:
        """(Nothing to note: the star paces cycles from when it decided to start one.)"""

    def _in_round(self, actions: List) -> List:
        """Take the round's interest as the protocol's while it runs."""
        self.listening, self.expects = self._round.listening, self._round.expects
        return actions


class StarRootProtocol(_StarProtocol):
    """Rank 0: starts a cycle when one can make a tensor ready, and coordinates the global set.

    A tensor becomes ready when its last rank submits it, so a cycle starts when a name that rank 0 itself just
    submitted, or that a follower just announced (its early message), has now been submitted by every rank of the
    global set; at once for anything rank 0 cannot look into (other process sets, shutdown, a join). While ranks
    merely wait for each other nothing is exchanged: during a backward pass every gradient would otherwise cost a
    cycle on every rank, which on a busy CPU is time taken from the computation. A slow poll (at least
    ``HOROVOD_CYCLE_TIME``) still runs while anything is pending, for stall checks.
    """

    def __init__(self, view: View, patience: float):
        super().__init__(view, patience)
        self._followers = tuple(range(1, view.size))
        self.listening = self._followers
        self._early: Dict[int, Msg] = {}            # followers' global-set messages, by rank, until the cycle
        self._early_names: Dict[int, Set[str]] = {}  # the names each early message announces, until the cycle
        self._early_urgent = False                  # an early message carries a join or shutdown
        self._wanted = IDLE                         # the most urgent cycle request read from a follower
        self._last_start = float("-inf")            # when the last cycle started
        self._waiting_since: Optional[float] = None  # when rank 0 last found work pending, after the last cycle

    def peers(self) -> Tuple[int, ...]:
        """Every follower."""
        return self._followers

    def wake_on_wait(self) -> bool:
        """A waiting thread may make a cycle due at once."""
        return True

    def woken(self, now: float) -> List:
        """Start the cycle if it is due (GO to every follower whose message is not in), else say what to wait for."""
        out = self._out
        out.clear()
        self._in_cycle = False
        self.expects = _MSG_OR_WANT
        if not self._due(now):
            return out
        out.append(DRAIN)
        self._last_start = now
        # A rank whose message is here learns of the cycle from the reply itself: one frame and wake-up less.
        out.append(Send(tuple(peer for peer in self._followers if peer not in self._early), _GO_WIRE))
        self._wanted = IDLE
        self._waiting_since = None
        self._early_names.clear()
        self._early_urgent = False
        self._in_cycle = True
        out.append(BEGIN)
        return out

    def _before_cycle(self, peer: int, frame, out: List) -> List:
        """A follower's cycle request or early message."""
        if type(frame) is Msg:
            if peer in self._early:
                raise HorovodInternalError(f"rank {peer} sent two messages for one cycle")
            self._early[peer] = frame
            self._announce(peer, frame)
        else:
            self._wanted = NEW
        return out

    def turn(self, state: SetState, shutdown: bool, now: float) -> List:
        """A set's round: the global set's followers' early messages are in hand already."""
        return self._in_round(self._round.turn(state, shutdown, now, early=self._early if state.id == 0 else None))

    def _due(self, now: float) -> bool:
        """Whether the cycle starts now; if not, what to wait for (``listening``, ``timeout``)."""
        view = self.view
        if self._wanted == NEW or self._cycle_is_useful():
            # While nobody blocks on a result (a backward pass submitting gradients as it goes), cycles are spaced
            # by HOROVOD_CYCLE_TIME so that tensors fuse; a caller waiting or polling now starts one at once. (Not
            # one that waited in the last cycle: a step that submits 200 gradients and then waits would start a
            # cycle for its first gradient, and take two.)
            spacing = self._last_start + view.batch_spacing() - now
            if view.waiters.blocked > 0 or view.waiters.polled or spacing <= 0 or \
                    buggify.ON and buggify.fires("star.cycle_early"):
                return True
            self.listening = ()
            self.timeout = buggify.late(spacing, "star.timer_late") if buggify.ON else spacing
            return False
        timeout = None
        if self._early_names:
            # A follower that has sent its message stays silent until the cycle: requests it made since are only
            # seen by polling, soon (rank 0's own new requests start a cycle at once, above).
            timeout = self._last_start + max(view.cycle_time, ANNOUNCED_POLL_SECONDS) - now
        elif view.work() != IDLE or view.sets[0].coordinator.waiting():
            # Counted from when the wait began, not from the last cycle: a step longer than the interval would
            # otherwise start a cycle the moment rank 0 submits, before any other rank could.
            if self._waiting_since is None:
                self._waiting_since = now
            timeout = max(self._last_start, self._waiting_since) + max(view.cycle_time, POLL_SECONDS) - now
        if timeout is not None and (timeout <= 0 or buggify.ON and buggify.fires("star.cycle_early")):
            return True     # (buggify: before every name it waits for is announced, or the poll is due)
        timeout = buggify.late(timeout, "star.timer_late") if buggify.ON else timeout
        self.listening = self._followers
        self.timeout = timeout
        return False

    def _cycle_is_useful(self) -> bool:
        """Could a cycle started now make something ready (or must it run regardless)?"""
        view = self.view
        if view.shutting_down() or self._early_urgent:
            return True
        for set_id, state in view.sets.items():
            if set_id != 0 and state.index >= 0 and state.queue:
                return True
        state = view.sets[0]
        if view.size == 1:
            return bool(state.queue)
        queued = list(state.queue)
        if queued and self._early_names:
            return True     # our new requests may complete what a silent follower submitted after its message
        if any(r.op == OpType.JOIN for r in queued):
            return True
        if not self._early_names and state.coordinator.quiet():
            return False    # no other rank's submission is known: nothing can be ready (checked per wake-up)
        return self._completes([r.name for r in queued], state)

    def _completes(self, candidates: List[str], state: SetState) -> bool:
        """Whether some queued or announced name has now been submitted by every rank of the global set."""
        early, entries, coordinator = self._early_names, state.entries, state.coordinator
        for names in early.values():
            candidates.extend(names)
        for name in candidates:
            if name not in entries and not coordinator.has(name, 0):
                continue
            for index in range(1, self.view.size):
                announced = early.get(index)
                if not ((announced is not None and name in announced) or coordinator.has(name, index)):
                    break
            else:
                return True
        return False

    def _announce(self, peer: int, message: Msg) -> None:
        """Note the names a follower's early message carries, for :meth:`_cycle_is_useful`."""
        cache = self.view.sets[0].cache
        try:
            names = {cache.name(bit) for bit in message.hits}
        except KeyError:
            names = set()
            self._early_urgent = True   # a bit this cache lacks: the cycle reports it (Coordinator.step)
        names.update(r.name for r in message.requests)
        self._early_names[peer] = names
        self._early_urgent = self._early_urgent or message.shutdown or any(
            r.op == OpType.JOIN for r in message.requests)


class StarFollowerProtocol(_StarProtocol):
    """Every other rank: announces its global-set requests to rank 0 (or asks for a cycle) and waits for the start."""

    def __init__(self, view: View, patience: float):
        super().__init__(view, patience)
        self.listening, self.expects = (0,), _GO_ONLY
        self._reply: Optional[Reply] = None         # the global set's reply that started this cycle
        self._asked = IDLE                          # what this rank asked rank 0 for since the last cycle
        self._asked_at: Optional[float] = None      # when this rank began waiting for rank 0 to start a cycle
        self._told = 0                              # how often that wait was reported to the transport
        self._queued_since: Optional[float] = None  # when the global set's queue became non-empty

    def peers(self) -> Tuple[int, ...]:
        """Rank 0."""
        return (0,)

    def wake_on_wait(self) -> bool:
        """A waiting thread makes the early message due at once."""
        return not self.presented and bool(self.view.sets[0].queue)

    def woken(self, now: float) -> List:
        """Announce new requests to rank 0 (or ask it for a cycle) when due; then wait for rank 0's start."""
        out = self._out
        out.clear()
        self._in_cycle = False
        timeout = None
        # After the early message nothing more may be sent until the cycle starts: rank 0 may already be executing,
        # and a frame arriving then would land in the middle of the data phase.
        if not self.presented and self.view.work() == NEW:
            if self._presentable():
                timeout = self._present(now, out)
            elif self._asked != NEW:
                # Work rank 0 cannot see (another set, shutdown): a cycle now.
                out.append(Send((0,), _WANT_WIRE))
                self._asked = NEW
        timeout = self._patience(now, timeout, out)
        timeout = buggify.late(timeout, "star.timer_late") if buggify.ON else timeout
        self.listening = (0,)
        self.expects = _GO_OR_REPLY if self.presented else _GO_ONLY    # (the reply to our message starts it too)
        self.timeout = timeout
        return out

    def _before_cycle(self, peer: int, frame, out: List) -> List:
        """Rank 0's start of the cycle: GO, or the reply to this rank's early message itself."""
        if self._told:
            out.append(HEARD)
        self._asked_at, self._told = None, 0
        if type(frame) is Reply:
            self._reply = frame
        self._asked = IDLE
        self._in_cycle = True
        out.append(BEGIN)
        return out

    def turn(self, state: SetState, shutdown: bool, now: float) -> List:
        """A set's round; the global set's message may have gone out early, and its reply started the cycle."""
        answered = (False, None)
        if state.id == 0 and self.presented:
            self.presented = False          # this cycle answers the message we sent while idle
            answered, self._reply = (True, self._reply), None
        return self._in_round(self._round.turn(state, shutdown, now, answered=answered))

    def _patience(self, now: float, timeout: Optional[float], out: List) -> Optional[float]:
        """Tell the transport of rank 0's silence every half timeout once asked for a cycle (it answers within a
        poll interval while its engine runs)."""
        if not (self.presented or self._asked == NEW):
            return timeout
        tick = self.patience / 2
        if tick <= 0:
            return timeout
        if self._asked_at is None:
            self._asked_at = now
        silent = now - self._asked_at
        if silent >= (self._told + 1) * tick:
            self._told += 1
            out.append(Silent(0, silent))
        left = (self._told + 1) * tick - silent
        return left if timeout is None else min(timeout, left)

    def _presentable(self) -> bool:
        """Only global-set requests wait, which the early message can carry."""
        sets = self.view.sets
        return bool(sets[0].queue) and not self.view.shutting_down() and not any(
            state.queue for set_id, state in sets.items() if set_id != 0)

    def _present(self, now: float, out: List) -> Optional[float]:
        """Send the global set's message for the next cycle if it is due, else say in how long.

        Sent right away instead of asking for a cycle and then sending it: one network hop less, and rank 0 sees
        which names it completes. While nobody here waits for results, requests are gathered for the batch spacing
        first, so that the message (and the cycle it completes) carries a burst of gradients rather than one.
        """
        view = self.view
        if self._queued_since is None:
            self._queued_since = now
        timeout = self._queued_since + view.batch_spacing() - now
        if view.waiters.blocked > 0 or view.waiters.polled or timeout <= 0:
            if buggify.ON and buggify.held(self, "star.message_held", self._queued_since + view.batch_spacing(), now):
                return timeout          # to the last moment the spacing allows
            out.append(Send((0,), message_and_data(view.sets[0], view.shutting_down(), True).encode()))
            self.presented = True
            self._queued_since = None
            return None
        return timeout


class StarRoot(Pumped):
    """The star's rank 0 over a loop (the engine's, or a simulated rank's)."""

    def __init__(self, loop: Loop):
        super().__init__(loop, StarRootProtocol(loop, patience(loop)))


class StarFollower(Pumped):
    """A star follower over a loop."""

    def __init__(self, loop: Loop):
        super().__init__(loop, StarFollowerProtocol(loop, patience(loop)))
