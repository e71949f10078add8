"""The background engine: one thread per process that negotiates, fuses and executes collectives.

Callers only enqueue (:meth:`Engine.submit` returns a :class:`Handle`). In a cycle the thread, for each process set
this rank belongs to (in id order, identically on every rank, so one connection per rank pair carries everything in
a fixed order): sends its new requests to the set's coordinator (cached ones as bits), receives the batches to
execute, executes them, and records them in the response cache. A lost peer ends the loop: every pending and future
handle fails with :class:`HorovodInternalError`.

Cycles happen on demand: rank 0 starts one (a GO frame to every rank) when it has work or when another rank asked
(a WANT frame, sent when that rank has work). New requests start a cycle at once; while ranks merely wait for each
other, cycles are spaced by ``HOROVOD_CYCLE_TIME``. An idle job exchanges nothing and burns no CPU, and a lone tensor
starts moving at once instead of waiting for the next tick. Tensors submitted while a cycle runs are fused in the
next one, so batching adapts to how long a cycle takes. Up to 4 ranks with a core each (``HOROVOD_NEGOTIATION``)
there is no rank 0 in the middle: every rank sends its requests to every other rank and all members decide alike
(``core/peer_negotiation.py``).

"The thread" is usually the engine thread, but a thread that blocks on a handle while the engine thread sleeps runs
the loop itself until its handle completes: a blocking collective then costs no thread hand-off (two scheduler
wake-ups, a fifth of a small allreduce here). While callers wait for every result the engine thread parks, deaf to
peers, so that their frames wake only the caller waiting for them; parked, it still looks at everything every batch
spacing, and at once when a submission or a poll asks.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from horovod.common.exceptions import HorovodInternalError, TensorMismatchError
from horovod.common.types import OpType, Request, Response, nbytes
from horovod.core import fusion
from horovod.core.controller import FATAL_ERROR, IDLE, NEW, PENDING, Message
from horovod.core import handles
from horovod.core.handles import Handle
from horovod.core.ops import Buffers, Entry, allreduce_contributions, execute
from horovod.core.peer_negotiation import PeerNegotiation, oversubscribed, peer_negotiation
from horovod.core.star_negotiation import StarNegotiation
from horovod.core.set_state import SetState, close_segments
from horovod.transport import shm

log = logging.getLogger("horovod")

# Cycles that nobody waits for (a backward pass submitting gradients one by one) are spaced by at least this much
# unless HOROVOD_CYCLE_TIME is set: each cycle costs every rank a few wake-ups, a CPU-bound training step loses that
# time, and a few milliseconds let a burst of gradients fuse into one buffer. A caller waiting for a result never
# waits for it.
_BATCH_SPACING_SECONDS = 0.010
# While a caller blocks on a result, the loop polls its sockets for shm.spin_seconds(local ranks) before it sleeps in
# select: a frame from a peer then costs no scheduler wake-up (20-40 us on a virtual machine), about a fifth of a
# small allreduce. Only where every local rank has a core of its own, as for the shared-memory barriers.
# A parked engine thread (see _select) looks at its peers at least this rarely, even under a tiny explicit
# HOROVOD_CYCLE_TIME: each look is a wake-up, and parking happens exactly when callers run the loop themselves.
_MIN_PARK_SECONDS = 0.001
# A caller about to wait takes the loop if the engine thread lets go of it within this long (it does whenever it
# sleeps in select): a busy engine thread is never made to wait, and the caller sleeps on its handle instead.
_DRIVE_WAIT_SECONDS = 0.0005


SHUT_DOWN_MESSAGE = ("Horovod has been shut down. This was caused by an exception on one of the ranks or an "
                     "attempt to run a collective after hvd.shutdown().")


def _shorter(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """The shorter of two select timeouts, None being forever."""
    if a is None:
        return b
    return a if b is None else min(a, b)


class _LoopEnded(Exception):
    """The loop ended on another thread while the engine thread slept."""


class Engine(PeerNegotiation, StarNegotiation):
    """Negotiates and executes collectives for one process (rank) of a job.

    The two negotiation protocols are mixins in their own modules (peer_negotiation, star_negotiation); this class
    holds the state they share, runs the loop (on its thread or a waiting caller's) and executes what they decide.
    """

    def __init__(self, config, rank: int, size: int, transport, timeline=None):
        self.config = config
        self.rank = rank
        self.size = size
        self.transport = transport
        self.timeline = timeline
        self._sets: Dict[int, SetState] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._notified = False
        self._shutdown = False
        self._stopped = False                   # the loop has ended; set before pending handles are failed
        self._error: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._buffers = Buffers()
        self._joined = False
        self._next_set_id = 1
        self._presented = False                 # a follower sent its global-set message before the cycle started
        self._early: Dict[int, tuple] = {}      # rank 0: those messages, by rank, until the cycle reads them
        self._reply: Optional[tuple] = None     # a follower: the global set's reply that started this cycle
        self._early_names: Dict[int, set] = {}  # rank 0: names each early message announces, until the cycle
        self._early_urgent = False              # rank 0: an early message carries a join or shutdown
        self._blocked = 0                       # threads of this process blocked on a handle
        self._blocked_lock = threading.Lock()
        self._waited = False                    # a thread blocked on a handle since the last cycle start
        self._polled = False                    # ... or polled one (peer negotiation: a frame is due at once)
        self._waited_before = False             # ... since the start of the cycle before the current one
        self._queued_since: Optional[float] = None   # a follower: when the global set's queue became non-empty
        # Whoever runs the loop holds this: the engine thread, except while it sleeps in select; then a waiting
        # caller may run the loop itself (_drive_for).
        self._loop_lock = threading.Lock()
        self._loop_ended = False
        self._drives = 0                        # how many times a waiting thread took the loop
        self._parked = False                    # the engine thread sleeps deaf to peers (see _select)
        self._driver_sleeping = False           # the waiting thread running the loop sleeps in select
        self._wanted = IDLE                    # rank 0: the most urgent cycle request read from a follower
        self._asked = IDLE                     # a follower: what it asked rank 0 for since the last cycle
        self._last_start = float("-inf")        # rank 0: when the last cycle started
        self._peer_fds: Dict[int, int] = {}
        self._coordinator_fd: Optional[int] = None
        self.cycle_time = config.cycle_time / 1000.0
        # Left at its default, the cycle time spaces batching cycles by at least _BATCH_SPACING_SECONDS (below).
        self._default_spacing = not config.is_explicit("HOROVOD_CYCLE_TIME")
        # Decided alike on every rank (same size and settings), before any set is made: under peer negotiation
        # every member of a set runs its coordinator.
        self._peer_mode = peer_negotiation(config, size, oversubscribed(transport))
        self._inbox: Dict[int, tuple] = {}      # peer negotiation: each peer's frame for the coming cycle
        self._inbox_since: Optional[float] = None
        self._frames: Dict[int, tuple] = {}     # ... and for the cycle that runs
        self._own: Dict[int, Message] = {}      # ... and what this rank sent for it, by set id
        self._own_clock = 0.0
        self._cycle_bytes = 0
        self._spin = 0.0            # set at start, once the ranks' hosts are known
        self.autotuner = None
        if config.autotune and rank == 0:
            from horovod.autotune import Autotuner
            self.autotuner = Autotuner(config, self._apply_tuning)
        self.on_process_sets_changed: Optional[Callable[[int, Optional[Tuple[int, ...]]], None]] = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def add_static_set(self, set_id: int, ranks: Sequence[int]) -> None:
        self._sets[set_id] = self._new_set(set_id, ranks)
        self._next_set_id = max(self._next_set_id, set_id + 1)

    def _new_set(self, set_id: int, ranks: Sequence[int]) -> SetState:
        state = SetState(set_id, ranks, self.rank, self.transport, self.config, self._callers_wait,
                         every_member_coordinates=self._peer_mode)
        if state.coordinator is not None:
            state.coordinator.track_arrivals = self.timeline is not None
        return state

    def start(self) -> None:
        if 0 not in self._sets:
            self.add_static_set(0, range(self.size))
        if self._peer_mode:
            self._peer_fds = {self.transport.fileno(p): p for p in range(self.size) if p != self.rank}
        elif self.rank == 0:
            self._peer_fds = {self.transport.fileno(p): p for p in range(1, self.size)}
        else:
            self._coordinator_fd = self.transport.fileno(0)
        handles.set_blocking_hook(self._on_blocking)
        handles.set_driver(self._drive_for)
        hostnames = getattr(self.transport, "hostnames", None)
        if hostnames:
            self._spin = shm.spin_seconds(sum(1 for host in hostnames if host == hostnames[self.rank]))
        self._thread = threading.Thread(target=self._run, name="horovod-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ask every rank to stop at the next cycle and wait for this rank's loop to end."""
        self._shutdown = True
        self._notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.transport.close() if self.transport is not None else None
                self._thread.join(5.0)

    @property
    def running(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._error is None
                and not self._loop_ended)

    @property
    def error(self) -> Optional[str]:
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
        state = self._sets.get(process_set_id)
        if state is None:
            raise ValueError(f"process set {process_set_id} is not registered on rank {self.rank}")
        if state.index < 0:
            raise ValueError(f"rank {self.rank} is not a member of process set {process_set_id} "
                             f"(ranks {list(state.ranks)})")
        handle = Handle(request.name)
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
        if not self._parked:
            self._notify()      # (a parked loop looks soon anyway; the caller who waits runs it at once)
        if self.timeline is not None:
            self.timeline.enqueued(request)
        return handle

    def set_ranks(self, set_id: int) -> Optional[Tuple[int, ...]]:
        state = self._sets.get(set_id)
        return None if state is None else state.ranks

    def set_ids(self) -> Dict[int, Tuple[int, ...]]:
        sets = dict(self._sets)     # a copy in one step: the loop may add or remove sets meanwhile
        return {i: s.ranks for i, s in sorted(sets.items())}

    def _on_blocking(self, delta: int) -> None:
        if delta:
            with self._blocked_lock:
                self._blocked += delta
        if delta >= 0:
            self._waited = True
            self._polled = self._polled or delta == 0
            if self.rank == 0 or self._parked or not self._presented and (self._peer_mode or self._sets[0].queue):
                self._notify()     # rank 0 may start the cycle, a follower may announce its requests

    def _callers_wait(self) -> bool:
        return self._blocked > 0

    # -- the loop --------------------------------------------------------------------------------------------------

    def _notify(self) -> None:
        if not self._notified:
            self._notified = True
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def _select(self, fds: list, timeout: Optional[float]) -> list:
        """``select`` for reading on behalf of the loop.

        The engine thread lends the loop out while it sleeps, so that a waiting caller can run it; what it saw
        readable may then be gone, so it looks again.
        """
        if threading.current_thread() is not self._thread:
            # A waiting caller runs the loop: it sleeps here itself, where an interrupt leaves nothing half done
            # (the flag stays set when one propagates, for _drive_for to see).
            self._driver_sleeping = True
            readable = self._poll(fds, timeout)
            self._driver_sleeping = False
            return readable
        # Latency-bound (callers wait for every result, and will run the loop themselves): park instead, deaf
        # to peers' frames, whose arrival would wake this thread for nothing and make their sender pay for the
        # wake-up. Parked, it looks at everything every batch spacing, or when a submission or a poll asks.
        park = (self._waited or self._waited_before) and (self._blocked == 0 or self._work() == IDLE)
        drives = self._drives
        self._loop_lock.release()
        try:
            if park:
                self._parked = True
                try:
                    select.select([self._wake_r], [], [], _shorter(timeout, max(self._batch_spacing(),
                                                                                   _MIN_PARK_SECONDS)))
                finally:
                    self._parked = False
                readable = None
            else:
                readable = self._poll(fds, timeout)
        except (OSError, ValueError):
            readable = None     # a caller ended the loop and closed what we waited on
        finally:
            self._loop_lock.acquire()
        if self._loop_ended:
            raise _LoopEnded()
        if readable is None or self._drives != drives:
            readable = select.select(fds, [], [], 0)[0]
        return readable

    def _poll(self, fds: list, timeout: Optional[float]) -> list:
        """``select`` for reading; polls first for a moment while a caller waits (``self._spin``)."""
        if self._spin and (self._blocked > 0 or self._presented and (self._waited or self._waited_before)) \
                and (timeout is None or timeout > 0) and self._work() != IDLE:
            now = time.monotonic()
            end = now + (self._spin if timeout is None else min(self._spin, timeout))
            while now < end:
                readable = select.select(fds, [], [], 0)[0]
                if readable:
                    return readable
                now = time.monotonic()
            if timeout is not None:
                timeout = max(0.0, timeout - self._spin)
        return select.select(fds, [], [], timeout)[0]

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self._notified = False

    def _work(self) -> int:
        """NEW when requests wait to be negotiated (or shutdown), PENDING when only answers are awaited."""
        if self._shutdown:
            return NEW
        pending = IDLE
        for state in self._sets.values():
            if state.index >= 0:
                if state.queue:
                    return NEW
                if state.entries:
                    pending = PENDING
        return pending

    def _run(self) -> None:
        """The engine thread: run the loop, except while a waiting caller runs it (see :meth:`_drive_for`)."""
        try:
            with self._loop_lock:
                self._run_steps(lambda: False)
        finally:
            self._end_loop(None)
            self._wake_r.close()
            self._wake_w.close()

    def _run_steps(self, done: Callable[[], bool]) -> None:
        """Run the loop's steps (holding the loop lock) until ``done()`` or the loop ends; a failure ends it."""
        step = self._peer_step if self._peer_mode else self._drive_step if self.rank == 0 else self._follow_step
        try:
            while not done() and not self._loop_ended:
                if step():
                    self._end_loop(None)
        except _LoopEnded:
            pass
        except HorovodInternalError as exc:
            self._end_loop(str(exc))
        except Exception as exc:  # a bug must fail the job loudly, never hang it
            log.exception("Horovod loop failed")
            self._end_loop(f"Horovod background loop failed on rank {self.rank}: {exc!r}")

    def _end_loop(self, error: Optional[str]) -> None:
        """The loop ends (shutdown or failure): fail what is pending; every later submission fails at once."""
        if self._loop_ended:
            return
        if error is not None and self._error is None:
            self._error = error
        if handles._blocking_hook == self._on_blocking:
            handles.set_blocking_hook(None)
            handles.set_driver(None)
        if self.transport is not None:
            self.transport.close()
        self._fail_all(self._error or SHUT_DOWN_MESSAGE)
        for state in list(self._sets.values()):
            close_segments(state)
        self._loop_ended = True
        self._notify()      # an engine thread asleep in select learns of it

    def _drive_for(self, handle: Handle) -> bool:
        """Run the loop on this (waiting) thread until ``handle`` completes, if the engine thread sleeps.

        A blocking collective then costs no thread hand-off: the engine thread would wake up to negotiate and
        execute, and the caller would wake up again to take the result (20-40 us each on a virtual machine). The
        loop is taken when free or freed within half a millisecond (the engine thread lets go of it whenever it
        sleeps), so a busy engine thread keeps its pace.
        """
        if self._loop_ended or self._thread is None or threading.current_thread() is self._thread \
                or not self._loop_lock.acquire(timeout=_DRIVE_WAIT_SECONDS):
            return False
        with self._blocked_lock:
            self._blocked += 1
        self._waited = True
        self._drives += 1
        try:
            self._run_steps(lambda: handle.finished)
        except BaseException:
            # KeyboardInterrupt (or SystemExit) on the waiting thread. Asleep in select, the loop is whole and the
            # engine thread takes it over; anywhere else a frame or a collective may be half done, and the ranks
            # can no longer agree on what comes next: fail every collective, here and (as the connections close)
            # on the other ranks, instead of letting them hang or read garbage.
            if self._driver_sleeping:
                self._notify()
            else:
                self._end_loop(f"rank {self.rank} was interrupted in the middle of a collective")
            raise
        finally:
            self._driver_sleeping = False
            with self._blocked_lock:
                self._blocked -= 1
            self._loop_lock.release()
        return handle.finished

    def _batch_spacing(self) -> float:
        return max(self.cycle_time, _BATCH_SPACING_SECONDS) if self._default_spacing else self.cycle_time

    def _apply_tuning(self, fusion_threshold: int, cycle_time_ms: float) -> None:
        """Autotune's choice; both knobs act on rank 0 only (it plans fusion and starts cycles)."""
        self.cycle_time = cycle_time_ms / 1000.0
        self._default_spacing = False
        for state in list(self._sets.values()):
            if state.coordinator is not None:
                state.coordinator.fusion_threshold = fusion_threshold

    def _fail_all(self, message: str) -> None:
        self._stopped = True
        for state in list(self._sets.values()):
            with state.lock:
                entries, state.entries, state.queue = state.entries, {}, []
            for entry in entries.values():
                entry.handle.set_exception(HorovodInternalError(message))

    def _cycle(self) -> bool:
        """One negotiation and execution round over every set; True when the job shuts down."""
        if self.timeline is not None:
            self.timeline.cycle_start()
        if self.autotuner is not None:
            self.autotuner.record(self._cycle_bytes)
            self._cycle_bytes = 0
        for set_id in sorted(self._sets):
            state = self._sets.get(set_id)
            if state is None or state.index < 0:
                continue
            shutdown, batches = self._negotiate(state, self._shutdown if set_id == 0 else False)
            self._execute(state, batches)
            if shutdown:
                return True
        return False

    def _negotiate(self, state: SetState, shutdown: bool) -> Tuple[bool, List[List[Response]]]:
        return self._decide(state) if self._peer_mode else self._negotiate_star(state, shutdown)

    def _execute(self, state: SetState, batches: List[List[Response]]) -> None:
        executed: List[Response] = []
        for batch in batches:
            if state.inline and batch[0].op == OpType.ALLREDUCE:
                # Tensors whose data every member sent along are folded here; the rest of the batch runs as usual.
                folded, contributions, batch = state.split_inline(batch)
                if folded:
                    self._run_batch(state, folded, executed, contributions)
                if not batch:
                    continue
            self._run_batch(state, batch, executed)
        state.cache.record(executed)

    def _run_batch(self, state: SetState, batch: List[Response], executed: List[Response],
                   contributions: Optional[List[bytes]] = None) -> None:
        response = fusion.merge(batch)
        with state.lock:
            entries = {name: state.entries[name] for name in response.names if name in state.entries}
        if response.op == OpType.ERROR:
            if state.inline:
                state.drop_inline(response.names)
            fatal = response.payload == (FATAL_ERROR,)
            self._complete(state, entries, error=(HorovodInternalError if fatal else TensorMismatchError)(
                response.error))
            return
        if response.op == OpType.JOIN:
            self._joined = False
            with state.lock:
                entries = {"join": state.entries["join"]} if "join" in state.entries else {}
        tl = self.timeline
        if tl is not None:
            tl.start(response)
        if contributions is not None:
            if tl is not None:
                tl.activity(response, "NEGOTIATED_DATA_ALLREDUCE")
            results = allreduce_contributions(response, entries, contributions, self._buffers)
        else:
            results = execute(response, entries, state.group, self._buffers,
                              (lambda activity: tl.activity(response, activity)) if tl is not None else None)
        if tl is not None:
            tl.end(response)
        if response.op in (OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
            results = {name: self._apply_set_change(response) for name in results}
        self._complete(state, entries, results=results)
        executed.extend(batch)
        if self.autotuner is not None and response.op == OpType.ALLREDUCE:
            self._cycle_bytes += sum(nbytes(response.dtype, shape) for shape in response.shapes)

    def _complete(self, state: SetState, entries: Dict[str, Entry], results=None, error=None) -> None:
        with state.lock:
            for name in entries:
                state.entries.pop(name, None)
        for name, entry in entries.items():
            if error is not None:
                entry.handle.set_exception(error)
            else:
                entry.handle.set_result(results.get(name))

    def _apply_set_change(self, response: Response):
        ranks = tuple(response.payload or ())
        if response.op == OpType.ADD_PROCESS_SET:
            for set_id, state in self._sets.items():
                if state.ranks == ranks:
                    return -set_id - 1  # caller reports the duplicate
            set_id = self._next_set_id
            self._next_set_id += 1
            self._sets[set_id] = self._new_set(set_id, ranks)
            return set_id
        set_id = ranks[0] if ranks else -1
        removed = self._sets.pop(set_id, None) if set_id > 0 else None
        if removed is not None:
            with removed.lock:
                removed.removed = True
                entries, removed.entries = removed.entries, {}
            for entry in entries.values():
                entry.handle.set_exception(HorovodInternalError(f"process set {set_id} was removed"))
            close_segments(removed)
        return removed is not None

    def mark_joined(self) -> None:
        self._joined = True
