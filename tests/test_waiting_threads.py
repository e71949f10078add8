"""A thread that waits for a result runs the engine's loop itself; the engine thread parks meanwhile.

These check what that must not break: several threads waiting at once (one runs the loop, the others sleep), waits
with a timeout, done-callbacks, and progress that nobody waits for (an async collective, or a process set that
leaves rank 0 out) while the engine thread is parked.
"""

import pytest

from horovod.testing import spawn_ranks


def _poll_until(condition, seconds=20.0):
    """Check ``condition()`` every millisecond for at most ``seconds``; its last value."""
    import threading
    import time
    pause = threading.Event()
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        pause.wait(0.001)
    return condition()


def _poll_until_finished(handle, seconds=20.0):
    """Watch ``handle`` without waiting on it (``finished`` tells the engine nothing), for at most ``seconds``."""
    return _poll_until(lambda: handle.finished, seconds)


def _latency_bound_then_more():
    import threading
    import numpy as np
    import horovod.numpy as hvd
    from horovod.runtime import basics
    subset = hvd.ProcessSet([1, 2])
    hvd.init(process_sets=[subset])
    me, n = hvd.rank(), hvd.size()
    engine = basics.engine()
    out = {}

    # Back-to-back blocking allreduces: the callers run the loop (no hand-off to the engine thread).
    sums = [float(hvd.allreduce(np.full(3, me + i, np.float32), op=hvd.Sum, name="lat")[0]) for i in range(40)]
    out["sums_ok"] = sums == [float(sum(r + i for r in range(n))) for i in range(40)]
    out["drove"] = engine._drives > 0

    # Nobody waits: the parked engine thread must still move an async collective along.
    handle = hvd.allreduce_async(np.full(2, me, np.float64), op=hvd.Sum, name="unwaited")
    out["unwaited_finished"] = _poll_until_finished(handle)
    out["unwaited"] = handle.result(timeout=5).tolist()

    # Four threads block at once on different collectives: one runs the loop, the others sleep on their handles.
    results, errors = {}, []

    def worker(t):
        try:
            for i in range(15):
                got = hvd.allreduce(np.full(4, me * 10 + t + i, np.float32), op=hvd.Sum, name=f"thread{t}.{i}")
                results[(t, i)] = float(got[0])
        except Exception as exc:  # reported below; a thread's exception would otherwise vanish
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    out["threads_errors"] = errors
    out["threads_ok"] = all(results.get((t, i)) == float(sum(r * 10 + t + i for r in range(n)))
                            for t in range(4) for i in range(15))

    # A wait with a timeout sleeps on the handle (the engine thread does the work), and callbacks still run.
    seen = []
    handle = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="timed")
    handle.add_done_callback(lambda h: seen.append(h.result().tolist()))
    out["timed"] = handle.result(timeout=30).tolist()
    out["callback"] = seen

    # Ranks 1 and 2 run collectives of their own set; rank 0, latency-bound a moment ago and now waiting for
    # nothing, must still run the cycles that carry them.
    hvd.allreduce(np.ones(1), name="sync")
    if me == 0:
        late = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="late")
        out["late_finished"] = _poll_until_finished(late, 60.0)
        out["late"] = late.result(timeout=5).tolist()
    else:
        got = [float(hvd.allreduce(np.full(1, me, np.float32), op=hvd.Sum, name=f"sub{i}",
                                   process_set=subset)[0]) for i in range(10)]
        out["subset_ok"] = got == [3.0] * 10
        out["late"] = hvd.allreduce(np.ones(1), op=hvd.Sum, name="late").tolist()
    hvd.shutdown()
    return out


NEGOTIATIONS = ["peer", "star"]


