"""What a negotiation protocol asks of the I/O around it: the actions its handlers return.

A protocol written as a state machine (sans I/O) never selects, sleeps, reads a clock or touches a transport. A driver
hands it what happened, with the time (``now``, seconds on the driver's clock), through its handlers:

- ``woken(now)``: after every wait, whatever ended it (a wake-up of the engine, frames delivered, the timeout): the
  protocol looks at everything again, as today's loops do on each wake-up;
- ``frame(peer, frame, now)``: one control frame from a peer it listens to, already decoded by
  :func:`horovod.core.negotiation.frames.receive` with the kinds the protocol ``expects`` (one tuple, or a tuple
  per peer where peers play different parts, as the tree's parent and children do; a frame that starts the
  cycle, such as the star's GO, returns :data:`BEGIN` itself);
- ``began(now)``: the driver performed the actions that ended in :data:`BEGIN` (the cycle's start, for the protocol's
  own pacing);
- ``turn(state, shutdown, now)``: the running cycle reached a process set; the protocol answers with
  :class:`Execute`, at once or after more frames (a protocol whose ``decides_at_once`` is true sends and reads
  nothing in a turn: the pump may call its ``decide(state, shutdown)`` for the decision itself).

Each handler returns the actions to perform, in order, from one list the protocol reuses (a driver performs them
before it calls again). Between calls the protocol's ``listening`` (the peers whose next frame may be read, in
reading order) and ``timeout`` (how long after the ``now`` it was last given to call ``woken`` if nothing else
happens; None: no limit) say what the driver waits for: standing interest, not one-shot orders, so a wait costs no
object on the hot path. A malformed frame or a broken rule is raised from the handler as :class:`HorovodInternalError`, as before.

Between a cycle's last :class:`Execute` and the next ``woken``, a protocol listens only to frames it would take as
the next cycle's (the peer protocol: every peer's next frame) or to none (the star and the tree end a cycle with
``listening`` empty): the engine may lend the loop to a waiting caller, and a thread that slept through the caller's
cycles hands the protocol what it found readable before it calls ``woken`` again.

:mod:`horovod.core.negotiation.pump` runs protocols over a real loop (or the simulation's); a unit test can run them
with nothing but these records and a list for the network (tests/test_protocol_peer.py).
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

from horovod.core import buggify
from horovod.core.decision import Decision

__all__ = ["Send", "Stall", "Silent", "Heard", "Drain", "Begin", "Execute", "HEARD", "DRAIN", "BEGIN",
           "send_to_each"]


class Send(NamedTuple):
    """Send one encoded control frame to each of ``peers``, in turn."""

    peers: Tuple[int, ...]
    wire: tuple


class Stall(NamedTuple):
    """Stall the rank for ``seconds`` (only a fault point of :mod:`horovod.core.buggify` asks this)."""

    seconds: float


class Silent(NamedTuple):
    """Tell the transport that ``peer`` has been silent for ``seconds`` while this rank waits for it (the patience
    warning and bound of :mod:`horovod.transport.patience`)."""

    peer: int
    seconds: float


class Heard(NamedTuple):
    """Every peer reported silent has been heard from again."""


class Drain(NamedTuple):
    """Forget the engine's pending wake-ups: the cycle that begins looks at everything anyway."""


class Begin(NamedTuple):
    """The next cycle starts on this rank: the engine runs it (each process set's ``turn``)."""


class Execute(NamedTuple):
    """What this rank executes for the process set of the last ``turn``."""

    decision: Decision


HEARD = Heard()
DRAIN = Drain()
BEGIN = Begin()


def send_to_each(peers: Tuple[int, ...], wire: tuple, point: str, out: list) -> None:
    """Append to ``out`` what sends ``wire`` to every one of ``peers``: one :class:`Send` in a real job; under the
    simulation's fault points, one per peer with a :class:`Stall` between two sends whenever ``point`` fires."""
    if not buggify.ON:
        out.append(Send(peers, wire))
        return
    for i, peer in enumerate(peers):
        if i and buggify.fires(point):
            out.append(Stall(buggify.uniform(buggify.STALL_SECONDS)))
        out.append(Send((peer,), wire))
