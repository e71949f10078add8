"""horovod.run: results by rank and error propagation (tier ranks), argument checks and outcome decisions (unit)."""

import os

import pytest

import horovod
from horovod.runner import WorkerFailedError
from horovod.runner.api import raise_for_outcomes
from horovod.runner.supervisor import JobResult, WorkerExit
from horovod.runner.run_task import TaskOutcome


class CustomError(Exception):
    pass


def rank_times(x, scale=1):
    from horovod.common.config import load_config
    cfg = load_config()
    return (cfg.rank, cfg.size, cfg.local_rank, x * scale)


@pytest.mark.ranks
def test_run_returns_results_by_rank():
    assert horovod.run(rank_times, args=(3,), kwargs={"scale": 2}, np=3) == [(r, 3, r, 6) for r in range(3)]


@pytest.mark.ranks
def test_run_with_hosts_and_lambda():
    assert horovod.run(lambda: os.environ["HOROVOD_HOSTNAME"], num_proc=2, hosts="localhost:2") == ["localhost"] * 2


def fail_on_rank_one(pid_dir):
    rank = int(os.environ["HOROVOD_RANK"])
    with open(os.path.join(pid_dir, str(rank)), "w") as handle:
        handle.write(str(os.getpid()))
    if rank == 1:
        raise CustomError("rank one is unhappy")
    import time
    time.sleep(60)  # the launcher must stop this rank once rank 1 fails


@pytest.mark.ranks
def test_worker_exception_is_raised_with_its_traceback(tmp_path):
    from horovod.testing.fixtures import live_processes
    with pytest.raises(CustomError, match="rank one is unhappy") as info:
        horovod.run(fail_on_rank_one, args=(str(tmp_path),), np=3)
    cause = info.value.__cause__
    assert isinstance(cause, WorkerFailedError) and cause.rank == 1
    assert "Traceback (most recent call last)" in str(cause) and "in fail_on_rank_one" in str(cause)
    assert live_processes(int((tmp_path / name).read_text()) for name in os.listdir(tmp_path)) == []


@pytest.mark.ranks
def test_worker_dying_without_result():
    with pytest.raises(RuntimeError, match="Process name: 0\nHost: localhost\nExit code: 3"):
        horovod.run(lambda: os._exit(3), np=1)


@pytest.mark.unit
@pytest.mark.parametrize("kwargs, error", [
    ({"hosts": "localhost:1", "hostfile": "f"}, ValueError),
    ({"use_gloo": True, "use_mpi": True}, ValueError),
    ({"min_np": 3, "max_np": 2}, ValueError),
    ({"mpi_args": "--oversubscribe"}, ValueError),  # needs use_mpi
    ({"hosts": "no-such-host.invalid:2"}, ValueError),  # does not resolve (NetworkError)
    ({"np": 3, "hosts": "localhost:2"}, ValueError),
])
def test_run_argument_errors(kwargs, error):
    with pytest.raises(error):
        horovod.run(print, **kwargs)


@pytest.mark.unit
def test_outcome_decisions():
    ok = JobResult((WorkerExit(0, "h", 0), WorkerExit(1, "h", 0)))
    assert raise_for_outcomes(ok, {0: TaskOutcome(0, value="a"), 1: TaskOutcome(1, value="b")}, 2) == ["a", "b"]
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\]"):
        raise_for_outcomes(ok, {0: TaskOutcome(0, value="a")}, 2)
    failed = JobResult((WorkerExit(0, "h", -15), WorkerExit(1, "h", 1)), first_failure=WorkerExit(1, "h", 1))
    unpicklable = TaskOutcome(1, error=None, error_repr="Weird()", traceback="Traceback: weird\n")
    with pytest.raises(WorkerFailedError, match="(?s)rank 1 of 2 raised Weird\\(\\).*Traceback: weird"):
        raise_for_outcomes(failed, {1: unpicklable}, 2)
    with pytest.raises(KeyboardInterrupt):
        raise_for_outcomes(JobResult((), interrupted_by=2), {}, 2)


@pytest.mark.unit
def test_a_lost_rank_is_named_on_the_error_of_the_rank_that_reported_it_first():
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.failure_records import describe_exception
    outcomes = {}
    for rank, when in ((0, 10.6), (1, 10.4)):
        error = HorovodInternalError(f"Horovod failed on rank {rank}: rank 2 on host b was lost: its connection "
                                     f"showed no sign of life for 10 s (HOROVOD_LIVENESS_TIMEOUT)")
        outcomes[rank] = TaskOutcome(rank, error=error, error_repr=repr(error), traceback="Traceback: lost\n",
                                     record=describe_exception(rank, error, when=when))
    result = JobResult((WorkerExit(0, "a", 1), WorkerExit(1, "a", 1), WorkerExit(2, "b", -9)),
                       first_failure=WorkerExit(0, "a", 1))
    with pytest.raises(HorovodInternalError, match="on rank 1:") as info:
        raise_for_outcomes(result, outcomes, 3)
    assert "Root cause: rank 2 on b was lost, as rank 1 reported first: its connection showed no sign of life" \
        in "\n".join(info.value.__notes__)
