"""Each worker's math libraries get the worker's share of its host's cores (``OMP_NUM_THREADS``) unless the user set
it (horovod/runner/worker_threads.py); the ssh hosts' share is checked in test_multihost.py's 2 x 2 job."""

import os
import sys

import pytest

from horovod.runner.worker_threads import host_cores, thread_defaults
from horovod.testing.fixtures import run_horovodrun

PRINT = "import os; print('threads', os.environ.get('OMP_NUM_THREADS'))"


@pytest.mark.unit
def test_a_host_with_several_workers_shares_its_cores_and_the_users_setting_wins():
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "4"}, cores=16) == {"OMP_NUM_THREADS": "4"}
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "3"}, cores=16) == {"OMP_NUM_THREADS": "5"}
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "8"}, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "4", "OMP_NUM_THREADS": "7"}, cores=16) == {}
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "4", "OMP_NUM_THREADS": ""}, cores=16) == {}
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "1"}, cores=16) == {}
    assert thread_defaults({}, cores=16) == {}
    assert thread_defaults({"HOROVOD_LOCAL_SIZE": "two"}, cores=16) == {}


OURS = os.environ.get("OMP_NUM_THREADS")     # where this test's own environment sets it, that wins


@pytest.mark.cli
@pytest.mark.parametrize("np_, given, want", [("2", None, OURS or str(max(1, host_cores() // 2))), ("2", "3", "3"),
                                                ("1", None, str(OURS))])
def test_horovodrun_gives_each_local_worker_its_share(np_, given, want):
    env = {"OMP_NUM_THREADS": given} if given else {}
    proc = run_horovodrun(["-np", np_, sys.executable, "-c", PRINT], timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if "threads" in line)
    assert lines == [f"[{r}]<stdout>:threads {want}" for r in range(int(np_))], proc.stdout + proc.stderr
