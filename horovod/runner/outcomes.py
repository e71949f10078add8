"""``horovod.run``'s results: the function goes to the workers through the store, their outcomes come back, and
the launcher returns the values by rank or raises what a worker raised. Shared by static and elastic jobs."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import cloudpickle

from horovod.common.exceptions import HorovodError
from horovod.runner.run_task import FUNC_KEY, FUNC_SCOPE, RESULT_SCOPE, TaskOutcome
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
        BaseException: the exception the first failed rank raised (its original type when it pickled), with a
            :class:`WorkerFailedError` carrying the rank's traceback as its cause.
        KeyboardInterrupt: the launcher got SIGINT.
        RuntimeError: a worker died without publishing an outcome.
    """
    failed = sorted(r for r, o in outcomes.items() if o.failed)
    if failed:
        first = result.first_failure.rank if result.first_failure and result.first_failure.rank in failed \
            else failed[0]
        outcome = outcomes[first]
        error = WorkerFailedError(f"rank {first} of {size} raised {outcome.error_repr}; its traceback:\n"
                                  f"{outcome.traceback}", first)
        if isinstance(outcome.error, Exception):
            if hasattr(outcome.error, "add_note"):
                outcome.error.add_note(f"(raised on rank {first}; see the cause below for its traceback)")
            raise outcome.error from error
        raise error
    if result.interrupted_by is not None:
        raise KeyboardInterrupt(f"horovod.run interrupted by signal {result.interrupted_by}")
    if result.first_failure is not None:
        raise RuntimeError(failure_message(result.first_failure))
    missing = [r for r in range(size) if r not in outcomes]
    if missing or result.timed_out:
        raise RuntimeError(f"rank(s) {missing} ended without publishing a result")
    return [outcomes[r].value for r in range(size)]
