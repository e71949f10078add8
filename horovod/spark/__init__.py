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

from horovod.spark.runner import SparkStartTimeoutError, run, run_elastic

__all__ = ["run", "run_elastic", "SparkStartTimeoutError"]
