"""The coordinator: which named requests are ready on every rank of a process set, and what each rank executes.

The coordinator (the set's first rank, or every member under peer negotiation) runs :meth:`Coordinator.step` once
per cycle over the :class:`~horovod.core.decision.Message` of each of the set's ranks and returns a
:class:`~horovod.core.decision.Decision`. It is a pure state machine over plain data: no sockets, no threads, no clock
of its own, so it is tested without processes. A name is ready once every rank that has not joined submitted it; its
requests are then validated (:mod:`horovod.core.validation`), a mismatch failing the op on every rank while the job
goes on. How the messages reach it (and who runs it) is the negotiation protocols' business:
:mod:`horovod.core.negotiation`.
"""

from __future__ import annotations

import operator
from typing import Dict, List, Optional, Sequence, Tuple

from horovod.common.types import OpType, Request, Response, device_kind
from horovod.core import fusion, validation
from horovod.core.deadlock import DeadlockWatch, describe
from horovod.core.decision import FATAL_ERROR, Decision, Message, StallReport
from horovod.core.response_cache import ResponseCache

__all__ = ["Coordinator"]

_IDENTICAL_OPS = frozenset({OpType.ALLREDUCE, OpType.BROADCAST, OpType.REDUCESCATTER, OpType.BARRIER})


