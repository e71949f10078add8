"""Horovod on Spark: ``run`` and ``run_elastic`` start one Horovod rank per Spark task; estimators train on a
DataFrame and return Spark ML models (:mod:`horovod.spark.torch`, :mod:`horovod.spark.keras`).

Contract: the driver serves the job's rendezvous and an agent server; every Spark task runs an agent
(:mod:`horovod.spark.task`) that starts one worker process with the environment a ``horovodrun`` worker gets (placed
by the host Spark reports for the task, so ranks on one host share memory) and ends when its worker ends; results
come back by rank through the rendezvous store; nothing of a job outlives the call that started it.

Needs the ``spark`` extra (pyspark, pyarrow and pandas: ``pip install -e '.[spark]'`` in a checkout,
``'<wheel>[spark]'`` with a wheel). See ``docs/spark.md``.
"""

try:
    import pyspark  # noqa: F401 — the extra this package needs
except ImportError as _exc:  # pragma: no cover — exercised in a subprocess by the tests
    from horovod.common.extras import install_hint
    raise ImportError(f"horovod.spark needs pyspark: {install_hint('spark')}") from _exc

import warnings as _warnings

with _warnings.catch_warnings():
    # Every SparkContext start loads pyspark.testing.utils (pyspark.sql.types.can_convert), which warns that PySpark
    # "does not yet fully support pandas >= 3.0.0" (the spark extra's pandas): loaded now with that one
    # FutureWarning ignored, it has nothing left to say. The filter ends with this block: other warnings show.
    _warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    try:
        import pyspark.testing.utils  # noqa: F401
    except Exception:  # noqa: BLE001 — an optional module of pyspark's; without it there is nothing to quiet
        pass

from horovod.spark.runner import SparkStartTimeoutError, run, run_elastic  # noqa: E402

__all__ = ["run", "run_elastic", "SparkStartTimeoutError"]
