"""A simulated job: its ranks, the training loop each rank's caller runs, the faults a seed injects, and the invariants
checked after every event.

The workload is a training loop: each step every rank submits ``tensors`` allreduces (small ones, whose data rides
the negotiation; even and odd tensors of two dtypes, so that a cycle decides two batches), waits for all of them, then
computes for ``compute`` seconds (with jitter from the seed). The first step's names are new; later steps are
cached. After the last step every rank shuts down. (:mod:`~horovod.tools.simulate.varied` draws workloads that
differ per rank.) Every submitted tensor holds small real data and every result is checked
(:mod:`~horovod.tools.simulate.answers`).

Invariants (:class:`InvariantViolation` names the seed): every rank decides the same batches in the same order in
each cycle; no handle completes twice; when nothing is left to happen every live rank has ended (no deadlock); with no
fault, no rank fails and every step completes; with a lost rank or a partition, every survivor fails naming a lost
rank or ends with the job; every rank's result of every collective is the reduction of what the members submitted,
byte for byte; a name mismatched on one rank fails on every rank.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from horovod.common.config import load_config
from horovod.common.types import OpType, ReduceOp, Request
from horovod.core.ops import Entry
from horovod.common.exceptions import TensorMismatchError
from horovod.tools.simulate.answers import Answers
from horovod.tools.simulate.rank import SimHandle, SimRank, greenlet
from horovod.tools.simulate.startup import Rendezvous, StartupModel
from horovod.tools.simulate.world import CpuModel, Faults, LinkModel, World

# A long run of the kernel's (a process ending) shares a core with woken ranks: it gives the core up once it ran a base
# slice of the Linux scheduler (EEVDF's default, 0.75 ms), at the next scheduler tick where the kernel is preempted only
# there (``CpuModel.tick``; this VM: no preemption, 250 Hz). Given up at the slice, the last survivor of a kill at 8-128
# ranks raised 21-49 % sooner than measured on three days; at the tick, within 25 % on all of them
# (docs/scaling-notebook.md).
SCHEDULER_SLICE = 0.75e-3

__all__ = ["InvariantViolation", "Workload", "Job", "scenario", "victim_of"]


class InvariantViolation(AssertionError):
    """An invariant broke; the message starts with the seed that replays it."""


class Workload:
    """The training loop every rank runs (see the module's docstring)."""

    def __init__(self, steps: int = 4, tensors: int = 20, count: int = 1, compute: float = 0.002,
                 jitter: float = 0.2, mixed: bool = True, exits: bool = True):
        self.steps, self.tensors, self.count, self.compute, self.jitter = steps, tensors, count, compute, jitter
        # exits: a rank's script ends on HorovodInternalError (as one without elastic does), so its process's exit
        # takes a core of its host after it failed; an elastic one catches the error and lives on.
        self.exits = exits
        # mixed: even and odd tensors of two dtypes (two batches a cycle); else float32 only, as a benchmark's loop
        self.arrays = (np.ones(count, np.float32), np.ones(count, np.float64) if mixed else np.ones(count, np.float32))

    def requests(self) -> List[Tuple[Request, np.ndarray]]:
        """One step's requests, in submission order, each with an array of its dtype and shape."""
        out = []
        for i in range(self.tensors):
            array = self.arrays[i % 2]
            out.append((Request(f"allreduce.grad.{i}", OpType.ALLREDUCE, str(array.dtype), array.shape,
                                ReduceOp.AVERAGE), array))
        return out

    def process_sets(self, size: int) -> Dict[int, List[int]]:
        """Process sets besides the global one, registered on every rank before the loop starts."""
        return {}

    def submissions(self, seed: int, rank: int, step: int, size: int) -> List[Tuple[float, int, Request]]:
        """What ``rank``'s caller submits in ``step``: (seconds after the step began, set, request), in order.
        Every rank submits the same names in the same order at once (:mod:`~horovod.tools.simulate.varied` draws
        workloads that differ per rank)."""
        return [(0.0, 0, request) for request, _ in self.requests()]

    def fails(self, name: str) -> bool:
        """Whether ``name`` must fail on every rank (a mismatch the workload plants)."""
        return False


class Job:
    """``size`` simulated ranks over ``world`` running ``workload``; :meth:`run` returns the figures."""

    def __init__(self, world: World, workload: Workload, env: Optional[Dict[str, str]] = None,
                 startup: Optional[StartupModel] = None):
        self.world, self.size, self.workload = world, world.size, workload
        self.startup = startup      # None: every rank holds the records at time 0 and begins at once
        self.rendezvous = Rendezvous(self, startup or StartupModel(), self.size)
        self.hub = greenlet.getcurrent()
        config = load_config({"HOROVOD_SHM_DISABLE": "1", **(env or {})})
        self.ranks = [SimRank(self, r, config) for r in range(self.size)]
        for set_id, members in workload.process_sets(self.size).items():
            for rank in self.ranks:
                rank._sets.add(set_id, members)
        self.answers = Answers(self, config.hierarchical_allreduce)
        self.mismatches = 0         # handles of a name mismatched on one rank that failed as they must
        self._step: List[int] = [0] * self.size
        self._left: List[int] = [0] * self.size
        self._cores: Dict[int, Tuple[int, int]] = {}     # rank -> (host, core) while it runs
        self._decided: Dict[int, Tuple[int, tuple]] = {}  # cycle -> (first rank, what it decided)
        self.step_submitted: Dict[int, float] = {}       # step -> when its last rank submitted
        self.step_done: Dict[int, float] = {}            # step -> when its last rank had every result
        self.snapshots: Dict[int, List[Tuple[int, int, int, int]]] = {}   # step -> (frames, bytes, cycles, busy)
        self.killed: List[int] = []
        self.fault_at: Optional[float] = None
        self.failed_at: Dict[int, float] = {}
        self.first_failure: Optional[int] = None          # the rank that failed first, and in which cycle
        self.first_failure_cycle: Optional[int] = None
        self.replay: object = "the same seed, ranks and faults"     # what a violation says replays it (replay.py)

    # -- running ---------------------------------------------------------------------------------------------------

    def run(self, max_events: int = 50_000_000, horizon: float = float("inf")) -> "Job":
        """Run until nothing is left to happen, checking the invariants after every event.

        Raises:
            InvariantViolation: an invariant broke (the message names the seed).
        """
        for rank in self.ranks:
            host = self.world.host_of(rank.rank)
            rank.start(self.startup.spawned_at(rank.rank - host * self.world.slots, host) if self.startup else 0.0)
            if self.startup is None:
                self.world.at(0.0, lambda r=rank: self._begin_step(r))
        for when, rank in self.world.faults.kill:
            self.world.at(when, lambda r=rank: self._kill(r))
        if self.world.faults.partition is not None:
            self.world.at(self.world.faults.partition[0], self._partition)
        while self.world.step():
            if self.world.events_run > max_events or self.world.now > horizon:
                self._violation(f"no end after {self.world.events_run} events and {self.world.now:.3f} s of virtual "
                                f"time (limits {max_events}, {horizon} s): a livelock or a stall")
        self._check_end()
        return self

    def ready(self, rank: SimRank) -> None:
        """``rank`` booted and holds every record: its caller begins the first step."""
        self.world.at(rank.clock(), lambda: self._begin_step(rank))

    def run_starts(self, rank: SimRank, now: float) -> Optional[float]:
        """A core for ``rank``'s run from ``now``, or None (its resume is queued for when one frees)."""
        host = self.world.hosts[self.world.host_of(rank.rank)]
        core, start = host.start(now)
        if start > now:
            self.world.at(start, rank._resume)
            return None
        host.free[core] = float("inf")
        self._cores[rank.rank] = (host.index, core)
        rank.others_ran = host.others_since(rank.rank) / len(host.free)
        return start

    def run_ended(self, rank: SimRank, clock: float) -> None:
        """``rank``'s run ended at its ``clock``: its core is free from then."""
        held = self._cores.pop(rank.rank, None)
        if held is not None:
            self.world.hosts[held[0]].free[held[1]] = clock

    def send(self, sender: int, receiver: int, seq: int, payload: bytes, sent: float) -> None:
        """Carry frame number ``seq`` of a connection; it is read from the receiver's connection when it and every
        frame before it have arrived (a copy the network made is dropped), as TCP delivers."""
        for when in self.world.arrival(sender, receiver, sent, len(payload)):
            self.world.at(when, lambda: self._deliver(sender, receiver, seq, payload))

    def _deliver(self, sender: int, receiver: int, seq: int, payload: bytes) -> None:
        rank = self.ranks[receiver]
        if rank.dead:
            return
        # What a lost rank sent before it died is still read, before the broken connection is seen (TCP).
        if rank.transport.arrived(sender, seq, payload):
            rank.readable(sender)

    # -- the callers' training loop ----------------------------------------------------------------------------------

    def _begin_step(self, rank: SimRank) -> None:
        if rank.dead or rank.error is not None:
            return
        step = self._step[rank.rank]
        if step >= self.workload.steps:
            rank.shutdown = True
            rank.wake.notify()
            return
        plan = self.workload.submissions(self.world.seed, rank.rank, step, self.size)
        if not plan:        # (a rank that joined early has no data left)
            self._step[rank.rank] += 1
            self.world.at(self.world.now, lambda: self._begin_step(rank))
            return
        self._left[rank.rank] = len(plan)
        rank.owed += self.world.cpu.submit * len(plan)    # the caller's submissions and waits
        self.step_submitted[step] = self.world.now
        rank.waiters.blocked = 1
        for delay in sorted({delay for delay, _, _ in plan}):
            part = [(set_id, request) for at, set_id, request in plan if at == delay]
            if delay:
                self.world.at(self.world.now + delay, lambda p=part: self._submit(rank, p))
            else:
                self._submit(rank, part)

    def _submit(self, rank: SimRank, part: List[Tuple[int, Request]]) -> None:
        if rank.dead or rank.error is not None:
            return
        for set_id, request in part:
            state = rank.sets[set_id]
            if request.op == OpType.JOIN:
                rank.executor.mark_joined()     # as hvd.join does before it submits
            array, occurrence = self.answers.input(rank.rank, set_id, request)
            array = None if request.op == OpType.JOIN else array
            with state.lock:
                state.entries[request.name] = Entry(request, array, None,
                                                    SimHandle(request.name, rank, set_id, occurrence), 0)
                state.queue.append(request)
        rank.waiters.waited = True
        rank.wake.notify()

    def handle_done(self, rank: SimRank, handle: SimHandle, value=None) -> None:
        """A handle completed: its result is checked (:mod:`~horovod.tools.simulate.answers`); when it was the
        step's last, the caller computes, then starts the next step."""
        planted = self.workload.fails(handle.name)
        if handle.error is None and planted:
            self._violation(f"rank {rank.rank}: {handle.name!r}, mismatched on one rank, did not fail")
        elif handle.error is not None and not self._faulty() and not (
                planted and isinstance(handle.error, TensorMismatchError)):
            self._violation(f"rank {rank.rank}: {handle.name!r} failed without a fault: {handle.error}")
        elif handle.error is not None and planted:
            self.mismatches += 1
        elif handle.error is None:
            self.answers.check(rank, handle, value)
        self._left[rank.rank] -= 1
        if self._left[rank.rank]:
            return
        step = self._step[rank.rank]
        self.step_done[step] = done = max(rank.clock(), self.world.now)    # (a data phase ends while it sleeps)
        self.snapshots.setdefault(step, [None] * self.size)[rank.rank] = self._snapshot(rank)
        self._step[rank.rank] += 1
        rank.waiters.blocked = 0
        compute = self.workload.compute * (1 + self.workload.jitter * self.world.rng.random())
        # The next step begins after this run ends, so a rank that shares its host's cores runs (and refills) again
        # for it, where a real caller that ran the loop goes on without sleeping. Kept: that second refill stands in
        # for what the machine's curve misses of one real wake-up's past one share (docs/scaling-notebook.md, "Each
        # role's CPU"); with one run a step the predictions at 8-128 ranks fell from 166 to 138 cells of 200.
        self.world.at(done + compute, lambda: self._begin_step(rank))

    @staticmethod
    def _snapshot(rank: SimRank) -> Tuple[int, int, int, float]:
        t = rank.transport
        return t.frames_in + t.frames_out, t.bytes_in + t.bytes_out, rank.cycles, rank.busy

    # -- faults ----------------------------------------------------------------------------------------------------

    def _faulty(self) -> bool:
        """Whether a fault may fail the job: a lost rank or a partition; delayed, duplicated or reordered frames
        must never fail it."""
        faults = self.world.faults
        return bool(faults.kill) or faults.partition is not None

    def _kill(self, index: int) -> None:
        rank = self.ranks[index]
        if rank.dead or rank.finished:
            return
        rank.dead = True
        self.killed.append(index)
        self.fault_at = self.world.now if self.fault_at is None else self.fault_at
        held = self._cores.pop(index, None)
        if held is not None:
            self.world.hosts[held[0]].free[held[1]] = self.world.now     # its run is cut short

        def hung_up() -> None:
            for peer in sorted(rank.transport.peers | self._listeners_of(index)):
                self.world.at(self.world.now + self.world.detection_delay(index, peer, process_only=True),
                              lambda p=peer: self.ranks[p].connection_closed(index, index))
        self.process_ends(index, self.world.now, hung_up)

    def process_ends(self, index: int, at: float, then: Optional[Callable[[], None]] = None) -> None:
        """Rank ``index``'s process ends from ``at`` (killed, or its script exits after it failed): the kernel frees
        its memory and closes its sockets, ``cpu.exit`` of a core's work that shares its host's cores with the ranks
        in slices, as the scheduler does; ``then`` runs once it is done."""
        if not self.world.cpu.exit:
            self.world.at(at, then or (lambda: None))
            return
        self.world.at(at, lambda: self._exit_slice(index, self.world.cpu.exit, then))

    def _exit_slice(self, index: int, left: float, then: Optional[Callable[[], None]]) -> None:
        host, now = self.world.hosts[self.world.host_of(index)], self.world.now
        core, start = host.start(now)
        if start > now:
            self.world.at(start, lambda: self._exit_slice(index, left, then))
            return
        tick = self.world.cpu.tick
        until = now + SCHEDULER_SLICE
        piece = min(left, (math.ceil(until / tick - 1e-9) * tick if tick else until) - now)
        host.free[core] = now + piece
        if left > piece:        # a rank that waits for the core takes it first (it slept: the earlier deadline)
            self.world.at(now + piece + 1e-9, lambda: self._exit_slice(index, left - piece, then))
        elif then is not None:
            self.world.at(now + piece, then)

    def connected(self, rank: int, peer: int) -> None:
        """``rank`` opened its connection to ``peer``: one opened across a partition, or to a rank killed already,
        breaks as the ones held then did (a process set's first cycle may open it after the fault)."""
        if self.ranks[peer].dead or self.world.severed(rank, peer):
            delay = self.world.detection_delay(peer, rank, process_only=self.ranks[peer].dead)
            self.world.at(self.world.now + delay, lambda: self.ranks[rank].connection_closed(peer, peer))
        elif peer in self.failed_at:    # failed already: its transport, closed, refuses the dial (naming its loss)
            lost = next(iter(self.ranks[peer].transport.closed.values()), peer)
            self.world.at(max(self.world.now, self.failed_at[peer]) + self.world.detection_delay(peer, rank, True),
                          lambda: self.ranks[rank].connection_closed(peer, lost))

    def _listeners_of(self, index: int):
        return {r.rank for r in self.ranks if index in r.transport.peers}

    def _partition(self) -> None:
        self.world.cut = True
        self.fault_at = self.world.now if self.fault_at is None else self.fault_at
        for rank in self.ranks:
            for peer in sorted(rank.transport.peers):
                if self.world.severed(rank.rank, peer):
                    delay = self.world.detection_delay(peer, rank.rank, process_only=False)
                    self.world.at(self.world.now + delay, lambda r=rank, p=peer: r.connection_closed(p, p))

    def detection_seconds(self) -> float:
        """From the first fault to the last survivor's failure (NaN when no rank failed: the job ended first)."""
        if not self.failed_at or self.fault_at is None:
            return float("nan")
        return max(self.failed_at.values()) - self.fault_at

    def failed_alone(self) -> List[int]:
        """Ranks that completed the job while others failed before the job's last cycle was decided."""
        if self.first_failure is None or self.first_failure_cycle is None:
            return []
        return [r.rank for r in self.ranks if r.finished and r.error is None and not r.dead
                and r.cycles > self.first_failure_cycle + 1]

    def rank_failed(self, rank: SimRank) -> None:
        """``rank`` raised HorovodInternalError: it closes its connections, passing on whose loss it was."""
        self.failed_at[rank.rank] = rank.clock()
        if self.first_failure is None:
            self.first_failure, self.first_failure_cycle = rank.rank, rank.cycles
        if not self._faulty():
            self._violation(f"rank {rank.rank} failed without a fault: {rank.error}")
        lost = next(iter(rank.transport.closed.values()), rank.rank)
        for peer in sorted(rank.transport.peers | self._listeners_of(rank.rank)):
            if not self.world.severed(rank.rank, peer):
                self.world.at(rank.clock() + self.world.detection_delay(rank.rank, peer, True),
                              lambda p=peer: self.ranks[p].connection_closed(rank.rank, lost))

    # -- invariants ------------------------------------------------------------------------------------------------

    def cycle_decided(self, rank: SimRank, cycle: int, signature: tuple) -> None:
        """Every rank must decide the same batches in the same order in each cycle."""
        first = self._decided.setdefault(cycle, (rank.rank, signature))
        if first[1] != signature:
            self._violation(f"cycle {cycle}: rank {rank.rank} decided {_short(signature)}, rank {first[0]} "
                            f"decided {_short(first[1])}")

    def _check_end(self) -> None:
        for rank in self.ranks:
            if rank.dead:
                continue
            if rank.error is None and not rank.finished:
                self._violation(f"deadlock: rank {rank.rank} neither ended nor failed, and nothing is left to "
                                f"happen (it waits for {sorted(rank._waiting or ())})")
            if not self._faulty() and self._step[rank.rank] != self.workload.steps:
                self._violation(f"rank {rank.rank} ended after {self._step[rank.rank]} steps of "
                                f"{self.workload.steps}")
            if rank.error is not None and "was lost" not in str(rank.error):
                self._violation(f"rank {rank.rank} failed without naming a lost rank: {rank.error}")
        failed = [r.rank for r in self.ranks if r.error is not None]
        if failed and self.failed_alone():
            self._violation(f"ranks {failed[:8]} failed, but ranks {self.failed_alone()[:8]} ended the job "
                            f"without seeing it")

    def violation(self, what: str) -> None:
        """Raise :class:`InvariantViolation`, naming the seed and how to replay the run."""
        raise InvariantViolation(f"seed {self.world.seed}: {what} (replay: {self.replay})")

    _violation = violation


def _short(signature: tuple) -> str:
    return "; ".join(f"{OpType(op).name if op in OpType._value2member_map_ else op} {list(names)[:3]}"
                     for op, names in signature)[:300]


def scenario(size: int, seed: int, slots: int = 8, cores: int = 8, workload: Optional[Workload] = None,
             faults: Optional[Faults] = None, env: Optional[Dict[str, str]] = None, cpu: CpuModel = CpuModel(),
             link: LinkModel = LinkModel(), startup: Optional[StartupModel] = None,
             max_events: int = 50_000_000, horizon: float = float("inf")) -> Job:
    """One simulated job, run to its end (raises InvariantViolation when an invariant breaks, or past
    ``max_events`` or ``horizon`` seconds of virtual time: a livelock or a stall); with ``startup``, from the launch
    (:mod:`~horovod.tools.simulate.startup`)."""
    world = World(size, slots, cores, seed, cpu, link, faults)
    return Job(world, workload or Workload(), env, startup).run(max_events, horizon)


def victim_of(size: int) -> int:
    """The rank the lost-rank scenarios kill (and ``bench/scale_control.py``): an interior rank past the middle, the
    last at 2 ranks."""
    return size // 2 + 1 if size > 2 else size - 1
