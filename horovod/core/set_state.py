"""What the engine keeps for one process set: its ranks, groups (with shared memory and the hierarchy where they
apply), response cache, coordinator (on the set's first rank, or on every member under peer negotiation), and the
requests waiting to be negotiated; and :class:`ProcessSets`, the sets this rank knows, made and changed alike on every
rank (a change is a negotiated response, executed by every rank in the same cycle)."""

from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from horovod.algorithms.group import Group
from horovod.algorithms.hierarchical import Hierarchy
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType, Request, Response
from horovod.core.coordinator import Coordinator
from horovod.core.ops import Entry
from horovod.core.response_cache import ResponseCache
from horovod.transport import shm

__all__ = ["IDLE", "PENDING", "NEW", "SetState", "ProcessSets", "hierarchy", "shared_memory", "close_segments"]

IDLE, PENDING, NEW = 0, 1, 2   # how urgently a rank needs a cycle: nothing, answers awaited, requests to negotiate


class SetState:
    """Everything the engine keeps for one process set."""

    def __init__(self, set_id: int, ranks: Sequence[int], rank: int, transport, config, may_spin=None,
                 every_member_coordinates: bool = False, track_arrivals: bool = True):
        self.id = set_id
        self.ranks = tuple(ranks)
        self.index = self.ranks.index(rank) if rank in self.ranks else -1
        self.group = Group(self.ranks, self.index, transport,
                           shared_memory(f"s{set_id}", self.ranks, self.index, transport, config, may_spin),
                           hierarchy(set_id, self.ranks, self.index, transport, config, may_spin)) \
            if self.index >= 0 else None
        self.cache = ResponseCache(config.cache_capacity)
        coordinates = self.index == 0 or (every_member_coordinates and self.index >= 0)
        self.coordinator = Coordinator(
            self.ranks, self.cache, config.fusion_threshold, config.disable_group_fusion,
            config.stall_check_time_seconds, config.stall_shutdown_time_seconds,
            not config.stall_check_disable, track_arrivals) if coordinates else None
        self.last_requests: Dict[str, Request] = {}
        self.queue: List[Request] = []
        self.entries: Dict[str, Entry] = {}
        self.lock = threading.Lock()
        self.removed = False

    def describe_pending(self) -> str:
        """What this rank waits to negotiate in this set, as a busy peer's warning names it."""
        names = list(self.entries)
        if not names:
            return "the negotiation of the next collective"
        shown = ", ".join(repr(name) for name in names[:4]) + (" ..." if len(names) > 4 else "")
        return f"the negotiation of {shown}"

    def drain(self) -> List[Request]:
        """Take the requests queued since the last call (they go into this cycle's message)."""
        with self.lock:
            requests, self.queue = self.queue, []
        return requests


