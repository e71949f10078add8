"""``horovod.run``'s results: the function goes to the workers through the store, their outcomes come back, and
the launcher returns the values by rank or raises what a worker raised. Shared by static and elastic jobs."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import cloudpickle

from horovod.common.exceptions import HorovodError
from horovod.runner.run_task import FUNC_KEY, FUNC_SCOPE, RESULT_SCOPE, TaskOutcome
from horovod.common.failure_records import finished_record
from horovod.runner.diagnosis import diagnose, launcher_note
from horovod.runner.supervisor import JobResult, failure_message

__all__ = ["WorkerFailedError", "FunctionExchange", "load_outcome", "raise_for_outcomes"]


class WorkerFailedError(HorovodError):
    """A worker of ``horovod.run`` raised; the message carries that rank's traceback."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def load_outcome(rank: int, data: bytes) -> TaskOutcome:
    """Unpickle a worker's published outcome; one this process cannot load becomes a failed outcome saying why."""
    try:
        return cloudpickle.loads(data)
    except Exception as exc:  # noqa: BLE001 — a class of the worker's that this process cannot import
        return TaskOutcome(rank, error_repr=f"unloadable outcome ({exc!r})",
                           traceback=f"the outcome of rank {rank} cannot be unpickled here: {exc!r}\n")


class FunctionExchange:
    """Puts ``(func, args, kwargs)`` into a job's store before it starts; takes the outcomes out after it ended."""

    def __init__(self, func, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None):
        self.payload = cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))
        self.outcomes: Dict[int, TaskOutcome] = {}

    def publish(self, store) -> None:
        """Put the function where the workers (:mod:`horovod.runner.run_task`) fetch it."""
        store.put(FUNC_SCOPE, FUNC_KEY, self.payload)

    def collect(self, store) -> None:
        """Load every outcome the workers published, by rank."""
        for key in store.keys(RESULT_SCOPE):
            self.outcomes[int(key)] = load_outcome(int(key), store.get(RESULT_SCOPE, key))


def raise_for_outcomes(result: JobResult, outcomes: Mapping[int, TaskOutcome], size: int) -> List[Any]:
    """Decide what ``horovod.run`` returns or raises from the job's result and each rank's published outcome.

    Args:
        result: how the worker processes ended.
        outcomes: the outcomes the workers published, by rank.
        size: the number of workers.

    Returns:
        The values returned by each rank, ordered by rank.

    Raises:
        BaseException: the root cause (:func:`horovod.runner.diagnosis.diagnose`): the exception of the rank whose
            failure came first, not a survivor's ``HorovodInternalError`` (its original type when it pickled), with
            a :class:`WorkerFailedError` carrying the rank's traceback as its cause. When a rank finished while
            another waited for it, the waiting rank's error, with a note saying so; when a rank was lost, the error
            of the rank that reported it first, with a note naming the lost rank.
        KeyboardInterrupt: the launcher got SIGINT.
        RuntimeError: a worker died without publishing an outcome.
    """
    if any(o.failed for o in outcomes.values()):
        _raise_root_cause(result, outcomes, size)
    if result.interrupted_by is not None:
        raise KeyboardInterrupt(f"horovod.run interrupted by signal {result.interrupted_by}")
    trouble = f"\n{launcher_note(result)}" if result.launcher_trouble else ""
    if result.first_failure is not None:
        raise RuntimeError(failure_message(result.first_failure) + trouble.lstrip("\n"))
    missing = [r for r in range(size) if r not in outcomes]
    if missing or result.timed_out:
        raise RuntimeError(f"rank(s) {missing} ended without publishing a result{trouble}")
    return [outcomes[r].value for r in range(size)]


def _raise_root_cause(result: JobResult, outcomes: Mapping[int, TaskOutcome], size: int) -> None:
    failed = {r: o for r, o in outcomes.items() if o.failed}
    records = [o.record for o in failed.values() if o.record is not None]
    records += [finished_record(r, 0.0) for r, o in outcomes.items() if not o.failed]  # returned: finished
    verdict = diagnose(result, records)
    note = None
    rank = min(failed)
    if verdict is not None and verdict.kind == "died" and verdict.rank not in failed:
        raise RuntimeError(f"{failure_message(verdict.exit)}Root cause: {verdict.headline()}."
                           + (f"\n{launcher_note(result)}" if result.launcher_trouble else ""))
    if verdict is not None and verdict.kind == "finished" and verdict.waiter is not None:
        rank, note = verdict.waiter.rank, f"Root cause: {verdict.headline()}."
    elif verdict is not None and verdict.kind == "lost" and verdict.record.rank in failed:
        rank, note = verdict.record.rank, f"Root cause: {verdict.headline()}."
    elif verdict is not None and verdict.rank in failed:
        rank = verdict.rank
    if result.launcher_trouble:
        note = "\n".join(filter(None, [note, launcher_note(result)]))
    outcome = failed[rank]
    error = WorkerFailedError(f"rank {rank} of {size} raised {outcome.error_repr}; its traceback:\n"
                              f"{outcome.traceback}" + (f"\n{note}" if note else ""), rank)
    if isinstance(outcome.error, Exception):
        if hasattr(outcome.error, "add_note"):
            outcome.error.add_note(f"(raised on rank {rank}; see the cause below for its traceback)")
            if note:
                outcome.error.add_note(note)
        raise outcome.error from error
    raise error
