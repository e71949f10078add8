"""Tell the launcher how this rank failed: an exception that reaches the top of the program is recorded in the job's
rendezvous store (:mod:`horovod.common.failure_records`) before Python prints it and the process winds down.

Installed by ``hvd.init()`` in workers that a launcher started (``horovodrun``, ``horovod.run``, the Ray and Spark
backends: ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` is set), not in elastic workers, whose failures are the elastic driver's
business. The hook chains to the one it replaces, so the traceback is printed as always. Publishing is bounded by a
short timeout and never raises: a launcher that is gone only loses the record.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from horovod.common.failure_records import SCOPE, describe_exception
from horovod.common.rendezvous_client import RendezvousClient

__all__ = ["install", "uninstall", "publish_timeout"]

publish_timeout = 2.0
_previous: Optional[Callable] = None
_target: Optional[Callable[[BaseException], None]] = None


def _hook(kind, error, tb) -> None:
    target = _target
    if target is not None and error is not None and not isinstance(error, KeyboardInterrupt):
        try:
            target(error)
        except Exception:  # noqa: BLE001 — reporting must never hide the exception itself
            pass
    (_previous or sys.__excepthook__)(kind, error, tb)


def install(rank: int, addr: str, port: int, secret: bytes) -> None:
    """Record this rank's uncaught exception in the store at ``addr:port`` (replacing an earlier target)."""
    global _previous, _target
    client = RendezvousClient(addr, port, secret, timeout=publish_timeout)
    _target = lambda error: client.put(SCOPE, str(rank), describe_exception(rank, error).encode())  # noqa: E731
    if sys.excepthook is not _hook:
        _previous = sys.excepthook
        sys.excepthook = _hook


def uninstall() -> None:
    """Stop recording (the hook stays chained but does nothing)."""
    global _target
    _target = None
