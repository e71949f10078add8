"""spawn_ranks: results, the failing rank's traceback, hung ranks' stacks, and no process left behind."""

import os
import time

import pytest

from horovod.runner.supervisor import JobResult, WorkerExit
from horovod.testing import SpawnError, SpawnTimeout, spawn_ranks
from horovod.testing.fixtures import live_processes
from horovod.testing.spawn import decide_outcome

pytestmark = pytest.mark.ranks


def test_results_by_rank_with_args_and_env():
    def fn(offset):
        return int(os.environ["HOROVOD_RANK"]) + offset, os.environ["HOROVOD_CYCLE_TIME"], os.getpid()
    results = spawn_ranks(fn, 3, timeout=30, args=(10,), env={"HOROVOD_CYCLE_TIME": "0.5"})
    assert [r[:2] for r in results] == [(10, "0.5"), (11, "0.5"), (12, "0.5")]
    assert live_processes(r[2] for r in results) == []


def test_spawn_fixture(spawn):
    assert spawn(lambda: int(os.environ["HOROVOD_SIZE"]), 2, timeout=30) == [2, 2]


@pytest.mark.timed
def test_failing_rank_traceback_and_no_leftovers(tmp_path):
    def fn(pid_dir):
        rank = int(os.environ["HOROVOD_RANK"])
        (pid_dir / str(rank)).write_text(str(os.getpid()))
        if rank == 2:
            def inner_helper():
                raise ValueError("rank two broke")
            inner_helper()
        time.sleep(60)  # spawn_ranks must stop this rank when rank 2 fails

    start = time.monotonic()
    with pytest.raises(SpawnError, match="rank 2 of 3 failed") as info:
        spawn_ranks(fn, 3, timeout=30, args=(tmp_path,))
    assert time.monotonic() - start < 15
    assert info.value.rank == 2
    assert "inner_helper" in str(info.value) and "ValueError: rank two broke" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)
    assert live_processes(int(p.read_text()) for p in tmp_path.iterdir()) == []


def test_hung_ranks_report_their_stacks(tmp_path):
    def fn(pid_dir):
        rank = int(os.environ["HOROVOD_RANK"])
        (pid_dir / str(rank)).write_text(str(os.getpid()))
        if rank == 1:
            def stuck_in_a_collective():
                time.sleep(60)
            stuck_in_a_collective()
        return rank

    with pytest.raises(SpawnTimeout) as info:
        spawn_ranks(fn, 2, timeout=1.5, args=(tmp_path,))
    text = str(info.value)
    assert "rank(s) [1] of 2 did not finish within 1.5s" in text
    assert "--- rank 1 ---" in text and "stuck_in_a_collective" in text
    assert "--- rank 0 ---" not in text
    assert live_processes(int(p.read_text()) for p in tmp_path.iterdir()) == []


def test_rank_dying_without_result():
    with pytest.raises(SpawnError, match="rank 0 ended with exit code 5 without returning a result"):
        spawn_ranks(lambda: os._exit(5), 1, timeout=30)


@pytest.mark.unit
def test_decide_outcome_without_stack():
    result = JobResult((WorkerExit(0, "h", -9),), timed_out=True)
    with pytest.raises(SpawnTimeout, match="no stack"):
        decide_outcome(result, {}, {}, 1, 5)
