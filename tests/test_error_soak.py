"""Long sequences of failing collectives at 3 ranks next to a CPU hog (issue 30 item 3, tier ranks, slow).

Every kind of error the job survives (mismatched shapes, dtypes, ops, roots, scales, allgather and alltoall
dimensions, a group with one bad tensor, a duplicate name), one after another in the same processes, each followed by
collectives that must work, a barrier and unnamed ops, with a busy process taking a core. The job must finish within
its time bound: a rank left waiting is either a bug or, if the ranks' names disagree, the deadlock detector's error.

``HVD_SOAK_REPEATS=20 pytest tests/test_error_soak.py`` is the soak run (20 jobs); one job runs by default.
``HVD_SOAK_HOGS`` sets the number of busy processes (1).
"""

import contextlib
import os
import subprocess
import sys
import time

import pytest

from horovod.testing import spawn_ranks

ROUNDS = 10
REPEATS = int(os.environ.get("HVD_SOAK_REPEATS", "1"))


HOGS = int(os.environ.get("HVD_SOAK_HOGS", "1"))


@contextlib.contextmanager
def cpu_hog(count: int = HOGS):
    """``count`` processes spinning on the cores beside the job; stopped (by their pids) on exit."""
    hogs = []
    try:
        for _ in range(count):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _error_rounds(rounds):
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.exceptions import HorovodError
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    cases = {
        "shape": lambda: hvd.allreduce(np.ones(3 + me), name="shape"),
        "dtype": lambda: hvd.allreduce(np.ones(3, dtype=np.float32 if me else np.float64), name="dtype"),
        "op": lambda: hvd.allreduce(np.ones(3), op=hvd.Sum if me else hvd.Max, name="op"),
        "root": lambda: hvd.broadcast(np.ones(3), root_rank=me, name="root"),
        "scale": lambda: hvd.allreduce(np.ones(3), prescale_factor=1.0 + me, name="scale"),
        "gather": lambda: hvd.allgather(np.ones((2, 1 + me)), name="gather"),
        "alltoall": lambda: hvd.alltoall(np.ones((n, 1 + me)), name="a2a"),
        "group": lambda: hvd.grouped_allreduce([np.ones(2), np.ones(2 + me)], name="grp"),
    }
    report = []
    for round_ in range(rounds):
        start = time.monotonic()
        failed = []
        for case, call in cases.items():
            try:
                call()
            except (HorovodError, RuntimeError, ValueError) as exc:
                failed.append(case if "Deadlock" not in str(exc) else f"{case}: {exc}")
            # After any error the job survives, the next collective must work.
            assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="after").tolist() == [float(n)] * 2
            hvd.allreduce(np.full(2, float(me)), op=hvd.Sum)           # unnamed, numbered alike on every rank
        duplicate = None
        if me == 0:     # deterministic: the others submit "dup" only after the barrier, so the first is still waiting
            handle = hvd.allreduce_async(np.ones(2), name="dup")
            try:
                hvd.allreduce_async(np.ones(2), name="dup")
            except ValueError as exc:
                duplicate = str(exc)
        hvd.barrier()
        if me == 0:
            total = handle.result()
        else:
            total = hvd.allreduce(np.ones(2), name="dup")
        assert total.tolist() == [1.0, 1.0]
        hvd.barrier()
        report.append((round_, sorted(failed), duplicate, time.monotonic() - start))
    hvd.shutdown()
    return report


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(REPEATS))
def test_error_sequences_at_three_ranks_beside_a_cpu_hog_never_hang(repeat):
    with cpu_hog():
        results = spawn_ranks(_error_rounds, 3, timeout=120, args=(ROUNDS,))
    expected = sorted(["shape", "dtype", "op", "root", "scale", "gather", "alltoall", "group"])
    for rank, report in enumerate(results):
        assert len(report) == ROUNDS, (rank, report)
        for round_, failed, duplicate, seconds in report:
            assert failed == expected, (rank, round_, failed)
            assert (duplicate is not None and "Duplicate" in duplicate) == (rank == 0), (rank, round_, duplicate)
            assert seconds < 60, (rank, round_, seconds)
