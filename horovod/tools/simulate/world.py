"""The simulated world: a virtual clock, one event queue, hosts with cores, links with latency and bandwidth, and the
faults a seed draws. Every rank runs in a greenlet (a coroutine, not an OS thread) that the world resumes when what
it waits for arrives; nothing here reads the wall clock or the OS's randomness, so a seed replays exactly.

A rank's run (from one resume to its next wait) takes a core of its host for the CPU the model charges it: a wake-up,
plus a cost per frame and per byte it reads or writes (and, for rank 0 and the tree's relays, per contribution of a
small allreduce that rode a message to it, ``CpuModel.fold``). A wake-up after other processes of its host ran also refills
the caches they took: ``CpuModel.cold`` (a rank's op with its caches emptied) times the share of a full refill that
the machine's curve (``CpuModel.sharing``) gives for that many distinct other processes per core (past one full
refill, each further share at the curve's own process's refill, ``CpuModel.beyond``). A process's end (a killed
rank's, or a failed rank's whose script exits) takes ``CpuModel.exit`` of its host's cores, in slices shared with the
ranks, each to the kernel's next tick (``CpuModel.tick``; :meth:`~horovod.tools.simulate.job.Job.process_ends`).
A frame leaves when its sender's clock says it was sent and arrives a link's latency and its bytes' transfer time
later, plus whatever delay a fault adds. Delays make frames
of different connections overtake each other. The network may also duplicate a frame or let a later one of the same
connection overtake it (faults of the packets below TCP); the simulated connection numbers its frames and delivers
each once and in order, as TCP does (``SimTransport.arrived`` in :mod:`~horovod.tools.simulate.transport`), so
such faults cost time, never a frame read twice or out of order.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

__all__ = ["CpuModel", "LinkModel", "Faults", "Host", "World", "draw_faults"]


@dataclass(frozen=True)
class CpuModel:
    """What a rank's work costs, in seconds of one core. First guesses, not yet fitted to measured jobs (see
    docs/scaling-notebook.md, "Not calibrated yet")."""

    wake: float = 40e-6          # a wake-up: the scheduler, and a Python process running cold
    frame: float = 15e-6         # reading or writing one control frame (codec, checks, the protocol's step)
    byte: float = 2e-9           # per byte of a frame
    cycle: float = 30e-6         # one cycle's bookkeeping (the engine's step, the response cache)
    name: float = 1e-6           # per name a cycle decides (the coordinator, execution's bookkeeping)
    # Per contribution a rank reads under star and tree negotiation (a member's input of one small allreduce whose
    # data rode its message): rank 0 holds it by name and position and folds it before it replies; a tree's relay
    # reads its children's and passes them on. Measured by role, a relay costs about what rank 0 does per
    # contribution (docs/scaling-notebook.md, "Each role's CPU").
    fold: float = 0.0
    fail: float = 300e-6         # failing: the error raised through the engine, every handle failed, the hang-up
    submit: float = 0.0          # the caller's per request: submitting it (checks, a handle) and waiting for it
    cold: float = 0.0            # a wake-up whose caches were emptied: refilling what a rank's op touches
    # A rank's process ending, killed or after its script raised: the kernel frees its memory and closes its sockets,
    # on a core of its host (its sockets close when that is done).
    exit: float = 0.0
    # The host kernel's scheduler tick (1 / CONFIG_HZ) where its own work is preempted only at a tick (preemption
    # none, voluntary or lazy): a process's end, kernel work, runs on from its base slice to the next tick before a
    # woken rank gets the core. 0: preempted at the slice (a fully preemptible kernel).
    tick: float = 4e-3
    # The machine's curve: (distinct other processes of the host that ran since a process last ran, per core; the
    # share of a full refill its wake-up then pays), from bench/core_sharing.py; empty: caches never go cold.
    sharing: Tuple[Tuple[float, float], ...] = ()
    # A byte folded or copied in memory by a collective's data phase (horovod.tools.simulate.dataphase): packing a
    # model's gradients into a fusion buffer ran at 7.8 GB/s on this project's VM (bench/RESULTS.md, the planner's
    # check), and a fold reads two buffers and writes one at about that rate.
    copy: float = 1 / 7.8e9
    # Past one full refill, what a further share of it costs: the curve's own process's full refill (a rank's
    # larger caches are refilled by then; the scheduler's and the kernel's work per wake-up still grows). 0: ``cold``.
    beyond: float = 0.0

    def refill(self, others: float) -> float:
        """The CPU a wake-up pays to refill the caches after ``others`` distinct processes per core ran since
        (log-interpolated between the curve's points; its last share past them). A share past one full refill is
        charged at ``beyond`` a share: what still grows then is the machine's own work per wake-up, not the caches
        of the process that wakes."""
        share = self._share(others)
        return self.cold * min(share, 1.0) + (self.beyond or self.cold) * max(share - 1.0, 0.0)

    def _share(self, others: float) -> float:
        if not self.cold or not self.sharing or others <= 0:
            return 0.0
        points = self.sharing
        if others >= points[-1][0]:
            return points[-1][1]
        if others <= points[0][0]:
            return points[0][1] * others / points[0][0]
        at = bisect.bisect_right([x for x, _ in points], others)
        (x0, y0), (x1, y1) = points[at - 1], points[at]
        t = math.log(others / x0) / math.log(x1 / x0)
        return y0 + t * (y1 - y0)


@dataclass(frozen=True)
class LinkModel:
    """A connection between two ranks: on one host (loopback) or across hosts."""

    local_latency: float = 20e-6
    local_bandwidth: float = 2e9        # bytes per second
    remote_latency: float = 50e-6
    remote_bandwidth: float = 1.25e9
    detect: float = 10.0                # seconds until a dead host's peers give up on it (keepalive)


@dataclass
class Faults:
    """What a seed may break: probabilities per frame, and events at given times."""

    delay: float = 0.0                  # probability that a frame is held back
    delay_max: float = 0.005            # for at most this long (seconds)
    duplicate: float = 0.0              # probability that a frame arrives twice (the receiver drops the copy)
    reorder: float = 0.0                # probability that a frame is held back past later ones of its connection
    kill: List[Tuple[float, int]] = field(default_factory=list)       # (time, rank): the process dies
    partition: Optional[Tuple[float, int]] = None   # (time, first host of the second side): links between cut
    slow: Dict[int, float] = field(default_factory=dict)               # rank -> CPU cost multiplier


class Host:
    """A host's cores: when each is free next."""

    def __init__(self, index: int, cores: int):
        self.index = index
        self.free = [0.0] * cores
        self._runs = 0
        self._last_run: Dict[int, int] = {}       # rank -> the number of the run it last started

    def others_since(self, rank: int) -> int:
        """Start a run of ``rank``: how many distinct other ranks of this host started a run since its last one
        (all of them before its first)."""
        mine = self._last_run.get(rank, -1)
        others = sum(1 for r, run in self._last_run.items() if run > mine and r != rank) if mine >= 0 \
            else len(self._last_run)
        self._runs += 1
        self._last_run[rank] = self._runs
        return others

    def start(self, at: float) -> Tuple[int, float]:
        """The core that frees first, and when a run asked for at ``at`` can start on it."""
        core = min(range(len(self.free)), key=self.free.__getitem__)
        return core, max(at, self.free[core])


class World:
    """The clock, the event queue, the hosts and the network of one simulated job."""

    def __init__(self, size: int, slots: int, cores: int, seed: int, cpu: CpuModel = CpuModel(),
                 link: LinkModel = LinkModel(), faults: Optional[Faults] = None):
        self.size, self.slots, self.seed = size, slots, seed
        self.now = 0.0
        self.rng = random.Random(seed)
        self.cpu, self.link = cpu, link
        self.faults = faults or Faults()
        self.hosts = [Host(h, cores) for h in range((size + slots - 1) // slots)]
        self._events: List[Tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._last_arrival: Dict[Tuple[int, int], float] = {}
        self.cut = False              # a partition is in effect
        self.events_run = 0

    def host_of(self, rank: int) -> int:
        """The host a rank runs on (``slots`` consecutive ranks per host)."""
        return rank // self.slots

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` at virtual time ``when`` (events at the same time run in the order they were asked for)."""
        heapq.heappush(self._events, (max(when, self.now), next(self._seq), action))

    def step(self) -> bool:
        """Run the next event; False when there is none."""
        if not self._events:
            return False
        self.now, _, action = heapq.heappop(self._events)
        self.events_run += 1
        action()
        return True

    def pending(self) -> int:
        """Events still queued."""
        return len(self._events)

    def severed(self, a: int, b: int) -> bool:
        """Whether the partition separates ranks ``a`` and ``b``."""
        if not self.cut or self.faults.partition is None:
            return False
        first = self.faults.partition[1]
        return (self.host_of(a) >= first) != (self.host_of(b) >= first)

    def arrival(self, sender: int, receiver: int, sent: float, nbytes: int) -> List[float]:
        """When a frame sent at ``sent`` arrives (twice when a fault duplicates it); [] when a partition drops it."""
        if self.severed(sender, receiver):
            return []
        local = self.host_of(sender) == self.host_of(receiver)
        link = self.link
        latency, bandwidth = (link.local_latency, link.local_bandwidth) if local else \
            (link.remote_latency, link.remote_bandwidth)
        when = sent + latency + nbytes / bandwidth
        faults, rng = self.faults, self.rng
        if faults.delay and rng.random() < faults.delay:
            when += rng.random() * faults.delay_max
        key = (sender, receiver)
        if faults.reorder and rng.random() < faults.reorder:
            when += rng.random() * faults.delay_max             # later frames of the connection may overtake it
        else:
            when = max(when, self._last_arrival.get(key, 0.0))  # (in order unless a fault reorders)
            self._last_arrival[key] = when
        times = [when]
        if faults.duplicate and rng.random() < faults.duplicate:
            times.append(when + rng.random() * faults.delay_max)
        return times

    def detection_delay(self, dead: int, peer: int, process_only: bool) -> float:
        """How long ``peer`` takes to see its connection to ``dead`` break: a killed process's kernel closes its
        sockets at once (a network hop), a lost host or link is found by keepalive."""
        if process_only and not self.severed(dead, peer):
            local = self.host_of(dead) == self.host_of(peer)
            return self.link.local_latency if local else self.link.remote_latency
        return self.link.detect


def draw_faults(seed: int, size: int, slots: int, horizon: float) -> Faults:
    """Faults drawn from ``seed`` for a job of ``size`` ranks that runs about ``horizon`` seconds: none, a lost rank
    (rank 0, any other, interior or leaf), two lost ranks, a partition, frames held back (so that frames of different
    connections overtake each other), a slow rank, duplicated frames, or frames overtaken by later ones of their own
    connection; the same seed always draws the same faults."""
    rng = random.Random(seed * 7919 + size)
    kind = rng.choice(("none", "kill", "kill0", "kill2", "partition", "delay", "slow", "duplicate", "reorder"))
    at = rng.uniform(0.0, horizon)
    hosts = (size + slots - 1) // slots
    if kind == "kill":
        return Faults(kill=[(at, rng.randrange(1, size))])
    if kind == "kill0":
        return Faults(kill=[(at, 0)])
    if kind == "kill2":
        return Faults(kill=[(at, rng.randrange(size)), (at + rng.uniform(0, horizon / 4), rng.randrange(size))])
    if kind == "partition" and hosts > 1:
        return Faults(partition=(at, rng.randrange(1, hosts)))
    if kind == "delay":
        return Faults(delay=rng.uniform(0.05, 0.5), delay_max=rng.uniform(1e-4, 5e-3))
    if kind == "slow":
        return Faults(slow={rng.randrange(size): rng.uniform(2, 20)})
    if kind in ("duplicate", "reorder"):
        return Faults(**{kind: rng.uniform(0.05, 0.5)}, delay_max=rng.uniform(1e-4, 5e-3))
    return Faults()
