"""A training loop with one fault, for tests/test_failure_matrix.py.

    python failure_matrix_worker.py OUT_DIR FAULT FAULTY_RANK

Every rank allreduces in a loop and writes ``OUT_DIR/ready.<rank>`` after a few steps; at step 8 the faulty rank
does FAULT to itself. A fault done from outside (a cut link, a host down) is the test's: those ranks just loop. A
rank whose loop raises writes ``OUT_DIR/error.<rank>`` (the time and the error) and raises on.
"""

import ctypes
import importlib
import os
import signal
import sys
import time

out, fault, faulty = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ.get("HOROVOD_RANK", "-1"))
if fault == "before_init" and rank == faulty:
    importlib.import_module("horovod_no_such_module")   # the typo a user makes: it fails before hvd.init()

import numpy as np  # noqa: E402

import horovod.numpy as hvd  # noqa: E402

hvd.init()
rank = hvd.rank()


def fail_here():
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "sigstop":        # inside a collective: its own allreduce in flight
        handle = hvd.allreduce_async(np.ones(1 << 20, np.float32), name="in_flight")
        os.kill(os.getpid(), signal.SIGSTOP)
        hvd.synchronize(handle)
    elif fault == "gil":            # one long call that keeps the GIL while its own allreduce is in flight
        handle = hvd.allreduce_async(np.ones(1 << 20, np.float32), name="in_flight")
        ctypes.PyDLL(None).sleep(600)
        hvd.synchronize(handle)
    elif fault == "user_exception":
        raise ValueError("the user's code failed at step 8")
    elif fault == "engine_exception":
        from horovod.core import execution
        run = execution.Executor.run

        def broken(self, state, batches):
            if batches:
                raise RuntimeError("a bug on the engine thread")
            return run(self, state, batches)

        execution.Executor.run = broken
    elif fault == "exit_0":
        sys.exit(0)


try:
    for step in range(1, 3000):
        hvd.allreduce(np.ones(1000), name="loop")
        if step == 3:
            open(os.path.join(out, f"ready.{rank}"), "w").close()
        if step == 8 and rank == faulty:
            fail_here()
        time.sleep(0.02)    # pacing only
except Exception as exc:
    with open(os.path.join(out, f"error.{rank}"), "w") as f:
        f.write(f"{time.time()} {type(exc).__name__}: {exc}")
    raise
hvd.shutdown()
