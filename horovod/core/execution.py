"""Execution: what a negotiation decided for one process set, run on this rank's buffers, and the handles completed.

A batch of allreduces whose data came with the negotiation is folded here (:mod:`horovod.core.negotiation.inline`);
every other batch is merged into one response and executed by :func:`horovod.core.ops.execute`. An ERROR response
fails its tensors (a mismatch with :class:`TensorMismatchError`, a stall past the shutdown time with
:class:`HorovodInternalError`) and the job goes on. Executed responses are recorded in the set's response cache in
the order they ran, identically on every rank.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

from horovod.common.device import is_staged
from horovod.common.exceptions import HorovodInternalError, TensorMismatchError
from horovod.common.types import OP_NAMES, OpType, Response, nbytes
from horovod.core import buggify, fusion
from horovod.core.decision import FATAL_ERROR
from horovod.core.deadlock import DEADLOCK_PREFIX
from horovod.core.device_plane import DevicePlane
from horovod.core.negotiation.base import Batch
from horovod.core.negotiation.inline import allreduce_contributions, allreduce_folded
from horovod.core.ops import Buffers, Entry, execute
from horovod.core.set_state import SetState
from horovod.transport.base import DescriptorLimitError

__all__ = ["Executor", "complete"]


def _describe(response: Response) -> str:
    """A collective as errors name it: ``ALLREDUCE of 'grad.w', 'grad.b' ...``."""
    names = ", ".join(repr(n) for n in response.names[:4]) + (" ..." if len(response.names) > 4 else "")
    return f"{OP_NAMES.get(response.op, response.op)} of {names}"


class Executor:
    """Runs decided batches for the engine; holds the persistent work buffers and what autotune scores."""

    def __init__(self, timeline, apply_set_change: Callable[[Response], Any], count_bytes: bool = False,
                 device_plane: Optional[DevicePlane] = None):
        self.timeline = timeline
        self.device_plane = device_plane
        self.buffers = Buffers()
        self.joined = False             # this rank has joined and the join has not completed yet
        self.cycle_bytes = 0            # bytes allreduced since autotune last took them
        self._count_bytes = count_bytes
        self._apply_set_change = apply_set_change

    def mark_joined(self) -> None:
        """This rank has joined: it contributes zeros to allreduces until the join completes."""
        self.joined = True

    def take_cycle_bytes(self) -> int:
        """The bytes allreduced since the last call (what autotune scores)."""
        taken, self.cycle_bytes = self.cycle_bytes, 0
        return taken

    def run(self, state: SetState, batches: List[Batch]) -> None:
        """Execute ``state``'s batches in order and record them in its response cache."""
        executed: List[Response] = []
        for batch in batches:
            self._run_batch(state, batch, executed)
        state.cache.record(executed)

    def _run_batch(self, state: SetState, batch: Batch, executed: List[Response]) -> None:
        if buggify.ON and buggify.fires("execution.slow"):
            buggify.stall()
        response = fusion.merge(batch.responses)
        with state.lock:
            entries = {name: state.entries[name] for name in response.names if name in state.entries}
        if response.op == OpType.ERROR:
            fatal = response.payload == (FATAL_ERROR,)
            text = response.error
            if text.startswith(DEADLOCK_PREFIX):
                text += "\n" + _thread_stacks()      # every rank raises it naming the file of its own stacks
            complete(state, entries, error=(HorovodInternalError if fatal else TensorMismatchError)(text))
            return
        if response.op == OpType.JOIN:
            self.joined = False
            with state.lock:
                entries = {"join": state.entries["join"]} if "join" in state.entries else {}
        tl = self.timeline
        if tl is not None:
            tl.start(response)
        if batch.folded is not None or batch.contributions is not None:
            if tl is not None:
                tl.activity(response, "NEGOTIATED_DATA_ALLREDUCE")
            results = allreduce_folded(response, entries, batch.folded) if batch.folded is not None else \
                allreduce_contributions(response, entries, batch.contributions, self.buffers)
        else:
            results = self._execute(state, response, entries)
        if tl is not None:
            tl.end(response)
        if response.op in (OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
            results = {name: self._apply_set_change(response) for name in results}
        complete(state, entries, results=results)
        executed.extend(batch.responses)
        if self._count_bytes and response.op == OpType.ALLREDUCE:
            self.cycle_bytes += sum(nbytes(response.dtype, shape) for shape in response.shapes)


    def _execute(self, state: SetState, response: Response, entries: Dict[str, Entry]) -> Dict[str, Any]:
        """Run a negotiated response on the data plane its device kind names: the job's device plane, or the CPU
        algorithms (host tensors, and device tensors staged through host memory)."""
        tl, group = self.timeline, state.group
        activity = (lambda name: tl.activity(response, name)) if tl is not None else None
        plane = self.device_plane
        if plane is not None and response.device in plane.kinds:
            if activity is not None:
                activity(f"{plane.name.upper()}_{OP_NAMES.get(response.op, response.op)}")
            return plane.execute(response, entries, state.id, group.ranks, group.index, self._liveness(group),
                                 activity)
        if is_staged(response.device) and activity is not None:
            activity("HOST_STAGED")
        if group.transport is not None:     # so that a wait on a busy peer names the collective
            group.transport.patience.working_on(lambda: _describe(response))
        try:
            return execute(response, entries, group, self.buffers, activity)
        except DescriptorLimitError as exc:
            raise DescriptorLimitError(f"{_describe(response)}: {exc}") from None

    @staticmethod
    def _liveness(group) -> Callable[[Sequence[int]], None]:
        """What the device plane calls between its bounded waits: raises if one of ``ranks`` is lost (its
        connection in the engine's mesh closed), so that a dead rank fails the plane's collective too."""
        def check(ranks: Sequence[int]) -> None:
            transport = group.transport
            if transport is None:
                return
            me = group.ranks[group.index]
            for peer in ranks:
                if peer != me:
                    transport.check_open(peer)
        return check


def _thread_stacks() -> str:
    """This process's Python threads and where each one is (a line per frame, outermost first), for a deadlock's
    error, written to a file of their own (readable by this user only) so that the error stays a few lines: the
    one line returned names the file. The caller blocked in the collective is among them (it may be running the
    loop itself)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    where = f"pid {os.getpid()} on {os.uname().nodename}"
    parts = [f"Stacks of this rank's process ({where}):"]
    for ident, frame in sys._current_frames().items():
        parts.append(f"  thread {names.get(ident, ident)}:")
        parts.extend(f"    {entry.filename}:{entry.lineno} in {entry.name}" for entry in traceback.extract_stack(frame))
    try:
        import tempfile     # (only here: the import costs every rank's start-up ~10 ms of CPU)
        fd, path = tempfile.mkstemp(prefix=f"horovod-stacks-{os.getpid()}-", suffix=".txt")
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(parts) + "\n")
    except OSError as exc:       # no writable temporary directory: say so in the same one line
        return f"Thread stacks of this process ({where}) could not be written to a file: {exc}"
    return f"Thread stacks of this process ({where}): {path}"


def complete(state: SetState, entries: Dict[str, Entry], results: Optional[Dict[str, Any]] = None,
             error: Optional[BaseException] = None) -> None:
    """Hand each entry its result (or ``error``) and forget it in ``state``."""
    with state.lock:
        for name in entries:
            state.entries.pop(name, None)
    for name, entry in entries.items():
        if error is not None:
            entry.handle.set_exception(error)
        else:
            entry.handle.set_result(results.get(name))
