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
from typing import Dict, List, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.core import buggify
from horovod.core.decision import Contributors, Decision
from horovod.core.negotiation import inline
from horovod.core.negotiation.base import IDLE, NEW, POLL_SECONDS, Loop, Negotiation
from horovod.core.negotiation.frames import (GO, WANT_EVERY, WANT_NEW, WANT_NOW, Go, Group, Reply, Up, Want,
                                             group_messages, receive)
from horovod.core.negotiation.pump import drive_turn
from horovod.core.negotiation.star_round import StarRound, decode_reply, message_and_data, reply_with_data
from horovod.core.set_state import SetState

log = logging.getLogger("horovod")

__all__ = ["WANT_NEW", "WANT_EVERY", "WANT_NOW", "GO", "parent", "children", "subtree_size", "TreeNegotiation"]

Groups = List[Group]
_GO_WIRE = GO.encode()
_GO_ONLY = (Go,)
_GO_OR_REPLY = (Go, Reply)
_UP_OR_WANT = (Up, Want)


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


class TreeNegotiation(Negotiation):
    """Every rank's side of the tree (see the module's docstring); rank 0 is the root."""

    name = "tree"

    def __init__(self, loop: Loop):
        super().__init__(loop)
        self.held = inline.HeldData()    # small allreduces' data that came with the messages (rank 0, set 0)
        self._round = StarRound(self.held)  # every other process set negotiates as under the star
        self._children = children(loop.rank, loop.size)
        self._parent = parent(loop.rank) if loop.rank > 0 else None
        self._child_fds: Dict[int, int] = {}
        self._parent_fd: Optional[int] = None
        self._heard: Dict[int, int] = {}          # WANT_* bits each child sent since the last cycle
        self._early: Dict[int, Up] = {}           # children's subtree messages that came before the cycle
        self._told = 0                            # WANT_* bits this rank sent its parent since the last cycle
        self._reply: Optional[Reply] = None       # the reply that started the cycle for a rank that presented
        self._new_since: Optional[float] = None   # when this rank (rank 0: the job) had requests, this cycle
        self._every_since: Optional[float] = None  # (rank 0) when every rank had requests, this cycle
        self._last_start = float("-inf")
        self.frames = 0                 # control frames this rank read and wrote (for tests of the tree's cost)

    def start(self) -> None:
        """Listen to the parent and the children (their connections open now, once)."""
        transport = self.loop.transport
        self._child_fds = {transport.fileno(child): child for child in self._children}
        if self._parent is not None:
            self._parent_fd = transport.fileno(self._parent)

    def wake_on_wait(self) -> bool:
        """A waiting thread may complete the subtree's wait (then its message goes up), unless it went already."""
        return not self.presented

    def forget(self, set_id: int) -> None:
        """Drop the data held for a removed set."""
        self.held.forget(set_id)

    # -- starting a cycle ----------------------------------------------------------------------------------------

    def _wants(self, now: float) -> int:
        """The WANT_* bits of this rank's subtree now."""
        loop = self.loop
        work = loop.work()
        bits = 0
        if loop.shutting_down() or any(state.queue for set_id, state in loop.sets.items() if set_id != 0):
            bits |= WANT_NOW
        if work == NEW:
            if self._new_since is None:
                self._new_since = now
            if now - self._new_since >= POLL_SECONDS:
                bits |= WANT_NEW
        heard = self._heard
        for child in self._children:
            bits |= heard.get(child, 0) & (WANT_NEW | WANT_NOW)
        if (work == NEW or loop.waiters.blocked > 0 and work != IDLE) and all(
                child in self._early or heard.get(child, 0) & WANT_EVERY for child in self._children):
            bits |= WANT_EVERY
        return bits

    def _all_wait(self) -> bool:
        """Whether every rank of this subtree waits for a result, and only global-set requests are queued here (the
        subtree's message can carry those)."""
        loop = self.loop
        if loop.shutting_down() or loop.waiters.blocked == 0 or loop.work() == IDLE:
            return False
        if any(state.queue for set_id, state in loop.sets.items() if set_id != 0):
            return False
        return all(child in self._early for child in self._children)

    def await_cycle(self) -> None:
        """Send the subtree's message when it waits, or say what it needs; return once the cycle starts.

        Raises:
            HorovodInternalError: a parent or child sent something other than what the protocol allows.
        """
        if self._parent is None:
            while not self._root_due():
                pass
            self._last_start = self.loop.clock()
        else:
            while not self._node_due():
                pass
        self.loop.wake.drain()
        if not self.presented:
            for child in self._children:
                if child not in self._early:
                    self._send(child, _GO_WIRE)
        self._heard.clear()
        self._told = 0
        self._new_since = self._every_since = None

    def _root_due(self) -> bool:
        """Sleep once until something changes; True when the cycle starts now."""
        loop = self.loop
        if self._all_wait():
            return True
        now = self.loop.clock()
        bits = self._wants(now)
        if bits & WANT_NOW:
            return True
        timeouts = []
        if bits & WANT_EVERY:
            if self._every_since is None:
                self._every_since = now
            timeouts.append(max(self._every_since, self._last_start) + loop.batch_spacing() - now)
        if bits & WANT_NEW:
            return True
        if self._new_since is not None:
            timeouts.append(self._new_since + POLL_SECONDS - now)
        elif loop.work() != IDLE or loop.sets[0].coordinator.waiting():
            # Answers awaited: look again a poll interval after the last cycle. (New requests wait the interval from
            # when they came, above: counted from the last cycle, a step longer than the interval would start a
            # cycle the moment rank 0 submits, before any other rank could.)
            timeouts.append(self._last_start + max(loop.cycle_time, POLL_SECONDS) - now)
        timeout = min(timeouts) if timeouts else None
        if timeout is not None and (timeout <= 0 or buggify.ON and buggify.fires("tree.cycle_early")):
            return True
        self._listen(timeout)
        return False

    def _node_due(self) -> bool:
        """Present the subtree's message or say what it needs, then sleep once; True when the cycle started."""
        timeout = None
        if not self.presented:
            if self._all_wait():
                groups, datas = self._subtree(self.loop.sets[0], self.loop.shutting_down())
                if buggify.ON:
                    self._relay_slow()
                self._send(self._parent, Up(groups, datas).encode())
                self.presented = True
            else:
                now = self.loop.clock()
                bits = self._wants(now)
                if bits & ~self._told:
                    self._send(self._parent, Want(bits).encode())
                    self._told |= bits
                if self._new_since is not None and not self._told & WANT_NEW:
                    timeout = max(0.0, self._new_since + POLL_SECONDS - now)
        return self._listen(timeout, parent=True)

    def _listen(self, timeout: Optional[float], parent: bool = False) -> bool:
        """Wait once for the wake-up socket, the children and (``parent``) the cycle's start; whether it started."""
        loop = self.loop
        fds = [loop.wake.reader] + [fd for fd, child in self._child_fds.items() if child not in self._early]
        if parent:
            fds.append(self._parent_fd)
        readable = loop.select(fds, buggify.late(timeout, "tree.timer_late") if buggify.ON else timeout)
        if loop.wake.reader in readable:
            loop.wake.drain()
        for fd in readable:
            child = self._child_fds.get(fd)
            if child is not None and child not in self._early:
                frame = self._recv(child, *_UP_OR_WANT)
                if type(frame) is Up:
                    self._early[child] = frame
                else:
                    self._heard[child] = self._heard.get(child, 0) | frame.bits
        if parent and self._parent_fd in readable:
            # The reply to the message we presented starts the cycle too.
            frame = self._recv(self._parent, *(_GO_OR_REPLY if self.presented else _GO_ONLY))
            if type(frame) is Reply:
                self._reply = frame
            return True
        return False

    # -- one cycle -----------------------------------------------------------------------------------------------

    def negotiate(self, state: SetState, shutdown: bool) -> Decision:
        """The global set up and down the tree; any other set as under the star."""
        if state.id != 0:
            return drive_turn(self.loop, self._round, self._round.turn(state, shutdown, self.loop.clock()),
                              state.id, self.name)
        if self.presented:
            self.presented = False      # our subtree's message went up before the cycle
            reply, self._reply = self._reply, None
        else:
            groups, datas = self._subtree(state, shutdown)
            if self._parent is None:
                self._early.clear()
                return self._decide(state, groups, datas)
            if buggify.ON:
                self._relay_slow()
            self._send(self._parent, Up(groups, datas).encode())
            reply = None
        self._early.clear()
        if reply is None:
            reply = self._recv(self._parent, Reply)
        decided = decode_reply(state, reply, self._parent)      # checked before it is passed on
        if self._children:
            if buggify.ON:
                self._relay_slow()
            wire = reply.encode()
            for child in self._children:
                self._send(child, wire)
        return decided

    def _subtree(self, state: SetState, shutdown: bool) -> Tuple[Groups, list]:
        """This rank's message merged with its children's (in the cycle: read now if not in before), and the
        small allreduces' data of the whole subtree."""
        msg = message_and_data(state, shutdown, relay=True)
        groups: Groups = [([self.loop.rank], msg.sent())]
        datas = [(Contributors(self.loop.rank), msg.data)] if msg.data else []
        for child in self._children:
            up = self._early.get(child)
            if up is None:
                up = self._child_groups(child)
            merge(groups, up.groups)
            datas.extend(up.datas)
        if msg.data and self._parent is not None and self._children:
            own = {}
            for name in msg.data:       # (a failure may have dropped the entries meanwhile)
                entry = state.entries.get(name)
                if entry is not None:
                    own[name] = entry.request
            datas = inline.fold_subtree(self.loop.rank, subtree_size(self.loop.rank, self.loop.size), own, datas)
        return groups, datas

    def _child_groups(self, child: int) -> Up:
        """A child's subtree message and data, skipping cycle requests it sent before it saw the cycle start."""
        while True:
            frame = self._recv(child, *_UP_OR_WANT)
            if type(frame) is Up:
                return frame

    def _decide(self, state: SetState, groups: Groups, datas: list) -> Decision:
        size = self.loop.size
        for key, data in datas:
            # A rank's own, or a relay's subtree folded on the way up (its count checked: the sum must hold each
            # rank once).
            if 0 <= key.first < size and (key.count == 1 or (
                    key.first > 0 and key.count == subtree_size(key.first, size))):
                self.held.hold(state.id, key, data)
        seen = sum(len(ranks) for ranks, _ in groups)
        if seen != self.loop.size or len({r for ranks, _ in groups for r in ranks}) != self.loop.size:
            raise HorovodInternalError(f"rank 0 gathered negotiation messages for {seen} ranks of {self.loop.size}")
        batches, stop, reports, arrivals = state.coordinator.step_groups(group_messages(groups), self.loop.clock())
        if batches and log.isEnabledFor(logging.DEBUG):
            log.debug("negotiated (tree): %s", [n for b in batches for r in b for n in r.names])
        decided, reply = reply_with_data(self.held, state, stop, batches)
        wire = reply.encode()
        for child in self._children:
            self._send(child, wire)
        return Decision(decided, stop, reports, arrivals)

    def _relay_slow(self) -> None:
        """(buggify) A relay (a rank with a parent and children) stalls before it forwards, now and then."""
        if self._children and self._parent is not None and buggify.fires("tree.relay_slow"):
            buggify.stall()

    def _send(self, peer: int, frame) -> None:
        self.frames += 1
        self.loop.transport.send_obj(peer, frame)

    def _recv(self, peer: int, *allowed: type):
        self.frames += 1
        return receive(self.loop.transport, peer, *allowed)
