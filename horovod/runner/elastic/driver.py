"""The elastic driver's decisions, as pure functions over plain data.

Nothing here starts a process, reads a clock or touches the store: :func:`decide` looks at a :class:`DriverView`
(what the loop in :mod:`horovod.runner.elastic.job` observed) and returns one action for the loop to carry out.

A round of an elastic job runs until every live worker waits for a new one: after a failure the survivors' collectives
fail (``HorovodInternalError``) and they re-initialise; after a host update they stop at the next commit. Only then
does the driver decide, so a new round never meets a worker still in the old one. The decision, in order:

1. a worker succeeded → the job ends once nobody is training (exit 0);
2. every worker failed → stop, naming the first failure;
3. the reset limit is reached → stop;
4. fewer than ``min_np`` usable slots → wait for discovery, up to the elastic timeout, then stop;
5. slots without a worker → start workers there, and wait for them to be ready;
6. publish the new round: surviving hosts first (so rank 0 is a survivor, and sync gives everyone its state).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

from horovod.common.elastic_records import HostUpdateResult, slot_key
from horovod.runner.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.supervisor import WorkerExit, failure_message

RESET_LIMIT_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"


@dataclasses.dataclass(frozen=True)
class ElasticSettings:
    """The knobs of an elastic job (``--min-np``, ``--max-np``, ``--elastic-timeout``, ...)."""

    min_np: int
    max_np: Optional[int] = None
    elastic_timeout: float = 600.0
    start_timeout: float = 30.0
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[float, float]] = None

    def __post_init__(self):
        if self.min_np < 1:
            raise ValueError(f"--min-np must be at least 1, got {self.min_np}")
        if self.max_np is not None and self.max_np < self.min_np:
            raise ValueError(f"--max-np ({self.max_np}) must not be below --min-np ({self.min_np})")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ValueError(f"--reset-limit must be >= 0, got {self.reset_limit}")
        if self.cooldown_range is not None:
            lo, hi = self.cooldown_range
            if not 1 <= lo <= hi <= 3600:
                raise ValueError(f"--blacklist-cooldown-range {lo} {hi}: expected 1 <= MIN <= MAX <= 3600")


@dataclasses.dataclass(frozen=True)
class WorkerView:
    """One live worker process as the driver sees it."""

    key: str
    hostname: str
    local_rank: int
    ready: bool          # waiting for the next round
    in_round: bool       # took part in the current round
    started_at: float


@dataclasses.dataclass(frozen=True)
class DriverView:
    """Everything :func:`decide` looks at."""

    now: float
    round: int
    resets: int
    workers: Tuple[WorkerView, ...]
    available: Tuple[HostInfo, ...]       # discovered hosts that are not blacklisted, in discovery order
    current_hosts: Tuple[str, ...]        # hosts of the current round, in rank order
    succeeded: bool = False
    failures: Tuple[WorkerExit, ...] = ()  # failures since the current round began
    first_failure: Optional[WorkerExit] = None
    all_blacklisted: bool = False         # every discovered host is blacklisted and none will come back
    waiting_since: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Wait:
    """Do nothing this tick; ``for_slots``: because too few slots are available (the elastic timeout runs)."""
    for_slots: bool = False


@dataclasses.dataclass(frozen=True)
class Spawn:
    """Start workers on these slots (they have none yet)."""
    slots: Tuple[SlotInfo, ...]


@dataclasses.dataclass(frozen=True)
class Kill:
    """Kill these workers (by slot key), for ``reason``."""
    keys: Tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True)
class Publish:
    """Publish the next round: these slots get assignments, the workers of ``removed`` are told to leave."""
    slots: Tuple[SlotInfo, ...]
    removed: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Stop:
    """End the job with ``exit_code``, saying ``message``."""
    exit_code: int
    message: str = ""


Action = Union[Wait, Spawn, Kill, Publish, Stop]


def plan_assignment(current_hosts: Sequence[str], available: Sequence[HostInfo],
                    max_np: Optional[int]) -> List[SlotInfo]:
    """The slots of the next round: hosts of the current round (still available) first, in rank order, then the
    others in discovery order; at most ``max_np`` slots."""
    by_name = {h.hostname: h for h in available}
    order = [by_name[h] for h in current_hosts if h in by_name]
    order += [h for h in available if h.hostname not in set(current_hosts)]
    total = sum(h.slots for h in order)
    count = total if max_np is None else min(total, max_np)
    return get_host_assignments(order, count) if count > 0 else []


def slot_keys(slots: Sequence[SlotInfo]) -> FrozenSet[str]:
    """The slot keys (``host:local_rank``) of ``slots``."""
    return frozenset(slot_key(s.hostname, s.local_rank) for s in slots)


def host_update(current: FrozenSet[str], planned: Sequence[SlotInfo]) -> HostUpdateResult:
    """What a host update means for the running round: slots it would lose (removed), slots it would gain (added)."""
    planned_keys = slot_keys(planned)
    result = HostUpdateResult.no_update
    if current - planned_keys:
        result |= HostUpdateResult.removed
    if planned_keys - current:
        result |= HostUpdateResult.added
    return result


def cooldown_delay(cooldown_range: Tuple[float, float], times: int, uniform: float) -> float:
    """Seconds a host stays blacklisted after its ``times``-th failure (0-based): ``lo*2^times + U*lo`` within
    ``[lo, hi]``."""
    lo, hi = cooldown_range
    return min(max(lo * (2 ** min(times, 30)) + uniform * lo, lo), hi)


@dataclasses.dataclass
class Blacklist:
    """Hosts whose workers failed; with a cooldown range each returns after its delay, else never."""

    cooldown_range: Optional[Tuple[float, float]] = None
    entries: Dict[str, Tuple[int, float]] = dataclasses.field(default_factory=dict)  # host -> (times, until)

    def add(self, host: str, now: float, uniform: float) -> float:
        """Blacklist ``host``; returns when it may return (``inf``: never)."""
        times = self.entries.get(host, (0, 0.0))[0]
        until = math.inf if self.cooldown_range is None else now + cooldown_delay(self.cooldown_range, times, uniform)
        self.entries[host] = (times + 1, until)
        return until

    def blocked(self, host: str, now: float) -> bool:
        """Whether ``host`` is blacklisted at time ``now``."""
        return host in self.entries and now < self.entries[host][1]

    def permanent(self, host: str) -> bool:
        """Whether ``host`` is blacklisted for good (no cooldown range)."""
        return host in self.entries and self.entries[host][1] == math.inf


def decide(view: DriverView, settings: ElasticSettings) -> Action:
    """The driver's next action (see the module docstring for the order of the rules)."""
    live = view.workers
    if view.succeeded:
        return Stop(0) if all(w.ready for w in live) else Wait()
    if not live and view.failures:
        return Stop(1, "every worker of the elastic job failed, so the job is stopped.\n"
                       + failure_message(view.failures[0]))
    if any(w.in_round and not w.ready for w in live):
        return Wait()
    if view.round > 0 and settings.reset_limit is not None and view.resets >= settings.reset_limit:
        return Stop(1, RESET_LIMIT_MESSAGE.format(settings.reset_limit))
    slots = plan_assignment(view.current_hosts, view.available, settings.max_np)
    if len(slots) < settings.min_np:
        if view.all_blacklisted:
            reason = f"\n{failure_message(view.first_failure)}" if view.first_failure else ""
            return Stop(1, "every host of the elastic job is blacklisted after its workers failed, so the job is "
                           f"stopped.{reason}")
        if view.waiting_since is not None and view.now - view.waiting_since >= settings.elastic_timeout:
            return Stop(1, f"Timed out waiting for minimum number of slots to become available: {settings.min_np} "
                           f"needed, {len(slots)} available after {settings.elastic_timeout:g}s "
                           f"(--elastic-timeout).")
        return Wait(for_slots=True)
    by_key = {w.key: w for w in live}
    if view.round > 0:
        first = by_key.get(slot_key(slots[0].hostname, slots[0].local_rank))
        if first is None or not first.in_round:
            return Stop(1, "no worker of the previous round remains in the elastic job, so its state is lost; "
                           "the job is stopped.")
    missing = tuple(s for s in slots if slot_key(s.hostname, s.local_rank) not in by_key)
    if missing:
        return Spawn(missing)
    starting = [w for w in live if not w.ready]
    late = tuple(w.key for w in starting if view.now - w.started_at > settings.start_timeout)
    if late:
        return Kill(late, f"not ready within the start timeout ({settings.start_timeout:g}s)")
    if starting:
        return Wait()
    keys = slot_keys(slots)
    return Publish(tuple(slots), tuple(sorted(w.key for w in live if w.key not in keys)))


__all__ = ["ElasticSettings", "WorkerView", "DriverView", "Wait", "Spawn", "Kill", "Publish", "Stop", "Action",
           "decide", "plan_assignment", "host_update", "cooldown_delay", "Blacklist", "slot_keys",
           "RESET_LIMIT_MESSAGE"]
