"""One simulated rank: the negotiation, coordinator, response cache and frames of the real engine, run unmodified
behind the :class:`~horovod.core.negotiation.base.Loop` seam, over a simulated transport and clock.

Execution is the engine's :class:`~horovod.core.execution.Executor` (allreduces whose data rode the negotiation
are folded by the real code) but for its data plane, simulated by :class:`~horovod.tools.simulate.answers.DataPlane`
(small real data, every result checked). What is modelled rather than run: the engine's thread and its outer loop
(``await_cycle``, then ``negotiate`` for each set, then execution, as :class:`horovod.core.engine.Engine` runs them)
and the transport (:mod:`~horovod.tools.simulate.transport`: frames are
the real wire bytes, carried by :class:`~horovod.tools.simulate.world.World`).
"""

from __future__ import annotations

from typing import Optional, Set

from horovod.common.extras import install_hint
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType
from horovod.core import fusion
from horovod.core.execution import Executor
from horovod.core.negotiation import for_loop
from horovod.core.negotiation.base import spacing_for
from horovod.core.set_state import NEW, ProcessSets
from horovod.core.waiters import Waiters
from horovod.tools.simulate.answers import DATA_OPS, PENDING
from horovod.tools.simulate.startup import RENDEZVOUS_FD
from horovod.tools.simulate.transport import SimTransport
from horovod.transport.shm import SPIN_SECONDS

try:
    import greenlet
except ImportError:     # the simulate extra (the test extra holds it too)
    raise ImportError(f"the simulation runs each rank in a greenlet; install the simulate extra: "
                      f"{install_hint('simulate')}") from None

__all__ = ["WAKE_FD", "SimHandle", "SimRank"]

WAKE_FD = -1        # the wake-up socket's descriptor; a peer's connection is the peer's rank


class SimHandle:
    """A submitted request's handle: completed once, by the rank's execution."""

    __slots__ = ("name", "rank", "done", "error", "set_id", "occurrence")

    def __init__(self, name: str, rank: "SimRank", set_id: int = 0, occurrence: int = 0):
        self.name, self.rank, self.done, self.error = name, rank, False, None
        self.set_id, self.occurrence = set_id, occurrence     # which submission of the name (answers.Answers)

    def set_result(self, value) -> None:
        """The collective completed (or, PENDING, handed to the data plane: its result comes later)."""
        if value is not PENDING:
            self._finish(None, value)

    def set_exception(self, error: BaseException) -> None:
        """The collective failed."""
        self._finish(error, None)

    def _finish(self, error: Optional[BaseException], value) -> None:
        if self.done:
            raise AssertionError(f"rank {self.rank.rank}: {self.name!r} completed twice")
        self.done, self.error = True, error
        self.rank.job.handle_done(self.rank, self, value)


class SimExecutor(Executor):
    """The engine's execution, run unmodified, but for its data plane: what the negotiation did not fold is handed
    to the simulated one (:class:`~horovod.tools.simulate.answers.DataPlane`)."""

    def __init__(self, rank: "SimRank"):
        super().__init__(None, lambda response: None)
        self._rank = rank

    def _execute(self, state, response, entries):
        if response.op in DATA_OPS:
            return self._rank.job.answers.plane.run(self._rank, state, response, entries)
        return {name: response.last_joined if response.op == OpType.JOIN else None for name in entries}


class SimWake:
    """The loop's wake-up socket: one pending flag."""

    reader = WAKE_FD

    def __init__(self, rank: "SimRank"):
        self._rank = rank
        self.pending = False

    def notify(self) -> None:
        """Wake the loop (resumes the rank if it waits on this)."""
        self.pending = True
        self._rank.readable(WAKE_FD)

    def drain(self) -> None:
        """Forget pending wake-ups."""
        self.pending = False


