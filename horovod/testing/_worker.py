"""One rank of :func:`horovod.testing.spawn_ranks`: ``python -m horovod.testing._worker <timeout> <stack_dir>``.

Runs the published function like ``horovod.run``'s worker, under a faulthandler watchdog: at the timeout, or on
SIGTERM from the parent, the rank's Python stacks go to ``<stack_dir>/rank.<rank>``.
"""

import faulthandler
import os
import signal
import sys

SPAWN_SCOPE = "spawn_ranks"                 # where spawn_ranks publishes the function
SPAWN_RESULT_SCOPE = "spawn_ranks_result"   # and where each rank's outcome goes


def main(argv) -> int:
    from horovod.common.config import load_config
    from horovod.runner.run_task import run_published

    timeout, stack_dir = float(argv[1]), argv[2]
    stack_file = open(os.path.join(stack_dir, f"rank.{load_config().rank}"), "w")
    faulthandler.dump_traceback_later(timeout, exit=True, file=stack_file)
    faulthandler.register(signal.SIGTERM, file=stack_file, all_threads=True, chain=True)
    try:
        return run_published(SPAWN_SCOPE, SPAWN_RESULT_SCOPE)
    finally:
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
