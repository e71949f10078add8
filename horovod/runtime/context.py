"""The one per-process Horovod context: everything a process holds between ``init`` and ``shutdown``.

Held here, below :mod:`basics` and :mod:`process_sets`, so both can reach the live engine without importing each
other. ``init`` installs a :class:`Context` and ``shutdown`` clears it; ``shutdown()`` then ``init()`` builds a fresh
one (elastic training relies on it), with every count restarted, so that ranks of a new round (survivors and
newcomers alike) name their collectives alike. A binding's per-job state (torch's handle map, JAX's pending handles
and trace counts, TensorFlow's last graph error) is a :meth:`Context.binding` object, made on first use and dropped
with the context. The module-level values that outlive a ``shutdown`` on purpose, each with the reason, are the table
"what outlives a job" in ``docs/architecture.md``; ``tests/test_process_state.py`` reads it and fails on any other.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from typing import Callable, Dict, List, Optional, TypeVar

from horovod.common.exceptions import HorovodInternalError
from horovod.common.forks import FORKED, forked

__all__ = ["Context", "Counters", "NOT_INITIALIZED", "FORKED_MESSAGE", "current", "get", "install", "clear",
           "engine", "lock"]

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
FORKED_MESSAGE = ("this process was forked after hvd.init() (a data-loader worker?): its connections are its "
                  "parent's, so it cannot run collectives; run them in the process that called hvd.init(), or call "
                  "hvd.init() in a process started with the 'spawn' method")

lock = threading.RLock()
_State = TypeVar("_State")


class Counters:
    """Numbers for what this process names itself (unnamed tensors, process-set changes), one sequence per key.

    Every rank of a set counts the same collectives in the same order, so the names agree; a fresh context starts
    every sequence at 0 again.
    """

    def __init__(self):
        self._counts: Dict[str, "itertools.count[int]"] = {}
        self._lock = threading.Lock()

    def next(self, key: str) -> int:
        """The next number of sequence ``key`` (0 first)."""
        with self._lock:
            counter = self._counts.get(key)
            if counter is None:
                counter = self._counts[key] = itertools.count()
            return next(counter)


@dataclasses.dataclass
class Context:
    """What ``init`` built for this process; dropped by ``shutdown``, which leaves nothing of it behind."""

    config: object        # horovod.common.config.Config, with dynamic process sets on if init asked for them
    topo: object          # horovod.common.types.Topology: this worker's place in the job
    engine: object        # horovod.core.engine.Engine
    timeline: object = None
    # The user's ProcessSet objects this context gave an id (static and dynamic); shutdown takes the ids back.
    process_sets: List[object] = dataclasses.field(default_factory=list)
    counters: Counters = dataclasses.field(default_factory=Counters)
    pid: int = dataclasses.field(default_factory=os.getpid)     # the process that called init
    # Each binding's per-job state, by binding ("torch", "jax", "tensorflow"): see binding().
    bindings: Dict[str, object] = dataclasses.field(default_factory=dict)

    def binding(self, key: str, factory: Callable[[], _State]) -> _State:
        """Binding ``key``'s state for this job: ``factory()``'s object, made on the first call of the job (so every
        ``init`` starts it afresh) and dropped by ``shutdown`` with the context."""
        state = self.bindings.get(key)
        if state is None:
            state = self.bindings.setdefault(key, factory())    # (two first calls at once: one object wins)
        return state

    @property
    def dynamic_sets(self) -> bool:
        """Whether process sets may be added and removed at run time."""
        return bool(self.config.dynamic_process_sets)

    def foreign(self) -> bool:
        """Whether this process is a child forked after ``init`` (the context, and its connections, are not its)."""
        return forked() and self.pid != os.getpid()

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self.topo.rank

    @property
    def size(self) -> int:
        """The number of ranks in the job."""
        return self.topo.size


_context: Optional[Context] = None


def get() -> Optional[Context]:
    """The live context, or None before ``init`` and after ``shutdown``."""
    return _context


def current() -> Context:
    """The live context.

    Raises:
        ValueError: Horovod is not initialized.
    """
    if _context is None:
        raise ValueError(NOT_INITIALIZED)
    return _context


def install(ctx: Context) -> None:
    """Make ``ctx`` the live context (``init``)."""
    global _context
    _context = ctx


def clear() -> Optional[Context]:
    """Drop the live context and return it (``shutdown``)."""
    global _context
    with lock:
        ctx, _context = _context, None
    return ctx


def engine():
    """The live engine.

    Raises:
        ValueError: Horovod is not initialized.
        HorovodInternalError: the engine has failed (a peer was lost, a collective timed out), or this process
            was forked after ``init``.
    """
    # (Runs once per submitted tensor: the checks of current() and foreign() inline.)
    ctx = _context
    if ctx is None:
        raise ValueError(NOT_INITIALIZED)
    if FORKED[0] and ctx.pid != os.getpid():
        raise HorovodInternalError(FORKED_MESSAGE)
    live = ctx.engine
    if live.error is not None:
        raise HorovodInternalError(live.error)
    return live
