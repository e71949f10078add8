"""``horovod.run``: run a Python function on every worker of a job and return the results by rank."""

from __future__ import annotations

import shlex
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import cloudpickle

from horovod.common.exceptions import HorovodError
from horovod.runner.hosts import HostInfo, get_host_assignments, resolve_hosts
from horovod.common.config import load_config
from horovod.runner.launch import (LaunchConfig, NotAvailableYetError, launch_local, package_pythonpath,
                                   rendezvous_service)
from horovod.runner.multihost import launch_multihost, multihost_rendezvous, plan_rendezvous, remote_hosts
from horovod.runner.ssh import SshConfig
from horovod.runner.processes import JobResult, failure_message
from horovod.runner.run_task import FUNC_KEY, FUNC_SCOPE, RESULT_SCOPE, TaskOutcome


class WorkerFailedError(HorovodError):
    """A worker of ``horovod.run`` raised; the message carries that rank's traceback."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def raise_for_outcomes(result: JobResult, outcomes: Mapping[int, TaskOutcome], size: int) -> List[Any]:
    """Decide what ``horovod.run`` returns or raises from the job's result and each rank's published outcome.

    Args:
        result: how the worker processes ended.
        outcomes: the outcomes the workers published, by rank.
        size: the number of workers.

    Returns:
        The values returned by each rank, ordered by rank.

    Raises:
        BaseException: the exception the first failed rank raised (its original type when it pickled), with a
            :class:`WorkerFailedError` carrying the rank's traceback as its cause.
        KeyboardInterrupt: the launcher got SIGINT.
        RuntimeError: a worker died without publishing an outcome.
    """
    failed = sorted(r for r, o in outcomes.items() if o.failed)
    if failed:
        first = result.first_failure.rank if result.first_failure and result.first_failure.rank in failed \
            else failed[0]
        outcome = outcomes[first]
        error = WorkerFailedError(f"rank {first} of {size} raised {outcome.error_repr}; its traceback:\n"
                                  f"{outcome.traceback}", first)
        if isinstance(outcome.error, Exception):
            if hasattr(outcome.error, "add_note"):
                outcome.error.add_note(f"(raised on rank {first}; see the cause below for its traceback)")
            raise outcome.error from error
        raise error
    if result.interrupted_by is not None:
        raise KeyboardInterrupt(f"horovod.run interrupted by signal {result.interrupted_by}")
    if result.first_failure is not None:
        raise RuntimeError(failure_message(result.first_failure))
    missing = [r for r in range(size) if r not in outcomes]
    if missing or result.timed_out:
        raise RuntimeError(f"rank(s) {missing} ended without publishing a result")
    return [outcomes[r].value for r in range(size)]


def _load_outcome(rank: int, data: bytes) -> TaskOutcome:
    try:
        return cloudpickle.loads(data)
    except Exception as exc:  # noqa: BLE001 — a class of the worker's that this process cannot import
        return TaskOutcome(rank, error_repr=f"unloadable outcome ({exc!r})",
                           traceback=f"the outcome of rank {rank} cannot be unpickled here: {exc!r}\n")


def run(func: Callable, args: Sequence = (), kwargs: Optional[Dict[str, Any]] = None, num_proc: Optional[int] = None,
        min_num_proc: Optional[int] = None, max_num_proc: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range=None, hosts: Optional[str] = None,
        hostfile: Optional[str] = None, host_discovery_script: Optional[str] = None,
        start_timeout: Optional[float] = None, ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None, disable_cache: Optional[bool] = None,
        output_filename: Optional[str] = None, verbose: Optional[int] = None, use_gloo: Optional[bool] = None,
        use_mpi: Optional[bool] = None, mpi_args: Optional[str] = None, network_interface: Optional[str] = None,
        network_interfaces: Optional[Sequence[str]] = None, executable: Optional[str] = None,
        np: Optional[int] = None, min_np: Optional[int] = None, max_np: Optional[int] = None,
        prefix_output_with_timestamp: bool = False) -> List[Any]:
    """Run ``func(*args, **kwargs)`` on every worker of a job and return the results, ordered by rank.

    The signature is Horovod's. Workers run ``python -m horovod.runner.run_task`` with the same environment
    ``horovodrun`` gives, so ``func`` may call ``hvd.init()``; the function and its results travel cloudpickled
    through the job's rendezvous store. Their output is relayed with ``[rank]<stdout>:`` prefixes.

    Args:
        func: a cloudpicklable function.
        args, kwargs: its arguments.
        num_proc, np: the number of workers (default: all slots of ``hosts``/``hostfile``, else 1).
        hosts: ``host:slots,...``; hostfile: a file of ``host slots=N`` lines; hosts that are not this machine are
            reached over ssh (``ssh_port``, ``ssh_identity_file``, ``HOROVOD_SSH_ARGS``), checked first within
            ``start_timeout``.
        output_filename: also write each rank's output under this directory.
        verbose: print what the launcher does.
        use_gloo: accepted (the TCP controller is the only one).
        executable: the Python interpreter of the workers (default: this one).
        network_interface, network_interfaces: interface(s) for the data plane.
        disable_cache: accepted for compatibility.
        min_np/min_num_proc, max_np/max_num_proc, slots, reset_limit, cooldown_range, host_discovery_script:
            an elastic job (any of min/max/discovery script); its result is the final round's workers' values.
        use_mpi, mpi_args: MPI jobs, not available yet.

    Returns:
        The list of ``func``'s return values, by rank.

    Raises:
        ValueError: both ``hosts`` and ``hostfile``, or both ``use_gloo`` and ``use_mpi``, or bad hosts.
        NotAvailableYetError: elastic or MPI jobs were requested.
        HostCheckError: a remote host cannot be logged into, run horovod or reach the launcher.
        BaseException: the exception a worker raised, with its traceback in the cause's message.
    """
    if hosts and hostfile:
        raise ValueError("arguments hosts and hostfile are mutually exclusive")
    if use_gloo and use_mpi:
        raise ValueError("arguments use_gloo and use_mpi are mutually exclusive")
    if use_mpi or mpi_args:
        raise NotAvailableYetError("the MPI controller (use_mpi/mpi_args) is not available yet")
    if any(v is not None for v in (min_num_proc, max_num_proc, min_np, max_np, host_discovery_script)):
        from horovod.runner.elastic.api import run_elastic
        return run_elastic(func, args, kwargs, np=num_proc if num_proc is not None else np,
                           min_np=min_np if min_np is not None else min_num_proc,
                           max_np=max_np if max_np is not None else max_num_proc, slots=slots,
                           reset_limit=reset_limit, cooldown_range=cooldown_range, hosts=hosts, hostfile=hostfile,
                           host_discovery_script=host_discovery_script, start_timeout=start_timeout,
                           executable=executable, extra_env=package_pythonpath(include_caller_path=True),
                           prefix_output_with_timestamp=prefix_output_with_timestamp)
    num_proc = num_proc if num_proc is not None else np
    host_list: List[HostInfo] = resolve_hosts(num_proc or 1, hosts, hostfile)
    if num_proc is None:
        num_proc = sum(h.slots for h in host_list)
    slot_infos = get_host_assignments(host_list, num_proc)
    extra_env = package_pythonpath(include_caller_path=True)
    nics = [network_interface] if network_interface else list(network_interfaces or [])
    if nics:
        extra_env["HOROVOD_GLOO_IFACE"] = ",".join(nics)
    launch = LaunchConfig(command=(executable or sys.executable, "-m", "horovod.runner.run_task"),
                          slots=tuple(slot_infos), extra_env=extra_env, output_filename=output_filename,
                          prefix_timestamp=prefix_output_with_timestamp, verbose=bool(verbose))
    if remote_hosts([h.hostname for h in host_list]):
        ssh = SshConfig(ssh_port, ssh_identity_file, tuple(shlex.split(load_config().ssh_args)),
                        executable or sys.executable,
                        start_timeout if start_timeout is not None else load_config().start_timeout)
        return _run_multihost(func, args, kwargs, launch, nics, ssh, num_proc)
    with rendezvous_service() as (server, rendezvous):
        server.store.put(FUNC_SCOPE, FUNC_KEY, cloudpickle.dumps((func, tuple(args), dict(kwargs or {}))))
        result = launch_local(launch, rendezvous)
        outcomes = {}
        for rank in range(num_proc):
            data = server.store.get(RESULT_SCOPE, str(rank))
            if data is not None:
                outcomes[rank] = _load_outcome(rank, data)
    return raise_for_outcomes(result, outcomes, num_proc)


def _run_multihost(func, args, kwargs, launch: LaunchConfig, nics: Sequence[str], ssh: SshConfig,
                   num_proc: int) -> List[Any]:
    with multihost_rendezvous(plan_rendezvous([s.hostname for s in launch.slots], nics)) as (store, rendezvous):
        store.put(FUNC_SCOPE, FUNC_KEY, cloudpickle.dumps((func, tuple(args), dict(kwargs or {}))))
        result = launch_multihost(launch, rendezvous, ssh)
        outcomes = {rank: _load_outcome(rank, data) for rank in range(num_proc)
                    if (data := store.get(RESULT_SCOPE, str(rank))) is not None}
    return raise_for_outcomes(result, outcomes, num_proc)


__all__ = ["run", "raise_for_outcomes", "WorkerFailedError"]
