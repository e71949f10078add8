"""Worker side of ``horovod.run``: fetch the function from the rendezvous store, run it, publish the outcome.

Run as ``python -m horovod.runner.run_task``; the rendezvous address, port, secret and rank come from the environment
(through :mod:`horovod.common.config`). The function is at ``runfunc/func``; the outcome goes to
``runfunc_result/<rank>`` as a cloudpickled :class:`TaskOutcome`.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from typing import Any, Optional

import cloudpickle

from horovod.common.config import environ_snapshot, load_config
from horovod.common.failure_records import FailureRecord, describe_exception
from horovod.common.rendezvous_client import RendezvousClient, secret_from_hex
from horovod.common.starters import detect

__all__ = ["TaskOutcome", "capture", "dumps_outcome", "client_from_env", "task_rank", "run_published", "main",
           "FUNC_SCOPE", "FUNC_KEY", "RESULT_SCOPE"]

FUNC_SCOPE = "runfunc"
FUNC_KEY = "func"
RESULT_SCOPE = "runfunc_result"


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """What a worker's function did: returned ``value``, or raised ``error`` (None if it did not pickle)."""

    rank: int
    value: Any = None
    error: Optional[BaseException] = None
    error_repr: Optional[str] = None
    traceback: Optional[str] = None
    record: Optional[FailureRecord] = None  # when and how it failed (the launcher finds the root cause with it)

    @property
    def failed(self) -> bool:
        """The function raised."""
        return self.traceback is not None


def capture(rank: int, func, args=(), kwargs=None) -> TaskOutcome:
    """Call ``func(*args, **kwargs)`` and record its result or its exception with the formatted traceback."""
    try:
        return TaskOutcome(rank, value=func(*args, **(kwargs or {})))
    except BaseException as exc:  # noqa: B902 — SystemExit and KeyboardInterrupt are outcomes to report too
        return TaskOutcome(rank, error=exc, error_repr=repr(exc), traceback=traceback.format_exc(),
                           record=describe_exception(rank, exc))


def dumps_outcome(outcome: TaskOutcome) -> bytes:
    """Pickle an outcome; an exception that does not pickle is dropped, its repr and traceback kept."""
    try:
        return cloudpickle.dumps(outcome)
    except Exception:  # noqa: BLE001 — any pickling failure of user objects
        if outcome.failed:
            return cloudpickle.dumps(dataclasses.replace(outcome, error=None))
        return cloudpickle.dumps(TaskOutcome(outcome.rank, error_repr="unpicklable return value",
                                             traceback=f"the return value of rank {outcome.rank} "
                                                       f"({type(outcome.value).__name__}) cannot be pickled\n"))


def client_from_env() -> RendezvousClient:
    """The rendezvous client of this worker, from ``HOROVOD_GLOO_RENDEZVOUS_*`` and ``HOROVOD_SECRET_KEY``."""
    cfg = load_config()
    if not cfg.gloo_rendezvous_addr or not cfg.secret_key:
        raise RuntimeError("HOROVOD_GLOO_RENDEZVOUS_ADDR and HOROVOD_SECRET_KEY must be set; start workers with "
                           "horovodrun or horovod.run")
    return RendezvousClient(cfg.gloo_rendezvous_addr, cfg.gloo_rendezvous_port, secret_from_hex(cfg.secret_key))


def task_rank() -> int:
    """This worker's rank: ``HOROVOD_RANK``, or under ``mpirun`` (``horovod.run(use_mpi=True)``) its MPI rank."""
    cfg = load_config()
    if cfg.is_explicit("HOROVOD_RANK"):
        return cfg.rank
    slot = detect(environ_snapshot())
    return slot.rank if slot is not None else cfg.rank


def run_published(func_scope: str, result_scope: str) -> int:
    """Fetch ``(func, args, kwargs)`` from ``func_scope``, run it, publish the outcome; returns the exit status."""
    rank = task_rank()
    client = client_from_env()
    func, args, kwargs = cloudpickle.loads(client.get(func_scope, FUNC_KEY))
    outcome = capture(rank, func, args, kwargs)
    client.put(result_scope, str(rank), dumps_outcome(outcome))
    if outcome.failed:
        # Also on stderr: the launcher relays it even if the caller never reads the result. A rank that failed
        # because another did says so in one line, so the root cause's traceback is not lost in the others' noise.
        record = outcome.record
        if record is not None and record.consequence:
            waited = f" while waiting for {record.waiting_for}" if record.waiting_for else ""
            print(f"rank {rank} failed{waited}: {record.headline()} (horovod.run raises the first failure's own "
                  f"exception)", file=sys.stderr, flush=True)
        else:
            print(outcome.traceback, file=sys.stderr, end="", flush=True)
        return 1
    return 0


def main() -> int:
    """Entry point of ``python -m horovod.runner.run_task``."""
    return run_published(FUNC_SCOPE, RESULT_SCOPE)


if __name__ == "__main__":
    # Run the imported module's main, so pickled outcomes name horovod.runner.run_task, not __main__.
    from horovod.runner.run_task import main as _main
    sys.exit(_main())
