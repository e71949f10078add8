"""Planted bugs in the real protocol code, for the test that shows the seed sweep catches each (issue 46, item 6).

Each mutant patches a copy of one function of the negotiation (:mod:`horovod.core.negotiation.star`, ``star_round``,
``tree``, ``inline``, :mod:`horovod.core.coordinator`) into every module that calls it for the length of a
``with planted(name):`` block, and restores it after: the kinds of bug a real change can bring in, not a hook in the
simulator. Nothing in ``horovod/core`` knows of them; a production process never imports this module.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Tuple

from horovod.core import coordinator as coordinator_module
from horovod.core.negotiation import inline, star, star_round, tree

__all__ = ["MUTANTS", "planted"]

_REAL = {"message_and_data": star.message_and_data, "decode_reply": star.decode_reply,
         "_fold_joined": inline._fold_joined, "_ready": coordinator_module.Coordinator._ready}


def _me(state) -> int:
    return state.ranks[state.index]


def _lost_message() -> List[Tuple[object, str, Callable]]:
    """A follower's message loses the requests it drained (once per job: the last rank's first in full)."""
    lost = []

    def message_and_data(state, shutdown, relay):
        msg = _REAL["message_and_data"](state, shutdown, relay)
        if msg.requests and not lost and _me(state) == state.ranks[-1]:
            lost.append(msg)
            return msg._replace(requests=(), data={})
        return msg
    return [(module, "message_and_data", message_and_data) for module in (star, star_round, tree)]


def _decoded(change: Callable) -> List[Tuple[object, str, Callable]]:
    def decode_reply(state, reply, sender):
        decision = _REAL["decode_reply"](state, reply, sender)
        return decision._replace(batches=change(state, reply, list(decision.batches)))
    return [(module, "decode_reply", decode_reply) for module in (star, star_round, tree)]


def _reordered(state, reply, batches):
    """The last rank of a set runs a reply's batches in reverse order."""
    return batches[::-1] if _me(state) == state.ranks[-1] else batches


def _cache_groups(state, reply, batches):
    """On a cache hit (a batch of bits only), a follower forms the fused batch in reverse order."""
    return [batch._replace(responses=batch.responses[::-1])
            if len(raw) > 1 and all(type(item) is int for item in raw) else batch
            for raw, batch in zip(reply.batches, batches)]


def _up(change: Callable) -> List[Tuple[object, str, Callable]]:
    """A tree's relay folds its subtree's contributions (``inline._fold_joined``, used on the way up only) with
    ``change`` applied to the list of contributions (and to their keys alike)."""
    def _fold_joined(dtype, reduce_op, prescale, keys, joined):
        return _REAL["_fold_joined"](dtype, reduce_op, prescale, change(list(keys)), change(list(joined)))
    return [(inline, "_fold_joined", _fold_joined)]


def _answered_early() -> List[Tuple[object, str, Callable]]:
    """The coordinator answers a name once all but one member submitted it (the last one's is still on its way)."""
    def _ready(self):
        for name, got in list(self._pending.items()):
            if len(got) == self.size - 1 and self.size > 2 and not self._joined:
                got[next(i for i in range(self.size) if i not in got)] = next(iter(got.values()))
        return _REAL["_ready"](self)
    return [(coordinator_module.Coordinator, "_ready", _ready)]


MUTANTS: Dict[str, Callable[[], List[Tuple[object, str, Callable]]]] = {
    "message lost": _lost_message,
    "answered early": _answered_early,
    "batches reordered": lambda: _decoded(_reordered),
    "contribution counted twice on the way up": lambda: _up(lambda d: d + d[-1:] if len(d) > 1 else d),
    "contribution lost on the way up": lambda: _up(lambda d: d[:-1] if len(d) > 1 else d),
    "groups formed wrongly on cache hits": lambda: _decoded(_cache_groups),
}


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """Run the block with mutant ``name`` patched into the protocol code."""
    patches = MUTANTS[name]()
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    try:
        for owner, attr, replacement in patches:
            setattr(owner, attr, replacement)
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)
