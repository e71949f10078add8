"""The driver's side of a ``horovod.spark`` job: the rendezvous, the agent server and the Spark job of agents.

:class:`SparkJob` brings the three up together and takes them down together, whatever happened: every agent is told
to end, the Spark job is waited for and cancelled (with its tasks interrupted) if it does not end by itself, and the
servers stop. The Spark job runs in a thread of its own (``collect`` blocks); its job group names it for
cancellation.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, List, Optional

import pyspark

from horovod.common import config
from horovod.common.exceptions import HorovodError
from horovod.runner.backends.spark import Agent, AgentServer
from horovod.runner.rendezvous import RendezvousInfo, RendezvousPool
from horovod.spark.task import AgentSpec, barrier_agent, elastic_agent

__all__ = ["SparkStartTimeoutError", "active_context", "driver_address", "start_timeout_seconds", "SparkJob"]

_job_ids = itertools.count(1)
_STOP_SECONDS = 30.0   # how long ended agents have to finish their tasks before the job group is cancelled
_POLL_SECONDS = 0.25   # how often a wait for agents looks whether the Spark job has ended (it notifies no one)
_SPARK_ERROR_CHARS = 2000


class SparkStartTimeoutError(HorovodError, TimeoutError):
    """Not every Spark task of a job started (and reached the driver) within the start timeout."""


def active_context() -> pyspark.SparkContext:
    """The active SparkContext.

    Raises:
        RuntimeError: there is none (start a SparkSession first).
    """
    context = pyspark.SparkContext._active_spark_context
    if context is None:
        raise RuntimeError("horovod.spark needs an active SparkContext: create a SparkSession first "
                           "(SparkSession.builder...getOrCreate())")
    return context


def driver_address(context: pyspark.SparkContext) -> str:
    """The address executors reach the driver at (``spark.driver.host``)."""
    return context.getConf().get("spark.driver.host") or "127.0.0.1"


def start_timeout_seconds(start_timeout: Optional[float]) -> float:
    """``start_timeout``, else ``HOROVOD_SPARK_START_TIMEOUT`` (default 600 s, as in Horovod)."""
    return float(start_timeout) if start_timeout is not None else config.load_config().spark_start_timeout


class SparkJob:
    """A rendezvous store, an agent server and ``num_tasks`` Spark tasks running agents, for one ``with`` block.

    Args:
        context: the SparkContext.
        num_tasks: Spark tasks to start (one agent each).
        start_timeout: seconds for the tasks to start and reach the driver.
        elastic: non-barrier tasks, each attempt a host of its own (see :func:`horovod.spark.task.elastic_agent`);
            else one barrier stage (all tasks start together or none does).
    """

    def __init__(self, context: pyspark.SparkContext, num_tasks: int, start_timeout: float, elastic: bool = False):
        self.context = context
        self.num_tasks = num_tasks
        self.start_timeout = start_timeout
        self.elastic = elastic
        self.group = f"horovod.spark.{'run_elastic' if elastic else 'run'}.{next(_job_ids)}"
        self.pool = RendezvousPool()
        self.address = driver_address(context)
        self.rendezvous: RendezvousInfo = self.pool.serve(self.address)
        self.server = AgentServer(self.pool.secret, self.address, handshake_timeout=start_timeout)
        self.store = self.pool.store
        self.results: Optional[List[Any]] = None
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run_tasks, daemon=True, name=self.group)

    def __enter__(self) -> "SparkJob":
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop(cancel=exc_type is not None)

    def _mapper(self) -> Callable:
        spec = AgentSpec(self.address, self.server.port, self.pool.secret, self.elastic, self.start_timeout)
        return elastic_agent(spec) if self.elastic else barrier_agent(spec)

    def _run_tasks(self) -> None:
        try:
            self.context.setJobGroup(self.group, f"Horovod on Spark: {self.num_tasks} task(s)",
                                     interruptOnCancel=True)
            rdd = self.context.parallelize(range(self.num_tasks), self.num_tasks)
            rdd = rdd.mapPartitions(self._mapper()) if self.elastic else rdd.barrier().mapPartitions(self._mapper())
            self.results = rdd.collect()
        except Exception as exc:  # noqa: BLE001 — reported by the caller when nothing else explains the failure
            self.error = exc

    @property
    def running(self) -> bool:
        """The Spark job has not ended."""
        return self._thread.is_alive()

    def wait_for_agents(self, count: int) -> List[Agent]:
        """Wait up to the start timeout for ``count`` agents; returns them by partition index. A Spark job that
        fails first (executors whose Python cannot run the tasks, say) ends the wait within a fraction of a second.

        Raises:
            SparkStartTimeoutError: fewer arrived in time; the message says how many, and what to check.
            RuntimeError: the Spark job failed before they arrived (the message quotes Spark's error).
        """
        deadline = time.monotonic() + self.start_timeout
        enough = lambda agents: len(agents) >= count or not self.running  # noqa: E731
        while not self.server.wait_for(enough, max(0.0, min(_POLL_SECONDS, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                break
        agents = self.server.agents()
        if len(agents) >= count:
            return agents[:count]
        if not self.running:
            raise RuntimeError(_failed_early_message(self.error)) from self.error
        started = len(agents)
        raise SparkStartTimeoutError(
            f"Timed out after {self.start_timeout:g}s waiting for Spark tasks to start: {started} of {count} "
            f"task(s) started. Each Horovod process runs in a Spark task, and all of them must "
            f"run at once: the cluster offers {self.context.defaultParallelism} task slot(s) now. Add executors or "
            f"cores, or raise start_timeout (HOROVOD_SPARK_START_TIMEOUT) if executors are allocated on demand.")

    def stop(self, cancel: bool = False) -> None:
        """End every agent, wait for the Spark job (cancel it at once with ``cancel``, else if it lingers), stop
        the servers."""
        self.server.close()
        self._thread.join(0 if cancel else _STOP_SECONDS)
        if self._thread.is_alive():
            self.context.cancelJobGroup(self.group)
            self._thread.join(_STOP_SECONDS)
        self.pool.close()


def _spark_error_summary(error: Optional[BaseException]) -> str:
    """Spark's error without the JVM's stack frames (a ``Py4JJavaError`` quotes every ``at ...`` line)."""
    if error is None:
        return "the Spark job ended without a result or an error"
    lines = [line for line in str(error).splitlines()
             if line.strip() and not line.lstrip().startswith(("at ", "... "))]
    text = "\n".join(lines) or type(error).__name__
    return text if len(text) <= _SPARK_ERROR_CHARS else text[:_SPARK_ERROR_CHARS] + " ..."


def _failed_early_message(error: Optional[BaseException]) -> str:
    return (f"the Spark job of Horovod's tasks failed before they started: {_spark_error_summary(error)}\n"
            f"Check that the executors' Python runs the tasks and imports horovod: set PYSPARK_PYTHON to such an "
            f"interpreter (the driver's own, sys.executable, on one machine) before the SparkContext starts.")
