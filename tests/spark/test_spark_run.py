"""horovod.spark.run on a real local Spark cluster: ranks as Spark tasks, results by rank, failures, start timeout."""

import os
import subprocess
import sys
import time

import pytest

from horovod.testing.fixtures import live_processes
from spark_helpers import bounded, no_active_spark_jobs

pytestmark = pytest.mark.ranks


def allreduce_ranks(scale, out=None):
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    if out:
        with open(os.path.join(out, f"pid.{hvd.rank()}"), "w") as handle:
            handle.write(str(os.getpid()))
    total = hvd.allreduce(np.full(1000, hvd.rank() + 1.0), op=hvd.Sum)
    gathered = hvd.allgather(np.array([hvd.rank()]))
    print(f"rank {hvd.rank()} of {hvd.size()} says hello", flush=True)
    return (hvd.rank(), hvd.size(), hvd.local_rank(), float(total[0]) * scale, gathered.tolist(),
            os.environ["HOROVOD_HOSTNAME"])


class Unhappy(Exception):
    pass


def fail_on_rank_one(out):
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    with open(os.path.join(out, f"pid.{hvd.rank()}"), "w") as handle:
        handle.write(str(os.getpid()))
    if hvd.rank() == 1:
        raise Unhappy("rank one is unhappy")
    for _ in range(1000):  # the others wait in collectives until the job stops them
        hvd.allreduce(np.ones(4))
    return "unreachable"


@pytest.mark.parametrize("num_proc", [1, 2, 3])
def test_run_collectives_and_results_by_rank(spark, num_proc, capfd):
    import horovod.spark
    results = bounded(spark, lambda: horovod.spark.run(allreduce_ranks, args=(2,), num_proc=num_proc,
                                                       start_timeout=120), 240)
    total = num_proc * (num_proc + 1) / 2
    assert [r[:5] for r in results] == [(r, num_proc, r, 2 * total, list(range(num_proc))) for r in range(num_proc)]
    assert len({r[5] for r in results}) == 1  # one host: every rank on it (shared memory)
    out = capfd.readouterr().out
    for rank in range(num_proc):
        assert f"[{rank}]<stdout>:rank {rank} of {num_proc} says hello" in out


def test_exception_fails_the_job_with_its_traceback_and_leaves_nothing(spark, tmp_path):
    import horovod.spark
    start = time.monotonic()
    with pytest.raises(Unhappy, match="rank one is unhappy") as info:
        bounded(spark, lambda: horovod.spark.run(fail_on_rank_one, args=(str(tmp_path),), num_proc=2,
                                                 start_timeout=120), 240)
    assert "rank 1 of 2 raised" in str(info.value.__cause__)
    assert "in fail_on_rank_one" in str(info.value.__cause__)  # the rank's own traceback
    assert time.monotonic() - start < 120
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
    assert live_processes(pids) == []
    assert no_active_spark_jobs(spark)


def test_too_few_executors_times_out_with_the_count(spark):
    import horovod.spark
    start = time.monotonic()
    with pytest.raises(horovod.spark.SparkStartTimeoutError, match=r"0 of 5 task\(s\) started") as info:
        bounded(spark, lambda: horovod.spark.run(allreduce_ranks, args=(1,), num_proc=5, start_timeout=4), 120)
    assert "task slot(s)" in str(info.value) and "start_timeout" in str(info.value)
    assert time.monotonic() - start < 4 + 30
    assert no_active_spark_jobs(spark)
    # The cluster is usable again right after.
    assert len(bounded(spark, lambda: horovod.spark.run(allreduce_ranks, args=(1,), num_proc=2,
                                                        start_timeout=120), 240)) == 2


def test_a_spark_job_that_fails_early_surfaces_within_seconds_with_sparks_error(spark, monkeypatch):
    # Executors whose Python cannot run the tasks (here: a PYSPARK_PYTHON that does not exist; in the field, one
    # that differs from the driver's) fail the Spark job at once: run must say so, not wait out start_timeout.
    import horovod.spark
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "/nonexistent/python-for-horovod-test")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Spark job of Horovod's tasks failed") as info:
        bounded(spark, lambda: horovod.spark.run(allreduce_ranks, args=(1,), num_proc=2, start_timeout=600), 60)
    assert time.monotonic() - start < 30
    assert "/nonexistent/python-for-horovod-test" in str(info.value)  # Spark's own error
    assert "PYSPARK_PYTHON" in str(info.value)
    assert no_active_spark_jobs(spark)


def test_env_reaches_ranks_and_start_timeout_comes_from_config(spark, monkeypatch):
    import horovod.spark
    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "3")
    with pytest.raises(horovod.spark.SparkStartTimeoutError, match="after 3s"):
        bounded(spark, lambda: horovod.spark.run(allreduce_ranks, args=(1,), num_proc=5), 120)
    monkeypatch.delenv("HOROVOD_SPARK_START_TIMEOUT")
    values = bounded(spark, lambda: horovod.spark.run(lambda: os.environ.get("MY_SPARK_VAR"), num_proc=2,
                                                      env={"MY_SPARK_VAR": "here"}, start_timeout=120), 240)
    assert values == ["here", "here"]


@pytest.mark.unit
def test_without_pyspark_the_import_error_names_the_extra(tmp_path):
    blocker = tmp_path / "pyspark.py"
    blocker.write_text("raise ImportError('No module named pyspark (blocked for this test)')\n")
    proc = subprocess.run([sys.executable, "-c", "import horovod.spark"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
                          timeout=60)
    assert proc.returncode != 0
    assert "pip install 'pyspark>=3.4'" in proc.stderr and "pip install -e '.[spark]'" in proc.stderr


@pytest.mark.unit
def test_plan_slots_groups_each_hosts_tasks():
    from horovod.runner.backends.spark import AgentInfo
    from horovod.spark.runner import plan_slots
    agents = [AgentInfo(i, 0, h, 100 + i, "python") for i, h in enumerate(["a", "b", "a", "b", "c"])]
    slots, by_rank = plan_slots(agents)
    assert [(s.hostname, s.rank, s.local_rank, s.local_size) for s in slots] == \
        [("a", 0, 0, 2), ("a", 1, 1, 2), ("b", 2, 0, 2), ("b", 3, 1, 2), ("c", 4, 0, 1)]
    assert by_rank == {0: 0, 1: 2, 2: 1, 3: 3, 4: 4}
