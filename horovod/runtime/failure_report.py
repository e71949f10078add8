"""Tell the launcher how this rank failed: an exception that reaches the top of the program is recorded in the job's
rendezvous store (:mod:`horovod.common.failure_records`) before Python prints it and the process winds down.

Installed by ``hvd.init()`` in workers that a launcher started (``horovodrun``, ``horovod.run``, the Ray and Spark
backends: ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` is set), not in elastic workers, whose failures are the elastic driver's
business. The hook chains to the one it replaces, so the traceback is printed as always. When the program ends
normally, a "finished" record goes out before ``hvd.shutdown()`` releases the others, so that a rank that ended while
others still waited for it is named as such. Publishing is bounded by a short timeout and never raises: a launcher
that is gone only loses the record.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import threading
from typing import Callable, Optional

from horovod.common.failure_records import SCOPE, describe_exception, finished_record
from horovod.common.rendezvous_client import RendezvousClient

__all__ = ["install", "uninstall", "finishing", "publish_timeout"]

publish_timeout = 2.0


@dataclasses.dataclass
class _Report:
    """Where this rank's failure goes, and the hook it chains to."""

    previous: Optional[Callable] = None                             # the excepthook ours replaced
    target: Optional[Callable[[BaseException], None]] = None        # records an uncaught exception
    finish: Optional[Callable[[], None]] = None                     # records a normal end


# Outlives shutdown() on purpose: the launcher that started this process, not one init, wants its account. An
# exception after hvd.shutdown() still fails the rank, and the "finished" record goes out at the program's end,
# after any shutdown; the excepthook, once chained, stays for the life of the process.
_report = _Report()


def _hook(kind, error, tb) -> None:
    target = _report.target
    if target is not None and error is not None and not isinstance(error, KeyboardInterrupt):
        try:
            target(error)
        except Exception:  # noqa: BLE001 — reporting must never hide the exception itself
            pass
    (_report.previous or sys.__excepthook__)(kind, error, tb)


def install(rank: int, addr: str, port: int, secret: bytes) -> None:
    """Record this rank's uncaught exception in the store at ``addr:port`` (replacing an earlier target)."""
    client = RendezvousClient(addr, port, secret, timeout=publish_timeout)
    _report.target = lambda error: client.put(SCOPE, str(rank), describe_exception(rank, error).encode())  # noqa: E731
    _report.finish = lambda: client.put(SCOPE, f"{rank}.finished", finished_record(rank).encode())  # noqa: E731
    if sys.excepthook is not _hook:
        _report.previous = sys.excepthook
        sys.excepthook = _hook
        _at_main_thread_end(finishing)


def _at_main_thread_end(func: Callable[[], None]) -> None:
    # When the program ends, before the atexit callbacks (hvd.shutdown among them) stop the engine and release the
    # others: threading's own exit hooks run first. Plain atexit where that hook does not exist.
    register = getattr(threading, "_register_atexit", None)
    try:
        (register or atexit.register)(func)
    except RuntimeError:  # interpreter already shutting down
        pass


def finishing() -> None:
    """Record that this rank shuts Horovod down normally (``hvd.shutdown()``, at exit too): if another rank still
    waits for a collective, the launcher can say that this rank finished while it waited. Never raises."""
    finish = _report.finish
    if finish is not None and sys.exc_info()[0] is None:
        try:
            finish()
        except Exception:  # noqa: BLE001 — a launcher that is gone only loses the record
            pass


def uninstall() -> None:
    """Stop recording (the hook stays chained but does nothing)."""
    _report.target = _report.finish = None
