"""The pump: the one piece of code that runs a sans-I/O negotiation protocol over a loop and its transport.

A protocol (:mod:`horovod.core.negotiation.events`) decides; the pump does what it decides. It waits in
``loop.select`` (so that the engine may lend the loop to a waiting caller meanwhile, and the simulation waits in
virtual time) on the wake-up socket and the peers the protocol listens to, for at most its timeout; then it reads one
frame per readable peer, in the protocol's reading order, and asks the protocol again. It sends, stalls and tells the
transport of silent peers as the protocol's actions say.

The loop may run on another thread while this one waits (a caller lent the loop): so nothing read before a wait is
trusted after it. What the protocol listens to is read again, and a peer it no longer listens to is not read (its
next frame belongs to a later cycle). A :class:`Pumped` negotiation is a :class:`~horovod.core.negotiation.base.
Negotiation` to the engine, so the engine does not know whether a protocol is pumped.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from horovod.common.exceptions import HorovodInternalError
from horovod.core import buggify
from horovod.core.decision import Decision
from horovod.core.negotiation.base import Loop, Negotiation
from horovod.core.negotiation.events import BEGIN, Begin, Drain, Execute, Heard, Send, Silent, Stall
from horovod.core.negotiation.frames import receive
from horovod.core.set_state import SetState

__all__ = ["Pumped", "drive_turn", "perform", "patience"]


def patience(loop: Loop) -> float:
    """How long a peer may stay silent before the transport hears of it: its timeout (0 without a transport: never)."""
    return loop.transport.timeout if loop.transport is not None else 0.0


class Pumped(Negotiation):
    """A state-machine protocol behind the engine's two calls, ``await_cycle`` and ``negotiate``."""

    def __init__(self, loop: Loop, protocol):
        super().__init__(loop)
        self.protocol = protocol
        self.name = protocol.name
        self.every_member_coordinates = protocol.every_member_coordinates
        self._fd: Dict[int, int] = {}           # peer -> its connection's descriptor
        self._peer: Dict[int, int] = {}         # ... and back

    @property
    def frames(self) -> int:
        """Control frames the protocol read and wrote, where it counts them (the tree), else 0."""
        return self.protocol.frames

    @property
    def presented(self) -> bool:
        """This rank's messages for the coming cycle are out (the engine's poll rule asks)."""
        return self.protocol.presented

    def start(self) -> None:
        """The connections are up: learn the descriptor of every peer the protocol may listen to."""
        transport = self.loop.transport
        self._fd = {peer: transport.fileno(peer) for peer in self.protocol.peers()}
        self._peer = {fd: peer for peer, fd in self._fd.items()}

    def wake_on_wait(self) -> bool:
        """The protocol's answer: whether a thread starting to wait must wake the loop."""
        return self.protocol.wake_on_wait()

    def forget(self, set_id: int) -> None:
        """A process set was removed."""
        self.protocol.forget(set_id)

    def await_cycle(self) -> None:
        """Perform what the protocol asks and wait for what it listens to, until it begins a cycle.

        Raises:
            HorovodInternalError: a peer was lost, or sent something malformed or unexpected.
        """
        loop, protocol = self.loop, self.protocol
        wake = loop.wake
        while True:
            actions = protocol.woken(loop.clock())
            if actions and (actions[0] is BEGIN or perform(loop, actions, self.name)):     # (BEGIN comes last)
                protocol.began(loop.clock())
                return
            fds = self._fd
            readable = loop.select([wake.reader] + [fds[peer] for peer in protocol.listening], protocol.timeout)
            for fd in readable:
                if fd is wake.reader:
                    wake.drain()
                    continue
                peer = self._peer[fd]
                if peer in protocol.listening:      # (a caller may have run the loop meanwhile: look again)
                    actions = protocol.frame(peer, _receive(loop, protocol, peer), loop.clock())
                    if actions and (actions[0] is BEGIN or perform(loop, actions, self.name)):  # (most: taken in)
                        protocol.began(loop.clock())
                        return

    def negotiate(self, state: SetState, shutdown: bool) -> Decision:
        """The protocol's decision for ``state``, reading the peers it listens to (in order, blocking) until then."""
        protocol = self.protocol
        if protocol.decides_at_once:    # (the peer protocol: every member decides from the frames in, sends nothing)
            return protocol.decide(state, shutdown)
        return drive_turn(self.loop, protocol, protocol.turn(state, shutdown, self.loop.clock()), state.id, self.name)


def drive_turn(loop: Loop, part, actions: List, set_id: int, name: str) -> Decision:
    """Perform ``actions`` (what ``part`` answered a turn with) and read the peer ``part`` listens to (in order,
    blocking: the loop is not lent in a cycle), handing it each frame, until it decides."""
    while True:
        decision = perform(loop, actions, name) if actions else None
        if decision is not None:
            return decision
        if not part.listening:
            raise HorovodInternalError(f"rank {loop.rank}: the {name} negotiation of process set {set_id} neither "
                                       f"decided nor waits for a peer")
        peer = part.listening[0]
        actions = part.frame(peer, _receive(loop, part, peer), loop.clock())


def _receive(loop: Loop, part, peer: int):
    """``peer``'s next frame, of a kind ``part`` expects from it (one tuple for every peer, or one per peer)."""
    kinds = part.expects
    return receive(loop.transport, peer, *(kinds[peer] if type(kinds) is dict else kinds))


def perform(loop: Loop, actions: List, name: str) -> Optional[object]:
    """Do ``actions`` in order; the decision of an :class:`Execute`, True for a :class:`Begin`, else None."""
    transport = loop.transport
    outcome = None
    for action in actions:
        kind = type(action)
        if kind is Send:
            wire = action.wire
            for peer in action.peers:
                transport.send_obj(peer, wire)
        elif kind is Begin:
            outcome = True
        elif kind is Execute:
            outcome = action.decision
        elif kind is Drain:
            loop.wake.drain()
        elif kind is Stall:
            buggify.pause(action.seconds)
        elif kind is Silent:
            transport.waiting(action.peer, action.seconds)
        elif kind is Heard:
            transport.resumed()
        else:
            raise TypeError(f"the {name} negotiation asked for an unknown action {action!r:.80}")
    return outcome
