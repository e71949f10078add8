"""BUGGIFY (as FoundationDB calls it): named fault points inside the real engine and negotiation, off in every real job.

A point is a place in the real code where the system is allowed to behave worse than usual while staying within what
its protocol promises: a frame held to the last moment a bound allows, a relay slow to forward, a cycle started
before it is useful, a timer firing late. Only the simulation turns points on (:func:`enabled`, from its seed), so
that seeds explore the corners a real job reaches only under load; a point never drops, copies or corrupts data
(those are the network's faults and the planted bugs of :mod:`horovod.tools.simulate.mutants`).

A point costs a real job one check of the module-level :data:`ON` (False unless a simulation runs)::

    if buggify.ON and buggify.fires("peer.frame_held"):
        ...     # the worse-but-allowed behaviour

Under :func:`enabled`, each point is on for the seed or not (half of them, drawn), and an enabled point fires at each
check with a chance drawn for the seed, so that different seeds explore different points; :data:`POINTS` lists them
(``docs/scaling-notebook.md``, "Faults inside the real code", says what each does and why the protocol must tolerate
it), and :func:`fired` counts what fired. Nothing turns a point on from the environment.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from typing import Callable, Dict, Iterator, Optional, Tuple

__all__ = ["ON", "POINTS", "STALL_SECONDS", "LATE_SECONDS", "enabled", "fires", "fired", "chances", "uniform", "stall",
           "pause", "late", "held"]

ON = False      # the one check a real job pays; only enabled() sets it

# Every point, by name (``protocol.what``): what it does when it fires. A name a call site checks must be here.
POINTS: Dict[str, str] = {
    "peer.frame_held": "a peer frame due at once (a caller waits) is held until the batch spacing since its first "
                       "request ran out",
    "peer.frame_early": "a peer frame due later (after the batch spacing or the poll interval) goes out now",
    "peer.broadcast_slow": "the rank stalls between sending its frame to one peer and to the next",
    "peer.timer_late": "the peer loop's timer (batch spacing, poll interval) fires late",
    "star.message_held": "a follower's early message, due at once (a caller waits), is held until the batch spacing "
                         "since its first request ran out",
    "star.cycle_early": "rank 0 starts a cycle before one is useful (before everything it waits for is announced, "
                        "or before the spacing or the poll interval ran out)",
    "star.reply_slow": "rank 0 stalls between sending its reply to one follower and to the next",
    "star.timer_late": "a star rank's timer (batch spacing, announced poll, poll interval) fires late",
    "tree.relay_slow": "a relay stalls before forwarding its subtree's message up, or the reply down",
    "tree.cycle_early": "the tree's root starts a cycle before one is due (the spacing, the poll interval)",
    "tree.timer_late": "a tree rank's timer (batch spacing, poll interval) fires late",
    "execution.slow": "execution stalls before running a decided batch (a slow kernel, a pause of the process)",
}

STALL_SECONDS = 0.005       # the longest stall a point adds (a process descheduled, a slow kernel)
LATE_SECONDS = 0.05         # the most a timer fires late (a loaded machine's scheduler)

_rng: Optional[random.Random] = None
_chances: Dict[str, float] = {}
_fired: Counter = Counter()
_holding: Dict[Tuple[int, str], float] = {}     # (owner's id, point) -> until when what it holds is held
_stall: Callable[[float], None] = time.sleep


def fires(name: str) -> bool:
    """Whether point ``name`` fires now (call only when :data:`ON`): an enabled point, drawn at its seed's chance.

    Raises:
        KeyError: ``name`` is not a point (a typo at a call site).
    """
    if name not in POINTS:
        raise KeyError(f"no buggify point {name!r}")
    chance = _chances.get(name)
    if chance is None or _rng.random() >= chance:
        return False
    _fired[name] += 1
    return True


def uniform(upto: float) -> float:
    """A magnitude for a point that fired: uniform in [0, ``upto``), from the seed."""
    return _rng.random() * upto


def stall(upto: float = STALL_SECONDS) -> None:
    """Stall the running rank for up to ``upto`` seconds (drawn): the simulation charges its virtual CPU."""
    _stall(uniform(upto))


def pause(seconds: float) -> None:
    """Stall the running rank for ``seconds``, drawn earlier by a protocol (its :class:`~horovod.core.negotiation.
    events.Stall` action)."""
    _stall(seconds)


def late(timeout: Optional[float], name: str) -> Optional[float]:
    """``timeout`` for a wait, made later by up to :data:`LATE_SECONDS` when point ``name`` fires (call only when
    :data:`ON`); a wait without a timeout, or one that does not wait, is left alone."""
    if timeout is not None and timeout > 0 and fires(name):
        return timeout + uniform(LATE_SECONDS)
    return timeout


def held(owner, name: str, until: float, now: float) -> bool:
    """Whether what ``owner`` would send now is held until ``until``, the last moment its bound allows: once point
    ``name`` fired for it (``until`` tells one thing held from the next), it stays held until then (call only when
    :data:`ON`)."""
    key = (id(owner), name)
    if now >= until:
        _holding.pop(key, None)
        return False
    if _holding.get(key) == until:
        return True
    if fires(name):
        _holding[key] = until
        return True
    return False


def fired() -> Dict[str, int]:
    """How often each point fired since :func:`enabled` began (the last run's, once it ended)."""
    return dict(_fired)


def chances() -> Dict[str, float]:
    """The enabled points and their chance per check (empty when off)."""
    return dict(_chances)


@contextlib.contextmanager
def enabled(seed: int, stall: Callable[[float], None], points=None) -> Iterator[Dict[str, float]]:
    """Turn points on for the length of the block, drawn from ``seed`` (the same seed, the same points, chances and
    draws); ``stall(seconds)`` stalls the running rank (the simulation's virtual CPU). ``points`` (names) enables
    exactly those, each at a chance drawn from the seed, instead of drawing which. Yields the enabled points' chances.

    Raises:
        RuntimeError: points are on already (one simulation at a time).
    """
    global ON, _rng, _stall
    if ON:
        raise RuntimeError("buggify points are on already")
    rng = random.Random(seed * 1_000_003 + 46_005)
    chosen: Dict[str, float] = {}
    for name in sorted(POINTS):
        on, chance = rng.random() < 0.5, rng.choice((0.05, 0.2, 0.5))
        if (name in points) if points is not None else on:
            chosen[name] = chance
    unknown = set(points or ()) - set(POINTS)
    if unknown:
        raise KeyError(f"no buggify points {sorted(unknown)}")
    _chances.clear()
    _chances.update(chosen)
    _fired.clear()
    _holding.clear()
    _rng, _stall, ON = rng, stall, True
    try:
        yield dict(chosen)
    finally:
        ON = False
        _rng, _stall = None, time.sleep
        _chances.clear()
        _holding.clear()
