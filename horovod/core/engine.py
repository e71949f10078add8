"""The background engine: one loop per process that negotiates, fuses and executes collectives.

Callers only enqueue (:meth:`Engine.submit` returns a :class:`Handle`). In a cycle the loop, for each process set
this rank belongs to (in id order, identically on every rank, so one connection per rank pair carries everything in
a fixed order), asks its negotiation what to execute, executes it, and records it in the response cache. A lost peer
ends the loop: every pending and future handle fails with :class:`HorovodInternalError`.

When a cycle starts, and how the ranks agree on its batches, is the negotiation's (:mod:`horovod.core.negotiation`:
*peer* up to 4 ranks with a core each, where every rank decides alike; *star* up to 16, where rank 0 starts cycles
only when one can make something ready; *tree* above, where messages travel a 3-ary tree to rank 0 and back). The
engine keeps the lifecycle, submission, who runs the loop, and execution.

"The loop" usually runs on the engine thread, but a thread that blocks on a handle while the engine thread sleeps runs
the loop itself until its handle completes: a blocking collective then costs no thread hand-off (two scheduler
wake-ups, a fifth of a small allreduce here). While callers wait for every result the engine thread parks, deaf to
peers, so that their frames wake only the caller waiting for them; parked, it still looks at everything every batch
spacing, and at once when a submission or a poll asks.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

from horovod.autotune import Autotuner
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import Request
from horovod.core.execution import Executor
from horovod.core.handles import Handle
from horovod.core.negotiation import for_loop
from horovod.core.negotiation.base import IDLE, NEW, POLL_SECONDS, report_stalls, spacing_for
from horovod.core.ops import Entry
from horovod.core.set_state import ProcessSets, SetState, close_segments
from horovod.core.waiters import Handback, Waiters, Wakeup, shorter, spin_select
from horovod.transport import shm

__all__ = ["Engine", "SHUT_DOWN_MESSAGE"]

log = logging.getLogger("horovod")

# While a caller blocks on a result, the loop polls its sockets for shm.spin_seconds(local ranks) before it sleeps in
# select: a frame from a peer then costs no scheduler wake-up (20-40 us on a virtual machine), about a fifth of a
# small allreduce. Only where every local rank has a core of its own, as for the shared-memory barriers.
# A parked engine thread (see Engine.select) looks at its peers at least this rarely, even under a tiny explicit
# HOROVOD_CYCLE_TIME: each look is a wake-up, and parking happens exactly when callers run the loop themselves.
_MIN_PARK_SECONDS = 0.001
# A caller about to wait takes the loop if the engine thread lets go of it within this long (it does whenever it
# sleeps in select): a busy engine thread is never made to wait, and the caller sleeps on its handle instead.
_DRIVE_WAIT_SECONDS = 0.0005


SHUT_DOWN_MESSAGE = ("Horovod has been shut down. This was caused by an exception on one of the ranks or an "
                     "attempt to run a collective after hvd.shutdown().")


class _LoopEnded(Exception):
    """The loop ended on another thread while the engine thread slept."""


class Engine:
    """Negotiates and executes collectives for one process (rank) of a job.

    It owns the lifecycle, submission, the loop (run on its thread or on a waiting caller's) and execution; when a
    cycle starts and what it executes is for its negotiation to say (``negotiation``, chosen alike on every rank).
    The negotiation reads the engine as a :class:`horovod.core.negotiation.base.Loop`.
    """

    def __init__(self, config, rank: int, size: int, transport, timeline=None, device_plane=None):
        self.config = config
        self.rank = rank
        self.size = size
        self.transport = transport
        self.timeline = timeline
        self.device_plane = device_plane        # the job's DevicePlane (core/device_plane.py), or None
        self.waiters = Waiters()
        self.wake = Wakeup()
        self.cycle_time = config.cycle_time / 1000.0
        self._cycle_time_chosen = config.is_explicit("HOROVOD_CYCLE_TIME")     # see spacing_for
        self._shutdown = False
        self._stopped = False                   # the loop has ended; set before pending handles are failed
        self._error: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        # Whoever runs the loop holds this: the engine thread, except while it sleeps in select; then a waiting
        # caller may run the loop itself (drive).
        self._loop_lock = threading.Lock()
        self._loop_ended = False
        self._drives = 0                        # how many times a waiting thread took the loop
        self._handback = Handback(POLL_SECONDS, self.batch_spacing)
        self.cycles = 0                         # cycles run so far (tests and benchmarks read it)
        self._parked = False                    # the engine thread sleeps deaf to peers (see select)
        self._driver_sleeping = False           # the waiting thread running the loop sleeps in select
        self._spin = 0.0            # set at start, once the ranks' hosts are known
        self._spin_us = config.spin_us
        # Decided alike on every rank (same size, settings and rendezvous records) before any set is made: under
        # peer negotiation every member of a set runs its coordinator.
        self.negotiation = for_loop(self, config)
        self._sets = ProcessSets(rank, transport, config, self._callers_wait,
                                 self.negotiation.every_member_coordinates, timeline is not None)
        self.sets: Dict[int, SetState] = self._sets.by_id     # the loop adds and removes sets, between cycles
        self.autotuner = Autotuner(config, self._apply_tuning) if config.autotune and rank == 0 else None
        self._executor = Executor(timeline, lambda response: self._sets.apply(response, self.negotiation.forget),
                                  count_bytes=self.autotuner is not None, device_plane=device_plane)
        self.on_process_sets_changed: Optional[Callable[[int, Optional[Tuple[int, ...]]], None]] = None
        self._patience = transport.patience if transport is not None else None  # names a wait on a busy peer

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def add_static_set(self, set_id: int, ranks: Sequence[int]) -> None:
        """Register a process set known to every rank before :meth:`start` (the global set is id 0)."""
        self._sets.add(set_id, ranks)

    def start(self) -> None:
        """Start the loop on the engine thread (after the static process sets are registered)."""
        if 0 not in self.sets:
            self.add_static_set(0, range(self.size))
        self.negotiation.start()
        hostnames = self.transport.hostnames if self.transport is not None else ()
        if hostnames:
            self._spin = shm.spin_seconds(sum(1 for host in hostnames if host == hostnames[self.rank]), self._spin_us)
        self._thread = threading.Thread(target=self._run, name="horovod-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ask every rank to stop at the next cycle and wait for this rank's loop to end."""
        self._shutdown = True
        self.wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.transport.close() if self.transport is not None else None
                self._thread.join(5.0)
        if self.autotuner is not None:
            self.autotuner.finish()         # says whether the search settled, once, on rank 0

    def shutting_down(self) -> bool:
        """Whether this rank asked the job to stop."""
        return self._shutdown

    @property
    def running(self) -> bool:
        """Whether the loop runs and has not failed."""
        return (self._thread is not None and self._thread.is_alive() and self._error is None
                and not self._loop_ended)

    @property
    def error(self) -> Optional[str]:
        """Why the loop failed, or None."""
        return self._error

    # -- submission ------------------------------------------------------------------------------------------------

    def submit(self, request: Request, array, output=None, process_set_id: int = 0) -> Handle:
        """Queue one request; returns its handle.

        Raises:
            ValueError: the name is already pending in this process set, or this rank is not in the set.
            HorovodInternalError: the engine has stopped.
        """
        if self._error is not None or self._shutdown or self._thread is None:
            raise HorovodInternalError(self._error or SHUT_DOWN_MESSAGE)
        state = self.sets.get(process_set_id)
        if state is None:
            raise ValueError(f"process set {process_set_id} is not registered on rank {self.rank}")
        if state.index < 0:
            raise ValueError(f"rank {self.rank} is not a member of process set {process_set_id} "
                             f"(ranks {list(state.ranks)})")
        handle = Handle(request.name, self)
        with state.lock:
            # Checked under the set's lock: the loop sets these under the same lock before failing what is queued.
            if self._stopped:
                raise HorovodInternalError(self._error or SHUT_DOWN_MESSAGE)
            if state.removed:
                raise ValueError(f"process set {process_set_id} has been removed")
            if request.name in state.entries:
                raise ValueError(f"Duplicate tensor name {request.name!r}: a collective with this name is already "
                                 f"pending in process set {process_set_id}; names must be unique until completed")
            state.entries[request.name] = Entry(request, array, output, handle, process_set_id)
            state.queue.append(request)
        self._handback.submitted()
        if not (self._parked or self._handback.resting):
            self.wake.notify()      # (a parked loop looks soon anyway; the caller who waits will run it at once)
        if self.timeline is not None:
            self.timeline.enqueued(request)
        return handle

    def set_ranks(self, set_id: int) -> Optional[Tuple[int, ...]]:
        """The global ranks of process set ``set_id``, or None when it is not registered."""
        state = self.sets.get(set_id)
        return None if state is None else state.ranks

    def set_ids(self) -> Dict[int, Tuple[int, ...]]:
        """Every registered process set's ranks, by id."""
        sets = dict(self.sets)     # a copy in one step: the loop may add or remove sets meanwhile
        return {i: s.ranks for i, s in sorted(sets.items())}

    def mark_joined(self) -> None:
        """This rank has joined (``hvd.join``): it contributes zeros to allreduces until the join completes."""
        self._executor.mark_joined()

    def waiting(self, delta: int) -> None:
        """A thread blocks on (+1), stops blocking on (-1) or polls (0) one of this engine's handles."""
        waiters = self.waiters
        if delta:
            waiters.add(delta)
        if delta >= 0:
            waiters.waited = True
            waiters.polled = waiters.polled or delta == 0
            self._handback.wake()
            if self._parked or self.negotiation.wake_on_wait():
                self.wake.notify()     # a cycle may start, or this rank's message be due, at once

    def _callers_wait(self) -> bool:
        return self.waiters.blocked > 0

    # -- the loop --------------------------------------------------------------------------------------------------

    def select(self, fds: list, timeout: Optional[float]) -> list:
        """``select`` for reading on behalf of the loop.

        The engine thread lends the loop out while it sleeps, so that a waiting caller can run it; what it saw
        readable may then be gone, so it looks again.

        Raises:
            _LoopEnded: the loop ended on another thread meanwhile.
        """
        if threading.current_thread() is not self._thread:
            # A waiting caller runs the loop: it sleeps here itself, where an interrupt leaves nothing half done
            # (the flag stays set when one propagates, for drive to see).
            self._driver_sleeping = True
            readable = self._poll(fds, timeout)
            self._driver_sleeping = False
            return readable
        # Latency-bound (callers wait for every result, and will run the loop themselves): park instead, deaf
        # to peers' frames, whose arrival would wake this thread for nothing and make their sender pay for the
        # wake-up. Parked, it looks at everything every batch spacing, or when a submission or a poll asks.
        waiters = self.waiters
        park = waiters.latency_bound() and (waiters.blocked == 0 or self.work() == IDLE)
        drives = self._drives
        self._loop_lock.release()
        try:
            readable = self._park(timeout) if park else self._poll(fds, timeout)
            if park:
                self._handback.rest(lambda: self._loop_ended)
        except (OSError, ValueError):
            readable = None     # a caller ended the loop and closed what we waited on
        finally:
            self._loop_lock.acquire()
        if self._loop_ended:
            raise _LoopEnded()
        if readable is None or self._drives != drives:
            readable = select.select(fds, [], [], 0)[0]
        return readable

    def _park(self, timeout: Optional[float]) -> None:
        """Sleep on the wake-up socket only, for at most the batch spacing (see :meth:`select`)."""
        self._parked = True
        try:
            select.select([self.wake.reader], [], [], shorter(timeout, max(self.batch_spacing(), _MIN_PARK_SECONDS)))
        finally:
            self._parked = False

    def _poll(self, fds: list, timeout: Optional[float]) -> list:
        """``select`` for reading; polls first for a moment while a caller waits (``self._spin``)."""
        waiters = self.waiters
        if self._spin and (waiters.blocked > 0 or self.negotiation.presented and waiters.latency_bound()) \
                and (timeout is None or timeout > 0) and self.work() != IDLE:
            return spin_select(fds, timeout, self._spin)
        return select.select(fds, [], [], timeout)[0]

    def work(self) -> int:
        """NEW when requests wait to be negotiated (or shutdown), PENDING when only answers are awaited, else IDLE."""
        return NEW if self._shutdown else self._sets.work()

    def clock(self) -> float:
        """Seconds on the OS's monotonic clock (the negotiation's only clock)."""
        return time.monotonic()

    def batch_spacing(self) -> float:
        """How long requests gather before a cycle nobody waits for."""
        return spacing_for(self.cycle_time, self._cycle_time_chosen)

    def _run(self) -> None:
        """The engine thread: run the loop, except while a waiting caller runs it (see :meth:`drive`)."""
        try:
            with self._loop_lock:
                self._run_steps(lambda: False)
        finally:
            self._end_loop(None)
            self.wake.close()

    def _run_steps(self, done: Callable[[], bool]) -> None:
        """Run cycles (holding the loop lock) until ``done()`` or the loop ends; a failure ends it."""
        try:
            while not done() and not self._loop_ended:
                self.negotiation.await_cycle()
                self.cycles += 1
                self.waiters.cycle_started()
                if self._cycle():
                    self._end_loop(None)
        except _LoopEnded:
            pass
        except HorovodInternalError as exc:
            self._end_loop(str(exc))
        except Exception as exc:  # a bug must fail the job loudly, never hang it
            log.exception("Horovod loop failed")
            account = f"Horovod background loop failed on rank {self.rank}: {exc!r}"
            if self.transport is not None:
                self.transport.fail_own(account)    # so that the others name us, and why
            self._end_loop(account)

    def _end_loop(self, error: Optional[str]) -> None:
        """The loop ends (shutdown or failure): fail what is pending; every later submission fails at once."""
        if self._loop_ended:
            return
        if error is not None and self._error is None:
            self._error = error
        if self.transport is not None:
            self.transport.close()
        if self.device_plane is not None:
            self.device_plane.close(abort=self._error is not None)
        self._stopped = True
        self._sets.fail_all(self._error or SHUT_DOWN_MESSAGE)
        for state in list(self.sets.values()):
            close_segments(state)
        self._loop_ended = True
        self.wake.notify()      # an engine thread asleep in select learns of it
        self._handback.wake()

    def drive(self, handle: Handle) -> bool:
        """Run the loop on this (waiting) thread until ``handle`` completes, if the engine thread sleeps.

        A blocking collective then costs no thread hand-off: the engine thread would wake up to negotiate and
        execute, and the caller would wake up again to take the result (20-40 us each on a virtual machine). The
        loop is taken when free or freed within half a millisecond (the engine thread lets go of it whenever it
        sleeps), so a busy engine thread keeps its pace.
        """
        if self._loop_ended or self._thread is None or threading.current_thread() is self._thread \
                or not self._loop_lock.acquire(timeout=_DRIVE_WAIT_SECONDS):
            return False
        self.waiters.add(1)
        self.waiters.waited = True
        self._drives += 1
        self._handback.taken()
        try:
            self._run_steps(lambda: handle.finished)
        except BaseException:
            # KeyboardInterrupt (or SystemExit) on the waiting thread. Asleep in select, the loop is whole and the
            # engine thread takes it over; anywhere else a frame or a collective may be half done, and the ranks
            # can no longer agree on what comes next: fail every collective, here and (as the connections close)
            # on the other ranks, instead of letting them hang or read garbage.
            if self._driver_sleeping:
                self.wake.notify()
            else:
                self._end_loop(f"rank {self.rank} was interrupted in the middle of a collective")
            raise
        finally:
            self._driver_sleeping = False
            self.waiters.add(-1)
            self._loop_lock.release()
            self._handback.left(self.work() != IDLE)
        return handle.finished

    def _apply_tuning(self, fusion_threshold: int, cycle_time_ms: float) -> None:
        """Autotune's choice; both knobs act on rank 0 only (it plans fusion and starts cycles)."""
        self.cycle_time = cycle_time_ms / 1000.0
        self._cycle_time_chosen = True
        self._sets.set_fusion_threshold(fusion_threshold)

    # -- a cycle: negotiate and execute, set by set ---------------------------------------------------------------

    def _cycle(self) -> bool:
        """One negotiation and execution round over every set; True when the job shuts down."""
        if self.timeline is not None:
            self.timeline.cycle_start()
        if self.autotuner is not None:
            self.autotuner.record(self._executor.take_cycle_bytes())
        for set_id in sorted(self.sets):
            state = self.sets.get(set_id)
            if state is None or state.index < 0:
                continue
            if self._patience is not None:     # so that a wait on a busy peer names what this rank waits for
                self._patience.working_on(state.describe_pending)
            decision = self.negotiation.negotiate(state, self._shutdown if set_id == 0 else False)
            if decision.stalls:
                report_stalls(decision.stalls)
            if self.timeline is not None:     # (rank 0's, which coordinates every set it is in)
                self.timeline.negotiated(set_id, decision.arrivals, [b.responses for b in decision.batches])
            self._executor.run(state, decision.batches)
            if decision.shutdown:
                return True
        return False
