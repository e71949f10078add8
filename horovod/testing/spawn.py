"""``spawn_ranks``: run a function on N real worker processes, as ``horovodrun`` would start them.

Each rank is a fresh ``python -m horovod.testing._worker`` with the environment the launcher gives (rank, size,
rendezvous address, job secret), so the function may call ``hvd.init()`` and run collectives over real transports.
The function and its results travel cloudpickled through the job's rendezvous store. A failing rank stops the others
at once and its traceback is raised; a rank still running at ``timeout`` dumps its Python stacks (faulthandler) and
the stacks are raised; every worker's process group is killed before ``spawn_ranks`` returns.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import cloudpickle

from horovod.runner.hosts import HostInfo, get_host_assignments
from horovod.runner.launch import LaunchConfig, launch_local, package_pythonpath
from horovod.runner.rendezvous import rendezvous_service
from horovod.runner.supervisor import JobResult
from horovod.runner.run_task import FUNC_KEY, TaskOutcome
from horovod.testing._worker import SPAWN_RESULT_SCOPE, SPAWN_SCOPE

TIMEOUT_MARK = "Timeout ("  # faulthandler.dump_traceback_later's first line
_BACKSTOP_SECONDS = 10.0  # after the workers' own watchdogs should have fired


class SpawnError(AssertionError):
    """A spawned rank failed; the message carries its traceback. ``rank`` names it (None: several or unknown)."""

    def __init__(self, message: str, rank: Optional[int] = None):
        super().__init__(message)
        self.rank = rank


class SpawnTimeout(SpawnError):
    """Ranks did not finish in time; the message carries each hung rank's Python stacks."""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def decide_outcome(result: JobResult, outcomes: Mapping[int, TaskOutcome], stacks: Mapping[int, str],
                   world_size: int, timeout: float) -> List[Any]:
    """What ``spawn_ranks`` returns or raises, from the processes' exits, published outcomes and stack dumps.

    Args:
        result: how the processes ended.
        outcomes: outcomes published by the ranks that finished their function.
        stacks: the stack dump files' contents by rank (empty when none was written).
        world_size: number of ranks.
        timeout: the timeout the ranks ran under, for the message.

    Returns:
        The function's return values by rank.

    Raises:
        SpawnError: a rank raised or died; SpawnTimeout: ranks hung.
    """
    failed = sorted(r for r, o in outcomes.items() if o.failed)
    if failed:
        first = result.first_failure.rank if result.first_failure and result.first_failure.rank in failed \
            else failed[0]
        error = SpawnError(f"rank {first} of {world_size} failed:\n{outcomes[first].traceback}", first)
        raise error from outcomes[first].error if isinstance(outcomes[first].error, BaseException) else None
    hung = [r for r in range(world_size) if r not in outcomes]
    timed_out = result.timed_out or any(stacks.get(r, "").startswith(TIMEOUT_MARK) for r in hung)
    if timed_out:
        parts = [f"rank(s) {hung} of {world_size} did not finish within {timeout:g}s; their Python stacks:"]
        for rank in hung:
            parts.append(f"--- rank {rank} ---\n{stacks.get(rank) or '(no stack: the process did not respond)'}")
        raise SpawnTimeout("\n".join(parts))
    if result.interrupted_by is not None:
        raise KeyboardInterrupt(f"spawn_ranks interrupted by signal {result.interrupted_by}")
    if result.first_failure is not None or hung:
        failure = result.first_failure
        what = f"rank {failure.rank} ended with {failure.describe()}" if failure else f"rank(s) {hung} ended"
        raise SpawnError(f"{what} without returning a result (see its output above)",
                         failure.rank if failure else None)
    return [outcomes[r].value for r in range(world_size)]


def _dumps_by_value(fn: Callable, args: Sequence, kwargs: Optional[Dict[str, Any]]) -> bytes:
    """Pickle ``fn`` with its defining module by value when workers could not import that module (test files)."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    filename = os.path.basename(getattr(module, "__file__", "") or "")
    by_value = module is not None and module.__name__ != "__main__" and filename.startswith(("test_", "conftest"))
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def spawn_ranks(fn: Callable, world_size: int, timeout: float = 60.0, args: Sequence = (),
                env: Optional[Mapping[str, str]] = None, kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` worker processes and return the results by rank.

    Args:
        fn: a cloudpicklable function (a test's nested function or lambda is fine).
        world_size: the number of ranks, all on this machine.
        timeout: seconds each rank may take; a rank still running then dumps its stacks and is killed.
        args, kwargs: the function's arguments (the same on every rank).
        env: extra environment variables for every rank (e.g. ``{"HOROVOD_CYCLE_TIME": "0.5"}``).

    Returns:
        The values ``fn`` returned, ordered by rank.

    Raises:
        SpawnError: a rank raised (its traceback is in the message) or died.
        SpawnTimeout: ranks did not finish in time (their stacks are in the message).
    """
    slots = get_host_assignments([HostInfo("localhost", world_size)], world_size)
    extra_env = {**package_pythonpath(include_caller_path=True), **dict(env or {})}
    with tempfile.TemporaryDirectory(prefix="horovod-spawn-") as stack_dir, \
            rendezvous_service() as (server, rendezvous):
        command = (sys.executable, "-m", "horovod.testing._worker", repr(float(timeout)), stack_dir)
        launch = LaunchConfig(command=command, slots=tuple(slots), extra_env=extra_env, grace_seconds=2.0)
        server.store.put(SPAWN_SCOPE, FUNC_KEY, _dumps_by_value(fn, args, kwargs))
        result = launch_local(launch, rendezvous, timeout=timeout + _BACKSTOP_SECONDS)
        outcomes: Dict[int, TaskOutcome] = {}
        for rank in range(world_size):
            data = server.store.get(SPAWN_RESULT_SCOPE, str(rank))
            if data is not None:
                outcomes[rank] = cloudpickle.loads(data)
        stacks = {rank: _read(os.path.join(stack_dir, f"rank.{rank}")) for rank in range(world_size)}
    return decide_outcome(result, outcomes, stacks, world_size, timeout)


__all__ = ["spawn_ranks", "SpawnError", "SpawnTimeout", "decide_outcome"]
