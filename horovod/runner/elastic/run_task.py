"""Worker side of an elastic ``horovod.run``: run the published function, publish the outcome under the final rank.

Run as ``python -m horovod.runner.elastic.run_task``. A worker whose host was removed (it leaves with
``SystemExit(0)``) publishes nothing: only the workers of the final round report.
"""

from __future__ import annotations

import sys

import cloudpickle

from horovod.runner.run_task import (FUNC_KEY, FUNC_SCOPE, RESULT_SCOPE, capture, client_from_env, dumps_outcome,
                                     task_rank)


__all__ = ["main"]


def main() -> int:
    """Entry point; returns the exit status."""
    client = client_from_env()
    func, args, kwargs = cloudpickle.loads(client.get(FUNC_SCOPE, FUNC_KEY))
    outcome = capture(-1, func, args, kwargs)
    if isinstance(outcome.error, SystemExit) and not outcome.error.code:
        return 0
    from horovod.runtime import basics   # the function ran here: Horovod is loaded already
    # The rank of the final round when the function initialised Horovod (a reset may renumber workers), else the
    # rank this worker was started with: a function that never calls hvd.init() still reports under its own rank.
    rank = basics.rank() if basics.is_initialized() else task_rank()
    outcome = type(outcome)(rank, outcome.value, outcome.error, outcome.error_repr, outcome.traceback)
    client.put(RESULT_SCOPE, str(rank), dumps_outcome(outcome))
    if outcome.failed:
        print(outcome.traceback, file=sys.stderr, end="", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    from horovod.runner.elastic.run_task import main as _main
    sys.exit(_main())
