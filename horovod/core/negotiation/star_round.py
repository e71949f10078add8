"""One process set's round under the star, as a state machine: the set's first rank gathers every member's message,
decides and replies; every other member sends its message and reads the reply.

The star's rank 0 and followers run it for every set in the cycle (:mod:`horovod.core.negotiation.star`), and the
tree for every set but the global one (:mod:`horovod.core.negotiation.tree`). Like the protocols it belongs to, it
never touches a socket or a clock: :meth:`StarRound.turn` and :meth:`StarRound.frame` return actions
(:mod:`horovod.core.negotiation.events`), with ``listening`` the one member it reads next (in rank order, as the
coordinator folds them) and ``expects`` the kinds of frame it takes from it.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.core import fusion
from horovod.core.decision import Contributors, Decision, Message
from horovod.core.negotiation import inline
from horovod.core.negotiation.base import Batch
from horovod.core.negotiation.events import Execute, Send, send_to_each
from horovod.core.negotiation.frames import Msg, Reply, Want
from horovod.core.response_cache import split_hits
from horovod.core.set_state import SetState

__all__ = ["StarRound", "decode_reply", "message_and_data", "reply_with_data", "relayed"]

log = logging.getLogger("horovod")

_MSG_OR_WANT = (Msg, Want)
_REPLY = (Reply,)


def decode_reply(state: SetState, reply: Reply, sender: int) -> Decision:
    """A coordinator's reply as the batches to execute (cached responses looked up by their bits).

    Raises:
        HorovodInternalError: the reply names a bit this rank's cache does not hold.
    """
    cache = state.cache
    try:
        batches = [[cache.response(r) if type(r) is int else r for r in batch] for batch in reply.batches]
    except KeyError as exc:
        raise HorovodInternalError(f"rank {sender}'s negotiation reply names a response this rank's cache does "
                                   f"not hold: {exc}") from None
    results = reply.results
    if results is None:
        return Decision([Batch(batch) for batch in batches], reply.stop)
    return Decision([Batch(batch, None, folded) for batch, folded in zip(batches, results)], reply.stop)


def message_and_data(state: SetState, shutdown: bool, relay: bool) -> Msg:
    """This rank's message for ``state`` (cached requests as bits) and, with ``relay``, its small allreduces' data."""
    requests = state.drain()
    hits, full = split_hits(state.cache, state.last_requests, requests)
    return Msg(shutdown, tuple(hits), tuple(full), relayed(state, requests) if relay else {})


def relayed(state: SetState, requests) -> Dict[str, bytes]:
    """The data of ``requests`` a star message may carry (within the relay budget of the set's size)."""
    return inline.collect(requests, state.entries, inline.relayed_budget(len(state.ranks)))[0]


def reply_with_data(held: inline.HeldData, state: SetState, stop: bool, batches) -> Tuple[List[Batch], Reply]:
    """The decided batches, those whose every member's data is ``held`` split off and folded here, and the reply
    that tells the others (cached responses as bits, the results of the folded batches)."""
    decided = held.batches(state.id, len(state.ranks), batches)
    results: List[Optional[bytes]] = [None] * len(decided)
    for i, batch in enumerate(decided):
        if batch.contributions is not None:
            results[i] = inline.fold(fusion.merge(batch.responses), batch.contributions, partial=batch.partial,
                                     members=len(state.ranks)).tobytes()
            decided[i] = Batch(batch.responses, None, results[i])
    cached_bit = state.cache.cached_bit
    items = [[_bit_or_response(r, cached_bit(r)) for r in batch.responses] for batch in decided]
    return decided, Reply(stop, items, results if any(r is not None for r in results) else None)


def _bit_or_response(response, bit: Optional[int]):
    return response if bit is None else bit


class StarRound:
    """One set's negotiation in one cycle, from this rank's side: coordinate (the set's first rank) or follow."""

    def __init__(self, held: inline.HeldData):
        self.held = held                # small allreduces' data that came with the messages (a set's first rank)
        self.listening: Tuple[int, ...] = ()
        self.expects: tuple = _MSG_OR_WANT
        self._state: Optional[SetState] = None      # the set whose round runs
        self._messages: Optional[List[Message]] = None  # (coordinating) every member's message so far, by position
        self._early: Optional[Dict[int, Msg]] = None    # (coordinating) messages that came before the cycle
        self._out: List = []

    def turn(self, state: SetState, shutdown: bool, now: float, early: Optional[Dict[int, Msg]] = None,
             answered: Tuple[bool, Optional[Reply]] = (False, None)) -> List:
        """Begin the set's round. Coordinating, ``early`` holds the members' messages that came before the cycle
        (taken from it as they are used); following, ``answered`` says whether this rank's message went out before
        the cycle and the reply that came with the cycle's start, if one did."""
        out = self._out
        out.clear()
        self._state = state
        if state.coordinator is not None:
            requests = state.drain()
            hits, full = split_hits(state.cache, state.last_requests, requests)
            self._messages = [Message(shutdown, tuple(hits), tuple(full))]
            if state.id == 0:    # this rank's own small allreduces' data, held with the others'
                self.held.hold(0, Contributors(0), relayed(state, requests))
            self._early, self.expects = early, _MSG_OR_WANT
            return self._gather(now, out)
        self._messages = None
        sent, reply = answered
        coordinator = state.ranks[0]
        if not sent:
            out.append(Send((coordinator,), message_and_data(state, shutdown, state.id == 0).encode()))
        if reply is None:
            self.listening, self.expects = (coordinator,), _REPLY
            return out
        return self._follow(reply, out)

    def frame(self, peer: int, frame, now: float) -> List:
        """The frame read from the member this round listens to."""
        out = self._out
        out.clear()
        if self._messages is None:
            return self._follow(frame, out)
        if type(frame) is Want:
            return out      # a cycle request sent before its sender saw the cycle start: this cycle answers it
        state = self._state
        self._messages.append(self._hold(state, len(self._messages), frame))
        return self._gather(now, out)

    def _gather(self, now: float, out: List) -> List:
        state, messages, early = self._state, self._messages, self._early
        ranks = state.ranks
        while len(messages) < len(ranks):
            position = len(messages)
            peer = ranks[position]
            if early is None or peer not in early:
                self.listening = (peer,)
                return out
            messages.append(self._hold(state, position, early.pop(peer)))
        batches, stop, reports, arrivals = state.coordinator.step(messages, now)
        if batches and log.isEnabledFor(logging.DEBUG):
            log.debug("negotiated (star) in set %d: %s", state.id, [n for b in batches for r in b for n in r.names])
        decided, reply = reply_with_data(self.held, state, stop, batches)
        send_to_each(ranks[1:], reply.encode(), "star.reply_slow", out)
        self._state = self._messages = self._early = None
        self.listening = ()
        out.append(Execute(Decision(decided, stop, reports, arrivals)))
        return out

    def _follow(self, reply: Reply, out: List) -> List:
        state = self._state
        self._state = None
        self.listening = ()
        out.append(Execute(decode_reply(state, reply, state.ranks[0])))
        return out

    def _hold(self, state: SetState, position: int, msg: Msg) -> Message:
        """``msg``'s message; the allreduce data it carries is held for folding (global set only)."""
        if msg.data and state.id == 0:
            self.held.hold(state.id, Contributors(position), msg.data)
        return msg.message