class SimRank:
    """One rank: a :class:`~horovod.core.negotiation.base.Loop` for the real negotiation, run in a greenlet."""

    def __init__(self, job, rank: int, config):
        self.job, self.world = job, job.world
        self.rank, self.size = rank, job.size
        self.transport = SimTransport(self)
        self.waiters = Waiters()
        self.executor = SimExecutor(self)
        self.wake = SimWake(self)
        self.cycle_time = config.cycle_time / 1000.0
        self._spacing = spacing_for(self.cycle_time, config.is_explicit("HOROVOD_CYCLE_TIME"))
        self.negotiation = for_loop(self, config)
        self._sets = ProcessSets(rank, self.transport, config, None, self.negotiation.every_member_coordinates)
        self._sets.add(0, range(self.size))
        self.sets = self._sets.by_id
        self.slow = self.world.faults.slow.get(rank, 1.0)
        # As the engine does (shm.spin_seconds): where every rank of the host has a core, a waiting rank polls for a
        # moment before it sleeps, and what arrives meanwhile costs no wake-up.
        world = self.world
        mates = min(world.slots, self.size - world.host_of(rank) * world.slots)
        self._spin = SPIN_SECONDS if mates <= len(world.hosts[world.host_of(rank)].free) else 0.0
        self._wait_began = 0.0
        self.cycles = 0
        self.shutdown = False
        self.finished = self.dead = False
        self.error: Optional[BaseException] = None
        self.busy = 0.0                 # CPU seconds charged so far
        self.owed = 0.0                 # the caller's CPU since this rank last ran, charged at its next run
        self.others_ran = 0.0           # distinct other ranks of its host that ran before this run, per core
        self._clock = 0.0
        self._waiting: Optional[Set[int]] = None
        self._answered = False          # the rendezvous server (or the tree parent) answered
        self._token = 0
        self._greenlet: Optional[greenlet.greenlet] = None

    # -- the Loop seam -------------------------------------------------------------------------------------------

    def clock(self) -> float:
        """This rank's virtual time."""
        return self._clock

    def shutting_down(self) -> bool:
        """Whether this rank asked the job to stop."""
        return self.shutdown

    def batch_spacing(self) -> float:
        """How long requests gather before a cycle nobody waits for (as the engine's default)."""
        return self._spacing

    def work(self) -> int:
        """NEW when requests wait (or shutdown), PENDING when only answers are awaited, else IDLE."""
        return NEW if self.shutdown else self._sets.work()

    def select(self, fds: list, timeout: Optional[float]) -> list:
        """The descriptors of ``fds`` that are readable, waiting (in virtual time) up to ``timeout`` for one."""
        ready = [fd for fd in fds if self._is_readable(fd)]
        if ready or timeout == 0:
            return ready
        self.wait(set(fds), timeout)
        return [fd for fd in fds if self._is_readable(fd)]

    # -- running -------------------------------------------------------------------------------------------------

    def charge(self, seconds: float) -> None:
        """Spend ``seconds`` of this rank's core."""
        seconds *= self.slow
        self._clock += seconds
        self.busy += seconds

    def start(self, at: float = 0.0) -> None:
        """Make the greenlet and run it first at ``at`` (when the launcher spawned the rank)."""
        self._greenlet = greenlet.greenlet(self._main)
        self._clock = self._wait_began = at
        self.world.at(at, self._resume)

    def wait(self, fds: Set[int], timeout: Optional[float]) -> None:
        """End this run and wait until one of ``fds`` is readable or ``timeout`` passes (None: forever)."""
        if len(fds) > len(fds & self.transport.peers) + (WAKE_FD in fds) + (RENDEZVOUS_FD in fds):
            for fd in fds:      # a connection waited on is held (it breaks when its peer is lost)
                if fd >= 0 and fd not in self.transport.peers:
                    self.transport.fileno(fd)
        self._token += 1
        token = self._token
        self._waiting = fds
        self._wait_began = self._clock
        self.job.run_ended(self, self._clock)
        if timeout is not None:
            self.world.at(self._clock + timeout, lambda: self._timer(token))
        self.job.hub.switch()

    def readable(self, fd: int) -> None:
        """Something arrived for ``fd``: resume the rank now if it waits for it."""
        if self._waiting is not None and fd in self._waiting and not self.dead:
            self._waiting = None
            self.world.at(self.world.now, self._resume)

    def answered(self) -> None:
        """The rendezvous server's answer (or the records from the tree parent) arrived."""
        self._answered = True
        self.readable(RENDEZVOUS_FD)

    def connection_closed(self, peer: int, lost: int) -> None:
        """The connection to ``peer`` broke; ``lost`` is the rank whose loss it reports (the loss board)."""
        if self.dead or peer in self.transport.closed:
            return
        self.transport.closed[peer] = lost
        self.readable(peer)

    def _is_readable(self, fd: int) -> bool:
        if fd == WAKE_FD:
            return self.wake.pending
        if fd == RENDEZVOUS_FD:
            return self._answered
        return bool(self.transport.inbox.get(fd)) or fd in self.transport.closed

    def _timer(self, token: int) -> None:
        if self._token == token and self._waiting is not None and not self.dead:
            self._waiting = None
            self._resume()

    def _resume(self) -> None:
        if self.dead or self._greenlet is None or self._greenlet.dead:
            return
        at = self.job.run_starts(self, self.world.now)
        if at is None:
            return          # its core is busy: the job resumes it when the core frees
        self._clock = at
        if at - self._wait_began > self._spin:      # (slept, not spun)
            self.charge(self.world.cpu.wake + self.world.cpu.refill(self.others_ran))
        self.charge(self.owed)
        self.owed = 0.0
        self._greenlet.switch()

    def _main(self) -> None:
        try:
            self._boot()
            self.negotiation.start()
            while not self.finished:
                self.negotiation.await_cycle()
                self.cycles += 1
                self.waiters.cycle_started()
                self.charge(self.world.cpu.cycle)
                for set_id in sorted(self.sets):
                    state = self.sets[set_id]
                    if state.index < 0:         # not a member (as the engine skips it)
                        continue
                    decision = self.negotiation.negotiate(state, self.shutdown if set_id == 0 else False)
                    self._execute(state, decision)
                    self.finished = self.finished or decision.shutdown
        except HorovodInternalError as exc:
            self.error = exc
            self.charge(self.world.cpu.fail)
            self._ask_server(self.job.rendezvous.post_loss)      # the loss board, before it hangs up
            self.job.rank_failed(self)
            if self.job.workload.exits:
                self.job.process_ends(self.rank, self._clock)
        self.job.run_ended(self, self._clock)

    def _boot(self) -> None:
        """Where the job models start-up: boot, register, wait for the records, hand them down, then begin."""
        startup = self.job.startup
        if startup is None:
            return
        self.charge(startup.boot)
        self._ask_server(self.job.rendezvous.register)
        self.job.rendezvous.hand_down(self)
        self.job.ready(self)

    def _ask_server(self, request) -> None:
        """Send ``request`` to the rendezvous server and wait for its answer."""
        self._answered = False
        request(self, self._clock)
        while not self._answered:
            self.wait({RENDEZVOUS_FD}, None)

    def _execute(self, state, decision) -> None:
        """Complete what the cycle decided, in order, and record it in the response cache (as execution does)."""
        batches = list(decision.batches)
        executed, signature = [], []
        for batch in batches:
            response = fusion.merge(batch.responses)
            signature.append((response.op, response.names))
            self.executor._run_batch(state, batch, executed)    # the real execution; data by the simulated plane
            self.charge(self.world.cpu.name * len(response.names))
        state.cache.record(executed)
        self.job.cycle_decided(self, self.cycles if state.id == 0 else f"{self.cycles} of set {state.id}",
                               tuple(signature))
