"""One simulated rank: the negotiation, coordinator, response cache and frames of the real engine, run unmodified
behind the :class:`~horovod.core.negotiation.base.Loop` seam, over a simulated transport and clock.

What is modelled rather than run: the engine's thread and its outer loop (``await_cycle``, then ``negotiate`` for
each set, then execution, as :class:`horovod.core.engine.Engine` runs them), execution itself (a decided batch
completes its handles; no data moves) and the transport (:mod:`~horovod.tools.simulate.transport`: frames are
the real wire bytes, carried by :class:`~horovod.tools.simulate.world.World`).
"""

from __future__ import annotations

from typing import Optional, Set

from horovod.common.extras import install_hint
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType
from horovod.core import fusion
from horovod.core.execution import complete
from horovod.core.negotiation import for_loop
from horovod.core.negotiation.base import spacing_for
from horovod.core.set_state import NEW, ProcessSets
from horovod.core.waiters import Waiters
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

    __slots__ = ("name", "rank", "done", "error")

    def __init__(self, name: str, rank: "SimRank"):
        self.name, self.rank, self.done, self.error = name, rank, False, None

    def set_result(self, _value) -> None:
        """The collective completed."""
        self._finish(None)

    def set_exception(self, error: BaseException) -> None:
        """The collective failed."""
        self._finish(error)

    def _finish(self, error: Optional[BaseException]) -> None:
        if self.done:
            raise AssertionError(f"rank {self.rank.rank}: {self.name!r} completed twice")
        self.done, self.error = True, error
        self.rank.job.handle_done(self.rank, self)


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
                    decision = self.negotiation.negotiate(self.sets[set_id], self.shutdown)
                    self._execute(self.sets[set_id], decision)
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
        if self.job.break_order == self.rank and len(batches) > 1:
            batches.reverse()       # a deliberately broken rank, for the invariant checks' own test
        executed, signature = [], []
        for batch in batches:
            response = fusion.merge(batch.responses)
            signature.append((response.op, response.names))
            with state.lock:
                entries = {name: state.entries[name] for name in response.names if name in state.entries}
            if response.op == OpType.ERROR:
                complete(state, entries, error=HorovodInternalError(response.error))
            else:
                complete(state, entries, results={})     # no data moves: every handle completes with None
                executed.extend(batch.responses)
            self.charge(self.world.cpu.name * len(response.names))
        state.cache.record(executed)
        self.job.cycle_decided(self, self.cycles, tuple(signature))
