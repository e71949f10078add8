"""A rank that holds the GIL in one long call while its own asynchronous allreduce is in flight (the overlap
pattern of a training step), for tests/test_liveness.py and tests/test_liveness_hosts.py.

    python gil_overlap_worker.py OUT_DIR SECONDS MEGABYTES

Rank 1 starts an allreduce of MEGABYTES, writes its pid to OUT_DIR/holding.1, then sleeps SECONDS in libc through
``ctypes.PyDLL`` (which keeps the GIL, unlike ``CDLL``) while a ticker thread counts how often it got to run.
Every rank then checks the result; a rank that raises writes ``error.<rank>`` (the time and the error) first.
"""

import ctypes
import os
import sys
import threading
import time

import numpy as np

import horovod.numpy as hvd

out, seconds, megabytes = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
hvd.init()
rank, size = hvd.rank(), hvd.size()
try:
    data = np.full(int(megabytes * (1 << 20)) // 4, rank + 1, np.float32)
    hvd.allreduce(np.ones(4, np.float32), name="warmup")     # every rank submits the big one at about once
    handle = hvd.allreduce_async(data, op=hvd.Sum, name="overlapped")
    if rank == 1:
        # Hold the GIL once the engine moves the allreduce's bytes (the transport names what it runs).
        from horovod.runtime.basics import context
        patience = context().engine.transport.patience
        deadline = time.monotonic() + 30
        while not patience.activity().startswith("ALLREDUCE"):
            assert time.monotonic() < deadline, "the allreduce did not start"
            time.sleep(0.001)
        ticks, stop = [0], [False]

        def ticker():
            while not stop[0]:
                ticks[0] += 1
                time.sleep(0.01)

        thread = threading.Thread(target=ticker, daemon=True)
        thread.start()
        while ticks[0] < 2:
            time.sleep(0.01)
        with open(os.path.join(out, "holding.1"), "w") as f:
            f.write(str(os.getpid()))
        before, start = ticks[0], time.perf_counter()
        ctypes.PyDLL(None).sleep(int(seconds))
        held, during = time.perf_counter() - start, ticks[0] - before
        stop[0] = True
        print(f"held the GIL for {held:.1f} s; the ticker ran {during} times", flush=True)
    result = hvd.synchronize(handle)
    expected = size * (size + 1) / 2
    print(f"OK rank={rank} correct={bool(np.all(result == expected))}", flush=True)
except Exception as exc:
    with open(os.path.join(out, f"error.{rank}"), "w") as f:
        f.write(f"{time.time()} {type(exc).__name__}: {exc}")
    raise
hvd.shutdown()
