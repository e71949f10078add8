"""One Spark cluster for every Spark test: ``local-cluster[2,2,1024]`` (a master, two executors of two cores each,
as separate JVMs), started once and stopped at the end of the session. Skipped without pyspark or Java."""

import os
import shutil
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra (pyspark) is not installed")

EXECUTORS = 2
CORES = 2
START_SECONDS = 180.0
# The master and executor JVMs run small jobs on a loaded 2-core machine: the C1 compiler alone and the serial GC
# spend about a third less CPU than HotSpot's defaults (tiered C2, G1 with its threads) on this suite.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"


def _java_available() -> bool:
    return bool(shutil.which("java") or os.environ.get("JAVA_HOME"))


@pytest.fixture(scope="session")
def spark():
    """The shared SparkSession (ranks' Python is this interpreter: ``PYSPARK_PYTHON``)."""
    if not _java_available():
        pytest.skip("no Java: run `make sysdeps` (scripts/system-deps.sh installs a JRE)")
    from pyspark.sql import SparkSession
    previous = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master(f"local-cluster[{EXECUTORS},{CORES},1024]").appName("horovod-spark-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
               .config("spark.sql.shuffle.partitions", "4").config("spark.log.level", "ERROR")
               .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
               .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
               .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
               .getOrCreate())
    try:
        tracker = session.sparkContext._jsc.sc().statusTracker()
        deadline = time.monotonic() + START_SECONDS
        while len(tracker.getExecutorInfos()) < EXECUTORS + 1:  # the driver counts as one
            if time.monotonic() > deadline:
                pytest.fail(f"the local Spark cluster did not bring up {EXECUTORS} executors in {START_SECONDS}s")
            time.sleep(0.2)
        yield session
    finally:
        session.stop()
        if previous is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = previous
