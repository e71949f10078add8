"""What the engine keeps for one process set: its ranks, groups (with shared memory and the hierarchy where they
apply), response cache, coordinator (on the set's first rank, or on every member under peer negotiation), and the
requests waiting to be negotiated."""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from horovod.algorithms.group import Group
from horovod.algorithms.hierarchical import Hierarchy
from horovod.common.types import Request, Response
from horovod.core.controller import Coordinator
from horovod.core.ops import Entry
from horovod.core.response_cache import ResponseCache
from horovod.transport import shm


class SetState:
    """Everything the engine keeps for one process set."""

    def __init__(self, set_id: int, ranks: Sequence[int], rank: int, transport, config, may_spin=None,
                 every_member_coordinates: bool = False):
        self.id = set_id
        self.ranks = tuple(ranks)
        self.index = self.ranks.index(rank) if rank in self.ranks else -1
        self.group = Group(self.ranks, self.index, transport,
                           shared_memory(f"s{set_id}", self.ranks, self.index, transport, config, may_spin),
                           hierarchy(set_id, self.ranks, self.index, transport, config, may_spin)) \
            if self.index >= 0 else None
        self.cache = ResponseCache(config.cache_capacity)
        self.coordinator = Coordinator(
            self.ranks, self.cache, config.fusion_threshold, config.disable_group_fusion,
            config.stall_check_time_seconds, config.stall_shutdown_time_seconds,
            not config.stall_check_disable) if self.index == 0 or (every_member_coordinates and self.index >= 0) \
            else None
        self.last_requests: Dict[str, Request] = {}
        self.queue: List[Request] = []
        self.entries: Dict[str, Entry] = {}
        self.lock = threading.Lock()
        self.removed = False
        # Peer negotiation: small allreduces' data that came with the members' frames, by name and member position,
        # until the tensor is executed (or fails).
        self.inline: Dict[str, Dict[int, bytes]] = {}

    def hold_inline(self, position: int, data: Dict[str, bytes]) -> None:
        for name, contribution in data.items():
            self.inline.setdefault(name, {})[position] = contribution

    def split_inline(self, batch: Sequence[Response]
                     ) -> Tuple[List[Response], Optional[List[bytes]], List[Response]]:
        """Split a batch of single-tensor allreduces into those every member sent data for, to fold, and the rest,
        for the ordinary path; the held data of all of them is forgotten. Every member splits alike (the data came
        with frames that every member received). Returns (folded, each member's contributions to all of them
        concatenated in order, rest)."""
        size = len(self.ranks)
        folded: List[Response] = []
        rest: List[Response] = []
        complete: List[Dict[int, bytes]] = []
        for response in batch:
            held = self.inline.pop(response.names[0], None)
            if held is not None and len(held) == size:
                folded.append(response)
                complete.append(held)
            else:
                rest.append(response)
        if not folded:
            return folded, None, rest
        if len(complete) == 1:
            return folded, [complete[0][p] for p in range(size)], rest
        return folded, [b"".join(h[p] for h in complete) for p in range(size)], rest

    def drop_inline(self, names: Sequence[str]) -> None:
        for name in names:
            self.inline.pop(name, None)

    def drain(self) -> List[Request]:
        with self.lock:
            requests, self.queue = self.queue, []
        return requests


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
    return shm.ShmSegments(transport, ranks, index, prefix, config.shm_min_bytes, shm.spin_seconds(len(ranks)),
                           may_spin)
