"""Horovod's ``horovod.spark.common.backend``: what runs a Spark estimator's training function.

Horovod's Spark examples and estimators take a ``backend=``; :class:`SparkBackend` runs the function on Spark
executors with :func:`horovod.spark.run`, ``num_proc`` of them (the Spark context's default parallelism when None).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from horovod.common.config import environ_snapshot

__all__ = ["Backend", "SparkBackend", "default_num_proc"]


def default_num_proc() -> int:
    """The active Spark context's default parallelism."""
    import pyspark
    context = pyspark.SparkContext._active_spark_context
    if context is None:
        raise RuntimeError("no active SparkContext: start a SparkSession first, or pass num_proc")
    return context.defaultParallelism


class Backend:
    """Runs a function on ``num_processes()`` Horovod workers and returns their results by rank."""

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None,
            env: Optional[Mapping[str, str]] = None) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker."""
        raise NotImplementedError()

    def num_processes(self) -> int:
        """How many workers :meth:`run` starts."""
        raise NotImplementedError()


class SparkBackend(Backend):
    """:func:`horovod.spark.run` with a fixed ``num_proc`` and environment (``os.environ`` when None)."""

    def __init__(self, num_proc: Optional[int] = None, env: Optional[Mapping[str, str]] = None, **run_kwargs):
        self._num_proc = num_proc or default_num_proc()
        self._env = dict(env) if env is not None else None
        self._run_kwargs = run_kwargs

    def run(self, fn, args=(), kwargs=None, env=None):
        """Run ``fn`` on the Spark executors; returns the values by rank."""
        import horovod.spark
        full_env = dict(self._env if self._env is not None else environ_snapshot())
        full_env.update(env or {})
        return horovod.spark.run(fn, args=args, kwargs=kwargs or {}, num_proc=self._num_proc, env=full_env,
                                 **self._run_kwargs)

    def num_processes(self) -> int:
        """The ``num_proc`` given (or found at construction)."""
        return self._num_proc
