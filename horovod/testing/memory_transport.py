"""An in-memory transport between threads, for running algorithms without processes and counting their bytes.

:class:`MemoryTransport` implements the bytes part of :class:`horovod.transport.base.Transport` (``send``, ``isend``,
``recv_into``) over unbounded pipes, so sends never block, and counts the bytes each rank sends.
:func:`run_threads` runs a function on one thread per rank, each with its :class:`~horovod.algorithms.group.Group`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Tuple

from horovod.algorithms.group import Group
from horovod.transport.duplex import SerialDuplex

__all__ = ["MemoryTransport", "run_threads"]


class _Pipe:
    def __init__(self):
        self.data = bytearray()
        self.cond = threading.Condition()


class _Done:
    def wait(self) -> None:
        return None


class MemoryTransport:
    """Rank ``rank``'s end of the pipes between ``size`` threads; :attr:`sent` counts the bytes it sent."""

    def __init__(self, rank: int, size: int, pipes: Dict[Tuple[int, int], _Pipe], timeout: float = 30.0):
        self.rank, self.size, self.timeout = rank, size, timeout
        self._pipes = pipes
        self.sent = 0
        self.messages = 0

    def send(self, peer: int, data) -> None:
        """Append ``data`` to the pipe towards ``peer``."""
        data = bytes(data)
        self.sent += len(data)
        self.messages += 1
        pipe = self._pipes[self.rank, peer]
        with pipe.cond:
            pipe.data += data
            pipe.cond.notify_all()

    def isend(self, peer: int, view) -> _Done:
        """Send at once (pipes never fill); the returned future is complete."""
        self.send(peer, view)
        return _Done()

    def duplex(self) -> SerialDuplex:
        """Queued transfers completed in order (sends never block here)."""
        return SerialDuplex(self)

    def recv_into(self, peer: int, view) -> None:
        """Fill ``view`` from the pipe from ``peer``; TimeoutError after ``timeout`` seconds without enough bytes."""
        pipe = self._pipes[peer, self.rank]
        with pipe.cond:
            if not pipe.cond.wait_for(lambda: len(pipe.data) >= len(view), timeout=self.timeout):
                raise TimeoutError(f"rank {self.rank}: {len(view)} bytes from rank {peer} never came")
            view[:] = pipe.data[:len(view)]
            del pipe.data[:len(view)]


def run_threads(n: int, fn: Callable[[Group], Any]) -> Tuple[List[Any], List[int]]:
    """Run ``fn(group)`` on ``n`` threads, one in-memory group each; returns (results, bytes sent), by rank.

    Raises:
        RuntimeError: a rank raised (the first error is chained) or did not finish within a minute.
    """
    pipes = {(a, b): _Pipe() for a in range(n) for b in range(n) if a != b}
    transports = [MemoryTransport(r, n, pipes) for r in range(n)]
    results: List[Any] = [None] * n
    errors: List[BaseException] = []

    def body(r: int) -> None:
        try:
            results[r] = fn(Group(tuple(range(n)), r, transports[r]))
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)
    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"{len(errors)} rank(s) failed or hung") from (errors[0] if errors else None)
    return results, [t.sent for t in transports]
