"""The driver's registry of live workers: which slot each runs, whether it waits for a round, how it may end."""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, Optional, Tuple

from horovod.runner.elastic.driver import WorkerView


@dataclasses.dataclass
class WorkerRecord:
    """One live worker process."""

    key: str
    hostname: str
    local_rank: int
    pid: int
    started_at: float
    ready: bool = False
    in_round: bool = False
    rank: Optional[int] = None      # its rank in the current round
    expected_exit: bool = False     # told to stop (host removed, job ended): its exit is no failure

    def view(self) -> WorkerView:
        """This worker as the driver's decisions see it."""
        return WorkerView(self.key, self.hostname, self.local_rank, self.ready, self.in_round, self.started_at)


class WorkerRegistry:
    """Live workers by slot key (``host:local_rank``); at most one per slot."""

    def __init__(self):
        self._workers: Dict[str, WorkerRecord] = {}

    def add(self, record: WorkerRecord) -> None:
        """Register a started worker; raises ValueError if its slot already has one."""
        if record.key in self._workers:
            raise ValueError(f"slot {record.key} already has a live worker (pid {self._workers[record.key].pid})")
        self._workers[record.key] = record

    def get(self, key: str) -> Optional[WorkerRecord]:
        """The live worker of slot ``key``, or None."""
        return self._workers.get(key)

    def pop(self, key: str, pid: int) -> Optional[WorkerRecord]:
        """Remove and return the worker of ``key`` if it is process ``pid``."""
        record = self._workers.get(key)
        if record is None or record.pid != pid:
            return None
        return self._workers.pop(key)

    def views(self) -> Tuple[WorkerView, ...]:
        """Every live worker as the driver's decisions see it."""
        return tuple(r.view() for r in self._workers.values())

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)


__all__ = ["WorkerRecord", "WorkerRegistry"]
