"""The timeline: a Chrome-trace JSON file of negotiation and execution, written by rank 0 as Horovod writes it.

Each tensor gets its own ``pid`` row (named after the tensor). Negotiation is a ``NEGOTIATE_<OP>`` span with one
zero-length event per rank as it becomes ready; execution is an ``<OP>`` span with nested activities
(``MEMCPY_IN_FUSION_BUFFER``, ``RING_ALLREDUCE``, ...). ``HOROVOD_TIMELINE_MARK_CYCLES`` adds ``CYCLE_START``
instants. A writer thread drains a queue; after every flush (at most every 100 ms) the file is a valid JSON array.
``HOROVOD_TIMELINE=DYNAMIC`` starts with no file, and ``hvd.start_timeline``/``stop_timeline`` switch files.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Dict, Optional

from horovod.common.safe_files import open_for_writing
from horovod.common.types import OP_NAMES

__all__ = ["Timeline", "from_config"]

_FLUSH_SECONDS = 0.1


class _Writer(threading.Thread):
    def __init__(self, path: str):
        super().__init__(name="horovod-timeline", daemon=True)
        import queue     # (here, as json below: a job without a timeline does not pay their imports at start-up)
        self.path = path
        self.records: "queue.SimpleQueue[Optional[dict]]" = queue.SimpleQueue()
        self._file = open_for_writing(path, "the timeline")     # /tmp/timeline.json: no symlink followed
        self._file.write("[\n]")
        self._file.flush()
        self._first = True

    def run(self) -> None:
        import queue
        stop = False
        while not stop:
            batch = []
            try:
                item = self.records.get(timeout=_FLUSH_SECONDS)
                while True:
                    if item is None:
                        stop = True
                        break
                    batch.append(item)
                    item = self.records.get_nowait()
            except queue.Empty:
                pass
            if batch:
                self._write(batch)
        self._file.close()

    def _write(self, batch) -> None:
        # Overwrite the closing bracket, append, and close the array again: valid JSON after every flush.
        self._file.seek(self._file.tell() - 1)
        import json
        text = ",\n".join(json.dumps(r, separators=(",", ":")) for r in batch)
        self._file.write(("" if self._first else ",\n") + text + "\n]")
        self._first = False
        self._file.flush()


class Timeline:
    """Records engine events for the tensors coordinated on this rank."""

    def __init__(self, path: Optional[str], mark_cycles: bool = False):
        self._start = time.monotonic()
        self._epoch_us = int(time.time() * 1e6)
        self._writer: Optional[_Writer] = None
        self._pids: Dict[str, int] = {}
        self._negotiating: Dict[str, bool] = {}
        self._activity: Dict[str, Optional[str]] = {}
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        if path:
            self.start_file(path, mark_cycles)

    # -- files -----------------------------------------------------------------------------------------------------

    def start_file(self, path: str, mark_cycles: bool = False) -> None:
        """Start writing a timeline file at ``path`` (closing the current one); ``mark_cycles`` marks cycles."""
        with self._lock:
            self._close_writer()
            self.mark_cycles = mark_cycles
            self._pids.clear()
            self._negotiating.clear()
            self._activity.clear()
            self._writer = _Writer(os.path.abspath(path))
            self._writer.start()
            self._emit({"name": "process_name", "ph": "M", "pid": 0,
                        "args": {"name": "Horovod", "start_time_since_epoch_in_micros": self._epoch_us}})
            self._emit({"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}})

    def stop_file(self) -> None:
        """Stop writing; the file is complete JSON."""
        with self._lock:
            self._close_writer()

    def close(self) -> None:
        """Stop writing (as :meth:`stop_file`)."""
        self.stop_file()

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.records.put(None)
            self._writer.join(5.0)
            self._writer = None

    # -- events ----------------------------------------------------------------------------------------------------

    def _ts(self) -> int:
        return int((time.monotonic() - self._start) * 1e6)

    def _emit(self, record: dict) -> None:
        if self._writer is not None:
            self._writer.records.put(record)

    def _pid(self, name: str) -> int:
        pid = self._pids.get(name)
        if pid is None:
            pid = len(self._pids) + 1
            self._pids[name] = pid
            self._emit({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
            self._emit({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return pid

    def cycle_start(self) -> None:
        """Mark the start of a cycle, when asked to (``HOROVOD_TIMELINE_MARK_CYCLES``)."""
        if self.mark_cycles and self._writer is not None:
            self._emit({"name": "CYCLE_START", "ph": "i", "ts": self._ts(), "s": "g", "pid": 0})

    def enqueued(self, request) -> None:
        """Submission is not drawn; negotiation starts when the coordinator first sees the tensor."""

    def rank_ready(self, name: str, op: int, rank: int) -> None:
        """Record that ``rank`` submitted ``name`` (the first one opens the negotiation span)."""
        if self._writer is None:
            return
        pid = self._pid(name)
        ts = self._ts()
        if name not in self._negotiating:
            self._negotiating[name] = True
            self._emit({"name": f"NEGOTIATE_{OP_NAMES.get(op, op)}", "ph": "B", "ts": ts, "pid": pid, "tid": 0})
        self._emit({"name": str(rank), "ph": "X", "ts": ts, "dur": 0, "pid": pid, "tid": 0})

    def negotiated(self, set_id: int, arrivals, batches) -> None:
        """``arrivals``: (name, op, global rank) seen this cycle by the coordinator; batches: what became ready."""
        if self._writer is None:
            return
        for name, op, rank in arrivals:
            self.rank_ready(name, op, rank)
        ts = self._ts()
        for batch in batches:
            for response in batch:
                for name in response.names:
                    if self._negotiating.pop(name, None):
                        self._emit({"ph": "E", "ts": ts, "pid": self._pid(name), "tid": 0})

    def start(self, response) -> None:
        """Open the execution span of each tensor of ``response``."""
        if self._writer is None:
            return
        ts = self._ts()
        for name in response.names:
            self._activity[name] = None
            self._emit({"name": OP_NAMES.get(response.op, response.op), "ph": "B", "ts": ts,
                        "pid": self._pid(name), "tid": 0})

    def activity(self, response, activity: str) -> None:
        """Start phase ``activity`` (ending the previous one) for each tensor of ``response``."""
        if self._writer is None:
            return
        ts = self._ts()
        for name in response.names:
            pid = self._pid(name)
            if self._activity.get(name):
                self._emit({"ph": "E", "ts": ts, "pid": pid, "tid": 0})
            self._activity[name] = activity
            self._emit({"name": activity, "ph": "B", "ts": ts, "pid": pid, "tid": 0})

    def end(self, response) -> None:
        """Close the execution spans of ``response``'s tensors, with their dtype and shape."""
        if self._writer is None:
            return
        ts = self._ts()
        for name, shape in zip(response.names, response.shapes or [()] * len(response.names)):
            pid = self._pid(name)
            if self._activity.pop(name, None):
                self._emit({"ph": "E", "ts": ts, "pid": pid, "tid": 0})
            self._emit({"ph": "E", "ts": ts, "pid": pid, "tid": 0,
                        "args": {"dtype": response.dtype, "shape": list(shape)}})


def from_config(config, rank: int) -> Optional[Timeline]:
    """The timeline for this rank: rank 0 only, when ``HOROVOD_TIMELINE`` is set (``DYNAMIC``: no file yet)."""
    if rank != 0 or not config.timeline:
        return None
    path = None if config.timeline == "DYNAMIC" else config.timeline
    return Timeline(path, config.timeline_mark_cycles)
