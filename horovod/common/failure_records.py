"""What a failing worker tells its launcher, so the launcher can name the root cause of a job's failure.

When one rank raises, the others fail as a consequence a moment later (their collectives end with
:class:`~horovod.common.exceptions.HorovodInternalError`), and the order in which the launcher sees the processes
exit says little: the rank that raised may still be shutting down when a survivor has already exited. So each
worker started by a launcher records, as its exception reaches the top, a :class:`FailureRecord` in the job's
rendezvous store (scope :data:`SCOPE`, key = rank): when, what, its traceback, whether it is such a consequence, and
the collective it was waiting for. A rank that shuts Horovod down normally records that too (key ``<rank>.finished``),
since others may still wait for it. The launcher reads them after the job (:mod:`horovod.runner.diagnosis`).

Records are small JSON documents, validated when decoded.
"""

from __future__ import annotations

import dataclasses
import re
import time
import traceback as _traceback
from types import TracebackType
from typing import Any, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError

__all__ = ["SCOPE", "FailureRecord", "describe_exception", "finished_record", "waiting_for", "lost_peer",
           "MAX_TRACEBACK_CHARS"]

SCOPE = "failures"
MAX_TRACEBACK_CHARS = 16000
# How the transport names a peer it lost (``rank 2 on host 10.0.0.3 was lost: <why>``, horovod.transport.tcp).
_LOST = re.compile(r"\brank (\d+)(?: on host (\S+))? was lost(?:: (.*))?", re.DOTALL)
# How the transport names a live peer that made no progress for the busy-peer bound (horovod.transport.patience).
_STUCK = re.compile(r"\brank (\d+)(?: on host (\S+))?(?: \(rank \d+ waits on it through rank \d+\))? made no "
                    r"progress (.*)", re.DOTALL)
# How the engine words a failure of its own thread (a bug, not a lost peer): horovod.core.engine.
_ENGINE_FAILED = "Horovod background loop failed on rank {rank}:"
_HANDLE = ("horovod.core.handles", "Handle")
_REQUEST = ("horovod.common.types", "Request")


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    """One rank's failure: ``time`` is the wall clock when the exception reached the top of the rank's program."""

    rank: int
    time: float
    exc_type: str
    message: str
    traceback: str = ""
    consequence: bool = False
    waiting_for: Optional[str] = None
    finished: bool = False  # not a failure: the rank shut Horovod down normally (others may still have waited)

    def encode(self) -> bytes:
        """The record as JSON bytes."""
        import json     # (here: a rank that never fails does not pay the import at start-up)
        return json.dumps(dataclasses.asdict(self)).encode()

    @staticmethod
    def decode(data: bytes) -> "FailureRecord":
        """Parse and validate a record.

        Raises:
            ValueError: not a record.
        """
        import json
        fields = json.loads(data)
        if not isinstance(fields, dict) or set(fields) != {f.name for f in dataclasses.fields(FailureRecord)}:
            raise ValueError("not a failure record")
        record = FailureRecord(**fields)
        kinds = ((record.rank, int), (record.time, (int, float)), (record.exc_type, str), (record.message, str),
                 (record.traceback, str), (record.consequence, bool), (record.waiting_for, (str, type(None))),
                 (record.finished, bool))
        if not all(isinstance(value, kind) for value, kind in kinds):
            raise ValueError("failure record with fields of the wrong types")
        return record

    def headline(self) -> str:
        """``KeyError: 'missing'``."""
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    def lost_peer(self) -> Optional[Tuple[int, str, str]]:
        """``(rank, host, why)`` of the peer this consequence says was lost (host and why may be ""); else None."""
        return lost_peer(self.message) if self.consequence else None

    def stuck_peer(self) -> Optional[Tuple[int, str, str]]:
        """``(rank, host, what)`` of the live peer this consequence says made no progress for the busy-peer bound;
        else None."""
        if not self.consequence:
            return None
        found = _STUCK.search(self.message)
        return (int(found.group(1)), found.group(2) or "", f"made no progress {found.group(3).strip()}") \
            if found else None


def lost_peer(message: str) -> Optional[Tuple[int, str, str]]:
    """``(rank, host, why)`` when ``message`` says a peer was lost, as the transport words it; else None."""
    found = _LOST.search(message)
    if found is None:
        return None
    return int(found.group(1)), found.group(2) or "", (found.group(3) or "").strip()


def waiting_for(tb: Optional[TracebackType]) -> Optional[str]:
    """The name of the collective that failed in ``tb`` (``allreduce.grad_w``): the handle that raised, or the
    request being submitted when the engine had already stopped; None when no collective was involved."""
    name = None
    while tb is not None:
        local = tb.tb_frame.f_locals
        for candidate in (local.get("self"), local.get("request")):
            kind = type(candidate)
            if (kind.__module__, kind.__name__) in (_HANDLE, _REQUEST):
                name = getattr(candidate, "name", None)
        tb = tb.tb_next
    return name if isinstance(name, str) else None


def describe_exception(rank: int, error: BaseException, when: Optional[float] = None) -> FailureRecord:
    """The record of ``error`` raised on ``rank`` (now, unless ``when`` is given)."""
    text = "".join(_traceback.format_exception(type(error), error, error.__traceback__))
    kind = type(error)
    name = kind.__name__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    return FailureRecord(rank=rank, time=time.time() if when is None else when, exc_type=name,
                         message=_message(error), traceback=text[-MAX_TRACEBACK_CHARS:],
                         consequence=isinstance(error, HorovodInternalError)
                         and _ENGINE_FAILED.format(rank=rank) not in _message(error),
                         waiting_for=waiting_for(error.__traceback__))


def finished_record(rank: int, when: Optional[float] = None) -> FailureRecord:
    """The record of ``rank`` shutting Horovod down normally (now, unless ``when`` is given)."""
    return FailureRecord(rank=rank, time=time.time() if when is None else when, exc_type="", message="",
                         finished=True)


def _message(error: Any) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 — a user exception whose __str__ fails
        return repr(type(error))
