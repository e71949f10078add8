"""``horovod.run``: run a Python function on every worker of a job and return the results by rank.

The arguments become the same options ``horovodrun`` parses (by its argparse destinations), and the job runs through
the same pipeline: :func:`horovod.runner.plan.run_static` for a static job, :mod:`horovod.runner.elastic.api` for an
elastic one (any of ``min_np``, ``max_np``, ``host_discovery_script``). Workers run
``python -m horovod.runner.run_task`` with the environment ``horovodrun`` gives, so ``func`` may call ``hvd.init()``;
the function and its results travel cloudpickled through the job's rendezvous store
(:class:`~horovod.runner.outcomes.FunctionExchange`).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from horovod.runner.elastic.api import run_elastic
from horovod.runner.elastic.launch import is_elastic
from horovod.runner.hosts import resolve_hosts
from horovod.runner.pipeline import package_pythonpath
from horovod.runner.outcomes import FunctionExchange, WorkerFailedError, raise_for_outcomes
from horovod.runner.plan import plan_job, run_static

__all__ = ["run", "raise_for_outcomes", "WorkerFailedError"]


def _check(hosts, hostfile, use_gloo, use_mpi, mpi_args) -> None:
    if hosts and hostfile:
        raise ValueError("arguments hosts and hostfile are mutually exclusive")
    if use_gloo and use_mpi:
        raise ValueError("arguments use_gloo and use_mpi are mutually exclusive")
    if mpi_args and not use_mpi:
        raise ValueError("mpi_args needs use_mpi=True")


def _first(*given):
    return next((g for g in given if g is not None), None)


def run(func: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, num_proc: Optional[int] = None,
        min_num_proc: Optional[int] = None, max_num_proc: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range=None, hosts: Optional[str] = None,
        hostfile: Optional[str] = None, host_discovery_script: Optional[str] = None,
        start_timeout: Optional[float] = None, ssh_port: Optional[int] = None, ssh_identity_file: Optional[str] = None,
        disable_cache: Optional[bool] = None, output_filename: Optional[str] = None, verbose: Optional[int] = None,
        use_gloo: Optional[bool] = None, use_mpi: Optional[bool] = None, mpi_args: Optional[str] = None,
        network_interface: Optional[str] = None, network_interfaces: Optional[Sequence[str]] = None,
        executable: Optional[str] = None, np: Optional[int] = None, min_np: Optional[int] = None,
        max_np: Optional[int] = None, prefix_output_with_timestamp: bool = False) -> List[Any]:
    """Run ``func(*args, **kwargs)`` on every worker of a job and return the results, ordered by rank.

    The signature is Horovod's; output is relayed with ``[rank]<stdout>:`` prefixes. ``num_proc``/``np``: workers
    (default: all slots of ``hosts``/``hostfile``, else 1). ``hosts`` (``host:slots,...``) or ``hostfile``: hosts
    that are not this machine are reached over ssh (``ssh_port``, ``ssh_identity_file``, ``HOROVOD_SSH_ARGS``) and
    checked first within ``start_timeout``. ``output_filename``: also write each rank's output there. ``executable``:
    the workers' Python (default: this one). ``network_interface(s)``: the data plane's interfaces.
    ``min_np``/``min_num_proc``, ``max_np``/``max_num_proc``, ``slots``, ``reset_limit``, ``cooldown_range``,
    ``host_discovery_script``: an elastic job; its result is the final round's workers' values. ``use_mpi``: Open
    MPI's ``mpirun`` starts the workers (``mpi_args``: its extra options), as ``horovodrun --mpi``. ``use_gloo`` and
    ``disable_cache`` are accepted.

    Returns:
        The list of ``func``'s return values, by rank.

    Raises:
        ValueError: both ``hosts`` and ``hostfile``, or both ``use_gloo`` and ``use_mpi``, or bad hosts.
        MpiNotFoundError: ``use_mpi`` without Open MPI's ``mpirun``.
        HostCheckError: a remote host cannot be logged into, run horovod or reach the launcher.
        BaseException: the exception a worker raised, with its traceback in the cause's message.
    """
    _check(hosts, hostfile, use_gloo, use_mpi, mpi_args)
    values = dict(np=_first(num_proc, np), min_np=_first(min_np, min_num_proc), max_np=_first(max_np, max_num_proc),
                  slots=slots, reset_limit=reset_limit, blacklist_cooldown_range=cooldown_range, hosts=hosts,
                  hostfile=hostfile, host_discovery_script=host_discovery_script, start_timeout=start_timeout,
                  ssh_port=ssh_port, ssh_identity_file=ssh_identity_file, output_filename=output_filename,
                  verbose=verbose, nic=network_interface, nics=network_interfaces, python=executable,
                  prefix_output_with_timestamp=prefix_output_with_timestamp, use_mpi=use_mpi, mpi_args=mpi_args)
    exchange = FunctionExchange(func, args, kwargs)
    extra_env = package_pythonpath(include_caller_path=True)
    if is_elastic(values):
        return run_elastic(exchange, values, extra_env)
    return _run_static(exchange, values, extra_env)


def _run_static(exchange: FunctionExchange, values: Dict[str, Any], extra_env: Dict[str, str]) -> List[Any]:
    if values["np"] is None:
        values["np"] = sum(h.slots for h in resolve_hosts(1, values["hosts"], values["hostfile"]))
    command = (values["python"] or sys.executable, "-m", "horovod.runner.run_task")
    launch = plan_job(values, command, extra_env)
    result = run_static(values, launch, prepare_store=exchange.publish, finish_store=exchange.collect)
    return raise_for_outcomes(result, exchange.outcomes, values["np"])