@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", NEGOTIATIONS)
def test_waiting_threads_run_the_loop_and_nothing_starves(negotiation):
    results = spawn_ranks(_latency_bound_then_more, 3, timeout=120, env={"HOROVOD_NEGOTIATION": negotiation})
    for rank, out in enumerate(results):
        assert out["sums_ok"], rank
        assert out["unwaited_finished"] and out["unwaited"] == [3.0, 3.0], rank
        assert not out["threads_errors"] and out["threads_ok"], (rank, out["threads_errors"])
        assert out["timed"] == [3.0, 3.0] and out["callback"] == [[3.0, 3.0]], rank
        assert out["late"] == [3.0], rank
    # (Each rank's cycle also negotiates set [1, 2] when it is a member, so a caller may find the loop busy.)
    assert any(out["drove"] for out in results), "no blocking call ran the loop on its own thread"
    assert results[0]["late_finished"]
    assert results[1]["subset_ok"] and results[2]["subset_ok"]


def _interrupted_wait():
    import os
    import signal
    import threading
    import numpy as np
    import horovod.numpy as hvd
    from horovod.runtime import basics
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hvd.init()
    engine = basics.engine()
    out = {}
    if hvd.rank() == 0:
        hvd.allreduce(np.ones(1), name="warm")
        handle = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="x")    # rank 1 submits it only after "go"
        drives = engine._drives

        def interrupt_once_asleep():
            # Almost always the caller runs the loop and sleeps in its select; should the engine thread have kept
            # the loop, the caller sleeps on the handle instead, and the interrupt must leave the job whole too.
            _poll_until(lambda: engine._drives > drives and engine._driver_sleeping, 5)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_asleep, daemon=True).start()
        try:
            handle.result()
            out["interrupted"] = False
        except KeyboardInterrupt:
            out["interrupted"] = True
        # Interrupted while the loop slept: the engine carries on, and the abandoned collective still completes.
        out["go"] = hvd.allreduce(np.ones(1), op=hvd.Sum, name="go").tolist()
        out["x"] = handle.result().tolist()
    else:
        hvd.allreduce(np.ones(1), name="warm")
        out["go"] = hvd.allreduce(np.ones(1), op=hvd.Sum, name="go").tolist()
        out["x"] = hvd.allreduce(np.ones(2), op=hvd.Sum, name="x").tolist()
    out["after"] = hvd.allreduce(np.ones(1), op=hvd.Sum, name="after").tolist()
    hvd.shutdown()
    return out


@pytest.mark.serial
@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", NEGOTIATIONS)
def test_interrupting_a_waiting_caller_that_runs_the_loop_keeps_the_job_whole(negotiation):
    results = spawn_ranks(_interrupted_wait, 2, timeout=60, env={"HOROVOD_NEGOTIATION": negotiation})
    assert results[0]["interrupted"]
    for out in results:
        assert out["go"] == [2.0] and out["x"] == [2.0, 2.0] and out["after"] == [2.0]


def _set_without_an_idle_rank(marker):
    import os
    import time
    import numpy as np
    import horovod.numpy as hvd
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    elapsed = None
    if hvd.rank() in (0, 1):
        hvd.allreduce(np.ones(1), process_set=pair, name="warm")
        start = time.monotonic()
        for i in range(20):
            hvd.allreduce(np.ones(1), process_set=pair, name=f"pair{i}")
        elapsed = time.monotonic() - start
        if hvd.rank() == 0:
            open(marker, "w").close()
    else:
        # Idle, with nothing submitted (a pending collective would make it answer at once anyway), until done.
        assert _poll_until(lambda: os.path.exists(marker), 30), "the pair never finished"
    hvd.barrier()
    hvd.shutdown()
    return elapsed


@pytest.mark.ranks
@pytest.mark.parametrize("negotiation", NEGOTIATIONS)
def test_a_rank_outside_a_process_set_does_not_hold_it_up(negotiation, tmp_path):
    # Rank 2 is idle and not in the set, yet every cycle needs its frame (peer) or rank 0's GO (star): it must
    # answer at once, not at its 50 ms poll, which would make 20 blocking allreduces take at least a second.
    results = spawn_ranks(_set_without_an_idle_rank, 3, timeout=60, args=(str(tmp_path / "done"),),
                          env={"HOROVOD_NEGOTIATION": negotiation})
    assert results[2] is None
    assert results[0] < 0.5 and results[1] < 0.5, results
