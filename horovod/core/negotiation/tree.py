"""Tree negotiation: the global set's messages travel up a 3-ary tree to rank 0 and its reply comes back down.

Under the star, rank 0 reads and writes a frame per rank every cycle, and holds a connection to every rank: at a
few hundred ranks rank 0's Python is the step time, and its descriptors run out. Here rank ``r`` talks only to its
parent ``(r - 1) // 3`` and its children ``3r + 1`` to ``3r + 3``, so no rank handles more than eight frames per
cached cycle whatever the world size, and a rank holds at most four control connections.

A cycle:

1. *Up, early.* Once every rank of a subtree waits for a result (a caller blocks, with something submitted), the
   subtree's message goes up unasked: each rank gathers its children's messages, adds its own and sends the lot to
   its parent (``("up", groups)``), listing together the ranks that sent the very same message: in steady state
   (every name cached, every rank the same bits) a subtree's message is one message and a list of ranks, whatever
   the subtree's size. When the whole job waits, rank 0 has every message and decides at once: no frame starts the
   cycle.
2. *Start.* Otherwise ranks tell their parents, at most once per cycle each, that every rank of the subtree has
   requests (:data:`WANT_EVERY`: a backward pass under way everywhere), that some rank needs a cycle at once
   (:data:`WANT_NOW`: another process set's requests, shutdown), or that a rank's requests have waited a poll
   interval while others had none (:data:`WANT_NEW`). Rank 0 starts a cycle at once for WANT_NOW, the batch
   spacing after the whole job had requests (so that the cycle completes names, as the star's rank 0 ensures by
   reading every request), a poll interval after any request, or now and then while tensors wait for other ranks
   (stall checks): it sends :data:`GO` to the children whose message is not in, and they gather theirs.
3. *Down.* Rank 0's coordinator decides over the groups (:meth:`Coordinator.step_groups`); the reply goes down the
   tree, each rank passing it on to its children before it executes.

A rank sends nothing after its message until the reply (it may already be executing when a frame arrives), and
``want`` only before its message, so a control frame never lands inside a data phase on a connection the data plane
shares. Other process sets negotiate
as under the star, through their first rank. The default for which world size: :mod:`horovod.core.negotiation`.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple, Union

from horovod.common.exceptions import HorovodInternalError
from horovod.core import buggify
from horovod.core.decision import Contributors, Decision
from horovod.core.negotiation import inline
from horovod.core.negotiation.base import IDLE, NEW, POLL_SECONDS, Loop, View
from horovod.core.negotiation.events import BEGIN, DRAIN, Execute, Send, Stall
from horovod.core.negotiation.frames import (GO, WANT_EVERY, WANT_NEW, WANT_NOW, Go, Msg, Reply, Up, Want,
                                             group_messages)
from horovod.core.negotiation.pump import Pumped
from horovod.core.negotiation.star_round import StarRound, decode_reply, message_and_data, reply_with_data
from horovod.core.negotiation.tree_shape import ARITY, Groups, children, merge, parent, subtree_size
from horovod.core.set_state import SetState

log = logging.getLogger("horovod")

__all__ = ["WANT_NEW", "WANT_EVERY", "WANT_NOW", "GO", "ARITY", "parent", "children", "subtree_size", "TreeProtocol",
           "TreeNegotiation"]

_GO_WIRE = GO.encode()
_GO_ONLY = (Go,)
_GO_OR_REPLY = (Go, Reply)
_UP_OR_WANT = (Up, Want)
_REPLY = (Reply,)
_IDLE, _CYCLE, _GATHER, _DOWN, _ROUND = range(5)     # where a rank is: before a cycle, in it, and in which part


class TreeProtocol:
    """Every rank's side of the tree (see the module's docstring), as a state machine
    (:mod:`horovod.core.negotiation.events`); rank 0 is the root."""

    name = "tree"
    every_member_coordinates = False
    decides_at_once = False

    def __init__(self, view: View):
        self.view = view
        self.held = inline.HeldData()               # small allreduces' data that came with the messages (rank 0)
        self._round = StarRound(self.held)          # every other process set negotiates as under the star
        self._children = tuple(children(view.rank, view.size))
        self._parent = parent(view.rank) if view.rank > 0 else None
        self._above = () if self._parent is None else (self._parent,)
        self.presented = False
        self.listening: Tuple[int, ...] = self._children + self._above
        self._expects_before = {child: _UP_OR_WANT for child in self._children}   # each peer's kinds, before a cycle
        self._expects_presented = dict(self._expects_before)
        if self._parent is not None:
            self._expects_before[self._parent] = _GO_ONLY
            self._expects_presented[self._parent] = _GO_OR_REPLY    # (the reply to our message starts it too)
        self.expects: Union[tuple, Dict[int, tuple]] = self._expects_before
        self.timeout: Optional[float] = None
        self._heard: Dict[int, int] = {}          # WANT_* bits each child sent since the last cycle
        self._early: Dict[int, Up] = {}           # children's subtree messages that came before the cycle
        self._told = 0                            # WANT_* bits this rank sent its parent since the last cycle
        self._reply: Optional[Reply] = None       # the reply that started the cycle for a rank that presented
        self._new_since: Optional[float] = None   # when this rank (rank 0: the job) had requests, this cycle
        self._every_since: Optional[float] = None  # (rank 0) when every rank had requests, this cycle
        self._last_start = float("-inf")
        self._phase = _IDLE                       # where this rank is in the cycle
        self._gather: Optional[list] = None       # (gathering) state, shutdown, groups, datas, own data, next child
        self._state: Optional[SetState] = None    # (gathering or down) the global set
        self._out: List = []
        self.frames = 0                 # control frames this rank read and wrote (for tests of the tree's cost)

    def peers(self) -> Tuple[int, ...]:
        """The children and the parent."""
        return self._children + self._above

    def wake_on_wait(self) -> bool:
        """A waiting thread may complete the subtree's wait (then its message goes up), unless it went already."""
        return not self.presented

    def forget(self, set_id: int) -> None:
        """Drop the data held for a removed set."""
        self.held.forget(set_id)

    def began(self, now: float) -> None:
        """(Nothing to note: the root counts from when it decided to start the cycle.)"""

    # -- before the cycle ----------------------------------------------------------------------------------------

    def woken(self, now: float) -> List:
        """Send the subtree's message when it waits, or say what it needs; the root starts the cycle when due."""
        out = self._out
        out.clear()
        self._phase = _IDLE
        if self._parent is None:
            start, timeout = self._root_due(now)
            if start:
                self._last_start = now
                return self._start(out)
            self._listen(timeout)
            return out
        timeout = None
        if not self.presented:
            if self._all_wait():
                view = self.view
                groups, datas = self._subtree_whole(view.sets[0], view.shutting_down())
                self._send_up(groups, datas, out)
                self.presented = True
            else:
                bits = self._wants(now)
                if bits & ~self._told:
                    self._send((self._parent,), Want(bits).encode(), out)
                    self._told |= bits
                if self._new_since is not None and not self._told & WANT_NEW:
                    timeout = max(0.0, self._new_since + POLL_SECONDS - now)
        self._listen(timeout)
        return out

    def frame(self, peer: int, frame, now: float) -> List:
        """A child's subtree message or cycle request, the parent's start of the cycle, or a frame of the cycle."""
        phase = self._phase
        if phase == _ROUND:
            return self._in_round(self._round.frame(peer, frame, now))
        self.frames += 1
        out = self._out
        out.clear()
        if phase == _GATHER:
            return self._gathered(frame, now, out)
        if phase == _DOWN:
            return self._pass_down(frame, out)
        if peer != self._parent:
            if type(frame) is Up:
                self._early[peer] = frame
            else:
                self._heard[peer] = self._heard.get(peer, 0) | frame.bits
            self.listening = tuple(p for p in self.listening if p != peer) if type(frame) is Up else self.listening
            return out
        if type(frame) is Reply:    # the reply to the message we presented starts the cycle too
            self._reply = frame
        return self._start(out)

    def _start(self, out: List) -> List:
        """The cycle starts on this rank: GO to the children whose message is not in."""
        out.append(DRAIN)
        if not self.presented:
            self._send(tuple(child for child in self._children if child not in self._early), _GO_WIRE, out)
        self._heard.clear()
        self._told = 0
        self._new_since = self._every_since = None
        self._phase = _CYCLE
        out.append(BEGIN)
        return out

    def _root_due(self, now: float) -> Tuple[bool, Optional[float]]:
        """Whether the cycle starts now; if not, how long to wait (None: until something happens)."""
        view = self.view
        if self._all_wait():
            return True, None
        bits = self._wants(now)
        if bits & WANT_NOW:
            return True, None
        timeouts = []
        if bits & WANT_EVERY:
            if self._every_since is None:
                self._every_since = now
            timeouts.append(max(self._every_since, self._last_start) + view.batch_spacing() - now)
        if bits & WANT_NEW:
            return True, None
        if self._new_since is not None:
            timeouts.append(self._new_since + POLL_SECONDS - now)
        elif view.work() != IDLE or view.sets[0].coordinator.waiting():
            # Answers awaited: look again a poll interval after the last cycle. (New requests wait the interval from
            # when they came, above: counted from the last cycle, a step longer than the interval would start a
            # cycle the moment rank 0 submits, before any other rank could.)
            timeouts.append(self._last_start + max(view.cycle_time, POLL_SECONDS) - now)
        timeout = min(timeouts) if timeouts else None
        if timeout is not None and (timeout <= 0 or buggify.ON and buggify.fires("tree.cycle_early")):
            return True, None
        return False, timeout

    def _listen(self, timeout: Optional[float]) -> None:
        """Wait for the children whose message is not in and (below the root) the parent's start of the cycle."""
        self.listening = tuple(child for child in self._children if child not in self._early) + self._above
        self.expects = self._expects_presented if self.presented else self._expects_before
        if buggify.ON:
            timeout = buggify.late(timeout, "tree.timer_late")
        self.timeout = timeout

    # -- one cycle -----------------------------------------------------------------------------------------------

    def turn(self, state: SetState, shutdown: bool, now: float) -> List:
        """The global set up and down the tree; any other set as under the star."""
        if state.id != 0:
            self._phase = _ROUND
            return self._in_round(self._round.turn(state, shutdown, now))
        out = self._out
        out.clear()
        self._state = state
        if self.presented:
            self.presented = False      # our subtree's message went up before the cycle
            reply, self._reply = self._reply, None
            self._early.clear()
            return self._await_reply(out) if reply is None else self._pass_down(reply, out)
        msg, groups, datas = self._own(state, shutdown)
        self._gather = [msg, groups, datas, 0]
        self._phase, self.expects = _GATHER, _UP_OR_WANT
        return self._gather_next(now, out)

    def _gather_next(self, now: float, out: List) -> List:
        """Take the children's messages in order (those in before the cycle, else read now); then send the subtree's
        up, or (the root) decide."""
        state, gather, early = self._state, self._gather, self._early
        msg, groups, datas, index = gather
        while index < len(self._children):
            up = early.get(self._children[index])
            if up is None:
                gather[3] = index
                self.listening = (self._children[index],)
                return out
            merge(groups, up.groups)
            datas.extend(up.datas)
            index += 1
        self._gather = None
        datas = self._fold_own(state, msg, datas)
        early.clear()
        if self._parent is None:
            return self._decide(state, groups, datas, now, out)
        self._send_up(groups, datas, out)
        return self._await_reply(out)

    def _gathered(self, frame, now: float, out: List) -> List:
        if type(frame) is Want:
            return out      # a cycle request the child sent before it saw the cycle start: this cycle answers it
        gather = self._gather
        merge(gather[1], frame.groups)
        gather[2].extend(frame.datas)
        gather[3] += 1
        return self._gather_next(now, out)

    def _await_reply(self, out: List) -> List:
        self._phase, self.listening, self.expects = _DOWN, self._above, _REPLY
        return out

    def _pass_down(self, reply: Reply, out: List) -> List:
        """The parent's reply: checked, passed on to the children, executed."""
        decided = decode_reply(self._state, reply, self._parent)      # checked before it is passed on
        if self._children:
            self._relay_slow(out)
            self._send(self._children, reply.encode(), out)
        return self._decided(decided, out)

    def _decided(self, decision: Decision, out: List) -> List:
        self._phase, self._state, self.listening = _CYCLE, None, ()
        out.append(Execute(decision))
        return out

    def _own(self, state: SetState, shutdown: bool) -> Tuple[Msg, Groups, list]:
        """This rank's message and small allreduces' data, as the first group of its subtree."""
        msg = message_and_data(state, shutdown, relay=True)
        rank = self.view.rank
        return msg, [([rank], msg.sent())], [(Contributors(rank), msg.data)] if msg.data else []

    def _subtree_whole(self, state: SetState, shutdown: bool) -> Tuple[Groups, list]:
        """The subtree's message when every child's is in (before the cycle)."""
        msg, groups, datas = self._own(state, shutdown)
        for child in self._children:
            up = self._early[child]
            merge(groups, up.groups)
            datas.extend(up.datas)
        return groups, self._fold_own(state, msg, datas)

    def _fold_own(self, state: SetState, msg: Msg, datas: list) -> list:
        """A relay folds its subtree's small allreduces into one contribution per name on the way up."""
        view = self.view
        if msg.data and self._parent is not None and self._children:
            own = {}
            for name in msg.data:       # (a failure may have dropped the entries meanwhile)
                entry = state.entries.get(name)
                if entry is not None:
                    own[name] = entry.request
            datas = inline.fold_subtree(view.rank, subtree_size(view.rank, view.size), own, datas)
        return datas

    def _decide(self, state: SetState, groups: Groups, datas: list, now: float, out: List) -> List:
        size = self.view.size
        for key, data in datas:
            # A rank's own, or a relay's subtree folded on the way up (its count checked: the sum must hold each
            # rank once).
            if 0 <= key.first < size and (key.count == 1 or (
                    key.first > 0 and key.count == subtree_size(key.first, size))):
                self.held.hold(state.id, key, data)
        seen = sum(len(ranks) for ranks, _ in groups)
        if seen != size or len({r for ranks, _ in groups for r in ranks}) != size:
            raise HorovodInternalError(f"rank 0 gathered negotiation messages for {seen} ranks of {size}")
        batches, stop, reports, arrivals = state.coordinator.step_groups(group_messages(groups), now)
        if batches and log.isEnabledFor(logging.DEBUG):
            log.debug("negotiated (tree): %s", [n for b in batches for r in b for n in r.names])
        decided, reply = reply_with_data(self.held, state, stop, batches)
        self._send(self._children, reply.encode(), out)
        return self._decided(Decision(decided, stop, reports, arrivals), out)

    def _send_up(self, groups: Groups, datas: list, out: List) -> None:
        self._relay_slow(out)
        self._send(self._above, Up(groups, datas).encode(), out)

    def _relay_slow(self, out: List) -> None:
        """(buggify) A relay (a rank with a parent and children) stalls before it forwards, now and then."""
        if buggify.ON and self._children and self._parent is not None and buggify.fires("tree.relay_slow"):
            out.append(Stall(buggify.uniform(buggify.STALL_SECONDS)))

    def _send(self, peers: Tuple[int, ...], wire: tuple, out: List) -> None:
        self.frames += len(peers)
        out.append(Send(peers, wire))

    def _in_round(self, actions: List) -> List:
        """Take the round's interest as the protocol's while it runs."""
        self.listening, self.expects = self._round.listening, self._round.expects
        return actions

    # -- what the subtree needs ----------------------------------------------------------------------------------

    def _wants(self, now: float) -> int:
        """The WANT_* bits of this rank's subtree now."""
        view = self.view
        work = view.work()
        bits = 0
        if view.shutting_down() or any(state.queue for set_id, state in view.sets.items() if set_id != 0):
            bits |= WANT_NOW
        if work == NEW:
            if self._new_since is None:
                self._new_since = now
            if now - self._new_since >= POLL_SECONDS:
                bits |= WANT_NEW
        heard = self._heard
        for child in self._children:
            bits |= heard.get(child, 0) & (WANT_NEW | WANT_NOW)
        if (work == NEW or view.waiters.blocked > 0 and work != IDLE) and all(
                child in self._early or heard.get(child, 0) & WANT_EVERY for child in self._children):
            bits |= WANT_EVERY
        return bits

    def _all_wait(self) -> bool:
        """Whether every rank of this subtree waits for a result, and only global-set requests are queued here (the
        subtree's message can carry those)."""
        view = self.view
        if view.shutting_down() or view.waiters.blocked == 0 or view.work() == IDLE:
            return False
        if any(state.queue for set_id, state in view.sets.items() if set_id != 0):
            return False
        return all(child in self._early for child in self._children)


class TreeNegotiation(Pumped):
    """The tree over a loop (the engine's, or a simulated rank's)."""

    def __init__(self, loop: Loop):
        super().__init__(loop, TreeProtocol(loop))     # (a tree rank reports no silent peer: no patience)