class ProcessSets:
    """The process sets this rank knows, by id (``by_id``, changed only by the loop, between cycles)."""

    def __init__(self, rank: int, transport, config, may_spin: Optional[Callable[[], bool]] = None,
                 every_member_coordinates: bool = False, track_arrivals: bool = False):
        self.by_id: Dict[int, SetState] = {}
        self._next_id = 1
        self._rank, self._transport, self._config, self._may_spin = rank, transport, config, may_spin
        self._every_member_coordinates = every_member_coordinates
        self._track_arrivals = track_arrivals

    def add(self, set_id: int, ranks: Sequence[int]) -> None:
        """Register set ``set_id`` (a static set, known to every rank before the loop starts)."""
        state = SetState(set_id, ranks, self._rank, self._transport, self._config, self._may_spin,
                         self._every_member_coordinates, self._track_arrivals)
        self.by_id[set_id] = state
        self._next_id = max(self._next_id, set_id + 1)

    def add_new(self, ranks: Tuple[int, ...]) -> int:
        """Register a set made at run time; returns its id, or ``-id - 1`` of the set that has these ranks already."""
        for set_id, state in self.by_id.items():
            if state.ranks == ranks:
                return -set_id - 1
        set_id = self._next_id
        self.add(set_id, ranks)
        return set_id

    def remove(self, set_id: int) -> bool:
        """Unregister set ``set_id`` (never the global set): its pending collectives fail, its segments close."""
        removed = self.by_id.pop(set_id, None) if set_id > 0 else None
        if removed is None:
            return False
        with removed.lock:
            removed.removed = True
            entries, removed.entries = removed.entries, {}
        for entry in entries.values():
            entry.handle.set_exception(HorovodInternalError(f"process set {set_id} was removed"))
        close_segments(removed)
        return True

    def apply(self, response: Response, forget: Callable[[int], None]):
        """Add or remove a process set, as every rank does in this cycle (``forget`` tells the negotiation of a
        removed one); the result is the caller's answer."""
        ranks = tuple(response.payload or ())
        if response.op == OpType.ADD_PROCESS_SET:
            return self.add_new(ranks)
        set_id = ranks[0] if ranks else -1
        forget(set_id)
        return self.remove(set_id)

    def set_fusion_threshold(self, fusion_threshold: int) -> None:
        """Every coordinator of this rank plans fusion up to ``fusion_threshold`` bytes (autotune's choice)."""
        for state in list(self.by_id.values()):
            if state.coordinator is not None:
                state.coordinator.set_fusion_threshold(fusion_threshold)

    def work(self) -> int:
        """NEW when requests of this rank wait to be negotiated, PENDING when only answers are awaited, else IDLE."""
        pending = IDLE
        for state in self.by_id.values():
            if state.index >= 0:
                if state.queue:
                    return NEW
                if state.entries:
                    pending = PENDING
        return pending

    def fail_all(self, message: str) -> None:
        """Fail every pending and queued collective of every set with HorovodInternalError(``message``)."""
        for state in list(self.by_id.values()):
            with state.lock:
                entries, state.entries, state.queue = state.entries, {}, []
            for entry in entries.values():
                entry.handle.set_exception(HorovodInternalError(message))


def hierarchy(set_id: int, ranks: Sequence[int], index: int, transport, config, may_spin=None):
    """Local and cross groups for hierarchical allreduce, when asked for and the set spans several hosts."""
    if not config.hierarchical_allreduce or index < 0 or transport is None or not transport.hostnames:
        return None
    hosts = [transport.hostnames[r] for r in ranks]
    order = list(dict.fromkeys(hosts))
    if len(order) < 2:
        return None
    mine = hosts[index]
    local_ranks = tuple(r for r, h in zip(ranks, hosts) if h == mine)
    local_index = local_ranks.index(ranks[index])
    host_index = order.index(mine)
    local = Group(local_ranks, local_index, transport,
                  shared_memory(f"s{set_id}h{host_index}", local_ranks, local_index, transport, config, may_spin))
    leaders = tuple(next(r for r, h in zip(ranks, hosts) if h == host) for host in order)
    cross = Group(leaders, leaders.index(ranks[index]), transport) if ranks[index] in leaders else None
    return Hierarchy(local, cross)


def close_segments(state: "SetState") -> None:
    """Unmap the set's shared-memory segments, if it has any."""
    if state.group is not None:
        for segments in (state.group.shm, state.group.hierarchy and state.group.hierarchy.local.shm):
            if segments is not None:
                segments.close()


def shared_memory(tag: str, ranks: Sequence[int], index: int, transport, config, may_spin=None):
    """Shared-memory segments for a set whose ranks all live on this host (unless HOROVOD_SHM_DISABLE)."""
    if index < 0 or len(ranks) < 2 or transport is None or config.shm_disable or not shm.available():
        return None
    hosts = {transport.hostnames[r] for r in ranks} if transport.hostnames else {None, ""}
    if len(hosts) != 1:
        return None
    prefix = f"hvdpy-{shm.job_token(transport.secret, transport.job_token)}-{tag}"
    return shm.ShmSegments(transport, ranks, index, prefix, config.shm_min_bytes,
                           shm.spin_seconds(len(ranks), config.spin_us),
                           may_spin)
