"""``horovod.spark.run`` and ``horovod.spark.run_elastic``: a function on Horovod ranks that are Spark tasks.

Both go through the runner's launch pipeline: the job's rendezvous and secret (:class:`RendezvousPool`), each
worker's environment (:func:`horovod.runner.pipeline.worker_env`), a backend that starts workers
(:class:`horovod.runner.backends.spark.SparkBackend`: one agent per Spark task) and the one
:class:`~horovod.runner.supervisor.Supervisor` (output relay, fail-fast, reaping). The function and its results
travel through the rendezvous store as for ``horovod.run`` (:mod:`horovod.runner.run_task`), and a failure becomes
the rank's exception with its traceback (:func:`horovod.runner.api.raise_for_outcomes`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from horovod.common import config
from horovod.common.exceptions import HorovodError, HorovodInternalError
from horovod.runner.backends.base import WorkerLaunch
from horovod.runner.backends.spark import Agent, AgentInfo, AgentServer, SparkBackend
from horovod.runner.elastic.driver import ElasticSettings
from horovod.runner.elastic.job import ElasticJob
from horovod.runner.elastic.spawner import ElasticSpawner
from horovod.runner.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.pipeline import package_pythonpath, worker_env
from horovod.runner.noise import hides_notes
from horovod.runner.output import OutputSink
from horovod.runner.procgroup import forward_signals
from horovod.runner.outcomes import FunctionExchange, raise_for_outcomes
from horovod.runner.supervisor import JobResult, Supervisor
from horovod.spark.driver import SparkJob, SparkStartTimeoutError, active_context, start_timeout_seconds

__all__ = ["run", "run_elastic", "plan_slots", "root_cause_first", "AgentDiscovery", "SparkStartTimeoutError"]

_RUN_TASK = ("python", "-m", "horovod.runner.run_task")
_ELASTIC_RUN_TASK = ("python", "-m", "horovod.runner.elastic.run_task")


def plan_slots(agents: Sequence[AgentInfo]) -> Tuple[List[SlotInfo], Dict[int, int]]:
    """Each agent's place in the job: hosts in the order their first task appears, each host's tasks together.

    Returns:
        The slots by rank, and for each rank the partition index of the agent that runs it (the rank is the
        partition index whenever each host's tasks have consecutive indices, as on one machine).
    """
    ordered = sorted(agents, key=lambda a: a.index)
    hosts: Dict[str, List[int]] = {}
    for agent in ordered:
        hosts.setdefault(agent.host, []).append(agent.index)
    slots = get_host_assignments([HostInfo(h, len(indices)) for h, indices in hosts.items()], len(ordered))
    return slots, {slot.rank: hosts[slot.hostname][slot.local_rank] for slot in slots}


def _extra_env(env: Optional[Mapping[str, str]], nics) -> Dict[str, str]:
    extra = package_pythonpath(include_caller_path=True)
    extra.update(dict(env or {}))
    names = [nics] if isinstance(nics, str) else list(nics or [])
    if names:
        extra["HOROVOD_GLOO_IFACE"] = ",".join(names)
    return extra


def _check_controller(use_mpi, use_gloo, extra_mpi_args) -> None:
    if use_mpi and use_gloo:
        raise ValueError("arguments use_gloo and use_mpi are mutually exclusive")
    if use_mpi or extra_mpi_args:
        raise ValueError("horovod.spark runs ranks with the TCP/shared-memory controller only; use_mpi and "
                         "extra_mpi_args are not available")


def root_cause_first(result: JobResult, outcomes: Mapping[int, Any]) -> JobResult:
    """``result`` with its first failure moved to a rank that raised something of its own, when the first rank to
    exit only saw a peer fail (a ``HorovodInternalError``): the supervisor hears of exits over the agents'
    connections, so their order is not the order in which the ranks failed."""
    first = result.first_failure
    consequence = lambda o: isinstance(o.error, HorovodInternalError)  # noqa: E731
    if first is None or first.rank not in outcomes or not consequence(outcomes[first.rank]):
        return result
    causes = [e for e in result.exits if e.rank in outcomes and outcomes[e.rank].failed
              and not consequence(outcomes[e.rank])]
    return dataclasses.replace(result, first_failure=causes[0]) if causes else result


def _supervise(launches: List[WorkerLaunch], backend: SparkBackend, sink: OutputSink, verbose: int) -> JobResult:
    log = (lambda text: print(text, file=sys.stderr, flush=True))
    if verbose >= 2:
        log(f"horovod.spark: launching {len(launches)} worker(s) on Spark tasks on "
            f"{', '.join(sorted({w.hostname for w in launches}))}")
    with Supervisor(sink, log=log) as supervisor, forward_signals(supervisor.interrupt):
        for rank, handle in backend.start(launches, supervisor.grace_seconds).items():
            supervisor.add(rank, launches[rank].hostname, handle)
        return supervisor.wait()


def run(fn, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, num_proc: Optional[int] = None,
        start_timeout: Optional[float] = None, use_mpi: Optional[bool] = None, use_gloo: Optional[bool] = None,
        extra_mpi_args: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
        stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None, verbose: int = 1, nics=None,
        prefix_output_with_timestamp: bool = False, executable: Optional[str] = None) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` Horovod ranks, one per Spark task; the results by rank.

    The tasks start together (a barrier stage), so the job needs ``num_proc`` free task slots at once. Each rank is
    a process started by its task with the environment ``horovodrun`` gives, so ``fn`` calls ``hvd.init()`` as
    usual; ranks on one host share memory. Output is relayed with ``[rank]<stdout>:`` prefixes.

    Args:
        fn: a cloudpicklable function.
        args, kwargs: its arguments.
        num_proc: the number of ranks (default: ``spark.default.parallelism``).
        start_timeout: seconds for all tasks to start (default ``HOROVOD_SPARK_START_TIMEOUT``, else 600).
        use_gloo: accepted (the TCP/shared-memory controller is the only one).
        use_mpi, extra_mpi_args: refused (no MPI here).
        env: extra variables for the ranks, over each task's own environment.
        stdout, stderr: where the ranks' prefixed output goes (default: this process's).
        verbose: 2 prints what the launcher does.
        nics: network interface name(s) for the data plane.
        prefix_output_with_timestamp: prefix each output line with the time.
        executable: the ranks' Python (default: the Python of each task).

    Returns:
        ``fn``'s return values, by rank.

    Raises:
        SparkStartTimeoutError: the tasks did not all start in time (the message says how many did).
        BaseException: what the first failed rank raised, with its traceback in the cause's message.
        RuntimeError: no active SparkContext, or a rank died without a result (the message names it).
    """
    _check_controller(use_mpi, use_gloo, extra_mpi_args)
    context = active_context()
    num_proc = int(num_proc or context.defaultParallelism)
    timeout = start_timeout_seconds(start_timeout)
    extra = _extra_env(env, nics)
    exchange = FunctionExchange(fn, args, kwargs)
    with SparkJob(context, num_proc, timeout) as job:
        exchange.publish(job.store)
        agents = {a.info.index: a for a in job.wait_for_agents(num_proc)}
        slots, by_rank = plan_slots([a.info for a in agents.values()])
        launches = [WorkerLaunch(slot, _RUN_TASK, worker_env({}, slot, job.rendezvous, extra)) for slot in slots]
        config.report_variables({**config.environ_snapshot(), **extra})  # the ranks leave it to the driver
        backend = SparkBackend(lambda launch: agents[by_rank[launch.rank]], executable, timeout)
        sink = OutputSink(num_proc, stdout, stderr, None, prefix_output_with_timestamp, hides_notes(launches[0].env))
        result = _supervise(launches, backend, sink, verbose)
        exchange.collect(job.store)
    return raise_for_outcomes(root_cause_first(result, exchange.outcomes), exchange.outcomes, num_proc)


class AgentDiscovery:
    """An elastic job's hosts: the connected agents that have not run a worker yet, one slot each, by partition
    (each attempt of a task is a host of its own, see :func:`horovod.spark.task.elastic_agent`)."""

    def __init__(self, server: AgentServer):
        self.server = server

    def find_available_hosts_and_slots(self) -> List[HostInfo]:
        """The hosts available now."""
        return [HostInfo(a.info.host, 1) for a in self.server.agents()
                if a.worker is None or a.worker.poll() is None]


def _place_by_host(server: AgentServer):
    def place(launch: WorkerLaunch) -> Agent:
        return server.agent_for_host(launch.hostname)
    return place


def _elastic_settings(context, num_proc, min_np, max_np, start_timeout, elastic_timeout,
                      reset_limit) -> ElasticSettings:
    num_proc = int(num_proc or min_np or context.defaultParallelism)
    return ElasticSettings(min_np=int(min_np or num_proc), max_np=int(max_np or num_proc),
                           start_timeout=start_timeout_seconds(start_timeout), reset_limit=reset_limit,
                           elastic_timeout=float(elastic_timeout if elastic_timeout is not None
                                                 else config.load_config().elastic_timeout))


def run_elastic(fn, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, num_proc: Optional[int] = None,
                min_num_proc: Optional[int] = None, max_num_proc: Optional[int] = None,
                start_timeout: Optional[float] = None, elastic_timeout: Optional[float] = None,
                reset_limit: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None, verbose: int = 1, nics=None,
                prefix_output_with_timestamp: bool = False, min_np: Optional[int] = None,
                max_np: Optional[int] = None, executable: Optional[str] = None) -> List[Any]:
    """Run ``fn`` as an elastic Horovod job on Spark tasks; the final round's results, by rank.

    ``max_num_proc`` tasks (default ``num_proc``) run agents, not as a barrier stage. A task whose Python worker or
    executor is lost is retried by Spark (``spark.task.maxFailures``) and comes back as a new host; the ranks go on
    from their last commit meanwhile (``hvd.elastic.run`` and states, as under ``horovodrun``). Each task is a host
    of its own here, so ranks talk over TCP even on one machine.

    Args:
        num_proc: ranks to start with (default ``min_num_proc``, else ``spark.default.parallelism``).
        min_num_proc, min_np: the fewest ranks to train with (default ``num_proc``).
        max_num_proc, max_np: the most ranks, and the number of Spark tasks (default ``num_proc``).
        start_timeout: seconds for ``min_num_proc`` tasks to start (default ``HOROVOD_SPARK_START_TIMEOUT``, 600).
        elastic_timeout: seconds to wait for enough ranks after a loss (default ``HOROVOD_ELASTIC_TIMEOUT``).
        reset_limit: the most re-formations of the job.
        Others: as for :func:`run`.

    Raises:
        SparkStartTimeoutError: too few tasks started in time.
        BaseException: what the first failed rank of the final round raised.
        RuntimeError: the job stopped (reset limit, too few ranks for too long), with the reason.
    """
    context = active_context()
    settings = _elastic_settings(context, num_proc, min_np if min_np is not None else min_num_proc,
                                 max_np if max_np is not None else max_num_proc, start_timeout, elastic_timeout,
                                 reset_limit)
    timeout = settings.start_timeout
    extra = _extra_env(env, nics)
    extra.update({"HOROVOD_ELASTIC_TIMEOUT": repr(settings.elastic_timeout), "HOROVOD_START_TIMEOUT": repr(timeout)})
    exchange = FunctionExchange(fn, args, kwargs)
    with SparkJob(context, settings.max_np, timeout, elastic=True) as job:
        exchange.publish(job.store)
        job.wait_for_agents(settings.min_np)
        sink = OutputSink(0, stdout, stderr, None, prefix_output_with_timestamp)
        with Supervisor(sink) as supervisor:
            spawner = ElasticSpawner(_ELASTIC_RUN_TASK, SparkBackend(_place_by_host(job.server), executable, timeout),
                                     supervisor, lambda host: job.rendezvous, {}, extra)
            code, message = ElasticJob(settings, AgentDiscovery(job.server), spawner, job.store).run()
        exchange.collect(job.store)
    outcomes = exchange.outcomes
    if code != 0 and not any(o.failed for o in outcomes.values()):
        raise HorovodError(message or f"the elastic job ended with status {code}")
    return raise_for_outcomes(JobResult(()), outcomes, max(outcomes) + 1 if outcomes else 0)