class Coordinator:
    """Negotiation state of one process set, held by the set's first rank."""

    def __init__(self, ranks: Sequence[int], cache: ResponseCache, fusion_threshold: int,
                 disable_group_fusion: bool = False, stall_warning: float = 60.0, stall_shutdown: float = 0.0,
                 stall_check: bool = True, track_arrivals: bool = True):
        self.ranks = tuple(ranks)
        self.cache = cache
        self.fusion_threshold = fusion_threshold
        self.disable_group_fusion = disable_group_fusion
        self.stall_warning = stall_warning
        self.stall_shutdown = stall_shutdown
        self.stall_check = stall_check
        self._known: Dict[str, Dict[int, Request]] = {}      # last full request per name and rank (decodes hits)
        self._pending: Dict[str, Dict[int, Request]] = {}    # insertion order = readiness order
        self._first_seen: Dict[str, float] = {}
        self._joined: Dict[int, None] = {}
        self._last_joined = -1
        self._held: Dict[int, List[Tuple[Response, int]]] = {}
        # The steady state's fast track: a name whose ranks last agreed on the very same request (``_agreed`` holds
        # the response that agreement produced) and that comes back as cache bits needs no validation, only a count
        # of the ranks that sent it. Any full request for the name, a join or a stall moves it to the slow track.
        self._agreed: Dict[str, Response] = {}
        self._fast: Dict[str, List[int]] = {}
        self._last_stall_report = float("-inf")
        # Deadlocks fail within the stall warning time (half of it, unchanged): stalls only warn, as in Horovod.
        self._deadlock = DeadlockWatch(stall_warning / 2) if stall_check and stall_warning > 0 else None
        self.arrivals: List[Tuple[str, int, int]] = []   # (name, op, global rank) of the last step, for the timeline
        self.track_arrivals = track_arrivals     # off when no timeline reads them
        # The last fusion plan and what it was made from: a training loop makes the same tensors ready in the same
        # order every step (the same response objects, from ``_agreed``), and planning 200 of them costs ~100 us.
        self._plan_key: Optional[Tuple] = None
        self._plan_input: List[Response] = []
        self._plan: List[List[Response]] = []

    @property
    def size(self) -> int:
        """The number of ranks in the set."""
        return len(self.ranks)

    def step(self, messages: Sequence[Message], now: float) -> Decision:
        """Absorb one cycle's messages (indexed by position in the set).

        Returns:
            the batches to execute in order (lists of responses), whether the job shuts down, the stall reports
            due now, and the requests that arrived (for the timeline)
        """
        return self.step_groups([((index,), message) for index, message in enumerate(messages)], now)

    def step_groups(self, groups: Sequence[Tuple[Sequence[int], Message]], now: float) -> Decision:
        """Absorb one cycle's messages given as (positions, message): every position listed sent that message,
        and each position appears once. Equal messages cost one pass, however many ranks sent them (the tree
        negotiation gathers them so).

        Returns:
            as :meth:`step`
        """
        self.arrivals = []
        shutdown = self._absorb(groups, now)
        if self._joined and self._fast:
            for name in list(self._fast):
                self._to_slow_track(name)
        if len(self._known) > 2 * self.cache.capacity + 1024:
            self._forget_uncached()
        ready = self._ready()
        reports = self._stalls(now)
        for report in reports:
            self._to_slow_track(report.name)
        if self.stall_check and self.stall_shutdown > 0:
            ready.extend(self._stalled_out(reports))
        if self._deadlock is not None and (self._pending or self._fast) and self._deadlock.due(now):
            ready.extend(self._deadlocked(now))
        batches = self._plan_batches(ready)
        if self._joined and len(self._joined) == self.size:
            batches.append([Response(OpType.JOIN, ("join",), last_joined=self._last_joined)])
            self._joined.clear()
        return Decision.fast((batches, shutdown, reports, self.arrivals))

    def set_fusion_threshold(self, fusion_threshold: int) -> None:
        """Plan fusion up to ``fusion_threshold`` bytes from the next cycle on (autotune's choice)."""
        self.fusion_threshold = fusion_threshold

    def _absorb(self, groups: Sequence[Tuple[Sequence[int], Message]], now: float) -> bool:
        """Note every rank's cache bits and requests; True when some rank asked to shut down."""
        shutdown = False
        fast, agreed, arrivals, track = self._fast, self._agreed, self.arrivals, self.track_arrivals
        name_of = self.cache.name
        for indices, message in groups:
            shutdown = shutdown or message.shutdown
            for bit in message.hits:
                name = name_of(bit)
                arrived = fast.get(name)
                if arrived is not None:
                    arrived.extend(indices)
                elif name in agreed and name not in self._pending and not self._joined:
                    fast[name] = list(indices)
                    self._first_seen.setdefault(name, now)
                else:
                    known = self._known[name]
                    for index in indices:
                        self._add(index, known[index], now)
                    continue
                if track:
                    op = agreed[name].op
                    arrivals.extend((name, op, self.ranks[index]) for index in indices)
            for request in message.requests:
                for index in indices:
                    if request.op == OpType.JOIN:
                        self._joined[index] = None
                        self._last_joined = self.ranks[index]
                        continue
                    agreed.pop(request.name, None)
                    self._to_slow_track(request.name)
                    self._known.setdefault(request.name, {})[index] = request
                    self._add(index, request, now)
        return shutdown

    def _forget_uncached(self) -> None:
        """Only names still cached can come back as bits; forget the others (unnamed tensors never repeat)."""
        for name in [n for n in self._known if self.cache.bit(n) is None and n not in self._pending
                     and n not in self._fast]:
            del self._known[name]
            self._agreed.pop(name, None)

    def _ready(self) -> List[Tuple[Response, int]]:
        """The names every rank (that has not joined) has now submitted, with their responses and groups."""
        ready: List[Tuple[Response, int]] = []
        fast = self._fast
        if fast:
            size = self.size
            for name in [n for n, arrived in fast.items() if len(arrived) == size]:
                del fast[name]
                self._first_seen.pop(name, None)
                ready.append((self._agreed[name], -1))
        for name in list(self._pending):
            got = self._pending[name]
            if all(i in got or i in self._joined for i in range(self.size)):
                del self._pending[name]
                self._first_seen.pop(name, None)
                response = self._respond(name, got)
                ready.extend(self._release(response, got))
        return ready

    def _stalled_out(self, reports: Sequence[StallReport]) -> List[Tuple[Response, int]]:
        """Tensors stalled past the shutdown time fail on every rank (HorovodInternalError)."""
        failed: List[Tuple[Response, int]] = []
        for report in reports:
            if report.waited >= self.stall_shutdown and report.name in self._pending:
                got = self._pending.pop(report.name)
                self._first_seen.pop(report.name, None)
                failed.extend(self._release(Response(OpType.ERROR, (report.name,), error=(
                    f"Tensor {report.name!r} stalled for {report.waited:.0f} s: ranks "
                    f"{list(report.missing_ranks)} never submitted it (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)"),
                    payload=(FATAL_ERROR,)), got))
        return failed

    def _deadlocked(self, now: float) -> List[Tuple[Response, int]]:
        """When every live rank has waited too long for names nobody else submitted, they all fail with each
        rank's waiting names (:mod:`horovod.core.deadlock`)."""
        waiting = {name: list(got) for name, got in self._pending.items()}
        waiting.update(self._fast)
        found = self._deadlock.check(now, waiting, [i for i in range(self.size) if i not in self._joined])
        if found is None:
            return []
        error = describe(found[0], self.ranks, self._joined, found[1])
        for name in list(self._fast):
            self._to_slow_track(name)
        failed: List[Tuple[Response, int]] = []
        for name in list(self._pending):
            got = self._pending.pop(name)
            self._first_seen.pop(name, None)
            failed.extend(self._release(validation.error(name, error), got))
        return failed

    def _plan_batches(self, ready: List[Tuple[Response, int]]) -> List[List[Response]]:
        responses = [r for r, _ in ready]
        groups = [g if not self.disable_group_fusion else -1 for _, g in ready]
        key = (self.fusion_threshold, tuple(groups))
        if key == self._plan_key and len(responses) == len(self._plan_input) \
                and all(map(operator.is_, responses, self._plan_input)):
            return [list(batch) for batch in self._plan]
        plan = fusion.plan_batches(responses, groups, self.fusion_threshold)
        self._plan_key, self._plan_input, self._plan = key, responses, plan
        return [list(batch) for batch in plan]

    def quiet(self) -> bool:
        """Whether no other rank's submission is known here: then only this rank's join can make a name ready."""
        return not (self._pending or self._fast or self._held or self._joined)

    def waiting(self) -> bool:
        """Whether some tensor waits for ranks (or a group for its other tensors)."""
        return bool(self._pending or self._fast or self._held)

    def has(self, name: str, index: int) -> bool:
        """Whether the rank at ``index`` has submitted ``name`` (waiting here) or has joined."""
        if index in self._joined:
            return True
        pending = self._pending.get(name)
        if pending is not None and index in pending:
            return True
        arrived = self._fast.get(name)
        return arrived is not None and index in arrived

    def _to_slow_track(self, name: str) -> None:
        """Move a fast-track name to full validation, with the requests its ranks' bits stand for."""
        arrived = self._fast.pop(name, None)
        if arrived is not None:
            known = self._known[name]
            pending = self._pending.setdefault(name, {})
            for index in arrived:
                pending[index] = known[index]

    def _add(self, index: int, request: Request, now: float) -> None:
        if self.track_arrivals:
            self.arrivals.append((request.name, request.op, self.ranks[index]))
        self._pending.setdefault(request.name, {})[index] = request
        self._first_seen.setdefault(request.name, now)

    def _release(self, response: Response, got) -> List[Tuple[Response, int]]:
        """Hold grouped tensors until the whole group is done, so that the group executes together.

        A group in which any tensor failed fails as a whole: its other tensors must not wait for a partner that
        will never come.
        """
        request = next(iter(got.values()))
        group = request.group
        if group < 0:
            return [(response, group)]
        group_size = request.payload[0] if request.payload else 1
        held = self._held.setdefault(group, [])
        held.append((response, group))
        if len(held) < group_size:
            return []
        del self._held[group]
        failed = next((r.error for r, _ in held if r.error is not None), None)
        if failed is None:
            return held
        return [(r if r.error is not None else Response(
            OpType.ERROR, r.names, error=f"another tensor of its group failed: {failed}"), g) for r, g in held]

    def _stalls(self, now: float) -> List[StallReport]:
        if not self.stall_check or not self._first_seen:
            return []
        due = min(self.stall_warning, self.stall_shutdown or self.stall_warning)
        if now - self._last_stall_report < due:
            return []
        reports = []
        for name, since in self._first_seen.items():
            if now - since >= due:
                got = self._pending.get(name) or dict.fromkeys(self._fast.get(name, ()))
                missing = tuple(self.ranks[i] for i in range(self.size) if i not in got and i not in self._joined)
                reports.append(StallReport(name, missing, now - since))
        if reports:
            self._last_stall_report = now
        return reports

    def _respond(self, name: str, got: Dict[int, Request]) -> Response:
        first = got[min(got)]
        op = first.op
        if op in _IDENTICAL_OPS and len(got) == self.size and all(r == first for r in got.values()):
            # The steady state: every rank sent the very same request, nothing to compare field by field.
            response = Response(op, (name,), first.dtype, (first.shape,), first.reduce_op, first.prescale,
                                first.postscale, first.root_rank, payload=first.payload,
                                device=device_kind(first.device))
            if first.group < 0:
                self._agreed[name] = response
            return response
        return validation.respond(name, got, self.ranks, self._joined)
