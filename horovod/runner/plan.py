"""From parsed options to a finished static job: plan the slots, the rendezvous and the backend, then run.

``horovodrun`` (:mod:`horovod.runner.cli`) and ``horovod.run`` (:mod:`horovod.runner.api`) both express their options
as one mapping keyed by ``horovodrun``'s argparse destinations (``np``, ``hosts``, ``hostfile``, ``nic``, ``nics``,
``ssh_port``, ``use_mpi``...), and both run a static job through :func:`run_static`:

parse → :func:`plan_job` (slots) → :func:`choose_backend` (local, ssh or mpirun) → rendezvous served where each
host reaches it → :func:`horovod.runner.pipeline.run_job` (the backend starts the workers, one supervisor runs them).

Elastic jobs take the same options to :mod:`horovod.runner.elastic.launch`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from horovod.runner import tunables
from horovod.runner.backends.base import Backend
from horovod.runner.backends.local import LocalBackend
from horovod.runner.backends.mpirun import MpirunBackend
from horovod.runner.backends.ssh import SshBackend
from horovod.runner.hosts import get_host_assignments, resolve_hosts
from horovod.runner.pipeline import LaunchConfig, run_job
from horovod.runner.network import parse_nics
from horovod.runner.rendezvous import multihost_rendezvous, plan_rendezvous, remote_hosts
from horovod.runner.ssh import ssh_config
from horovod.runner.supervisor import JobResult, with_launcher_trouble

__all__ = ["launcher_env", "plan_job", "choose_backend", "run_static", "exit_status"]


def launcher_env(values: Mapping[str, Any]) -> Dict[str, str]:
    """Every variable the options set for workers: the tunables plus network interfaces and ``--tcp``."""
    env = tunables.tunables_to_env(values)
    nics = parse_nics(values.get("nic"), values.get("nics"))
    if nics:
        env["HOROVOD_GLOO_IFACE"] = ",".join(nics)  # each host uses the first of them it has
    if values.get("tcp_flag"):
        env["NCCL_IB_DISABLE"] = "1"
    return env


def plan_job(values: Mapping[str, Any], command: Sequence[str], extra_env: Mapping[str, str] = ()) -> LaunchConfig:
    """The slots of a static job (``np`` ranks over ``-H``/``--hostfile``, default ``localhost:np``), its command
    and its workers' variables (:func:`launcher_env` plus ``extra_env``).

    Raises:
        ValueError: bad hosts, or more processes than slots.
    """
    hosts = resolve_hosts(values["np"], values.get("hosts"), values.get("hostfile"))
    slots = get_host_assignments(hosts, values["np"])
    return LaunchConfig(command=tuple(command), slots=tuple(slots),
                        extra_env={**launcher_env(values), **dict(extra_env)},
                        output_filename=values.get("output_filename"),
                        prefix_timestamp=bool(values.get("prefix_output_with_timestamp")),
                        verbose=bool(values.get("verbose")))


def choose_backend(values: Mapping[str, Any], hostnames: Sequence[str]) -> Backend:
    """``mpirun`` with ``use_mpi``; ssh when some host is not this machine; else local processes."""
    log = _stdout if values.get("verbose") else None
    if values.get("use_mpi"):
        return MpirunBackend(None, values.get("ssh_port"), values.get("ssh_identity_file"), values.get("mpi_args"),
                             verbose_log=log)
    if remote_hosts(hostnames):
        return SshBackend(ssh_config(values), log=log)
    return LocalBackend()


def run_static(values: Mapping[str, Any], launch: LaunchConfig,
               prepare_store: Optional[Callable[[Any], None]] = None,
               finish_store: Optional[Callable[[Any], None]] = None) -> JobResult:
    """Serve the rendezvous where every host reaches it, start the workers with :func:`choose_backend`'s backend
    and supervise them to the end.

    Args:
        values: the options (``nic``/``nics``, ssh and mpirun settings, ``verbose``).
        launch: the planned job (:func:`plan_job`).
        prepare_store, finish_store: called with the store before the workers start and after they ended
            (``horovod.run`` puts its function in and takes the results out).

    Raises:
        NetworkError: a host does not route, or no named interface exists here.
        HostCheckError: a remote host failed its check; nothing was started.
        MpiNotFoundError: ``use_mpi`` without Open MPI's ``mpirun``.
        OSError: a worker could not be started.
    """
    hostnames = [s.hostname for s in launch.slots]
    addresses = plan_rendezvous(hostnames, parse_nics(values.get("nic"), values.get("nics")))
    backend = choose_backend(values, hostnames)
    with multihost_rendezvous(addresses) as (pool, rendezvous):
        if prepare_store is not None:
            prepare_store(pool.store)
        result = run_job(launch, backend, rendezvous)
        if finish_store is not None:
            finish_store(pool.store)
        # A failed job whose store ran out of descriptors says so in its report, not only in the launcher's log.
        return with_launcher_trouble(result, pool.exhausted)


def exit_status(result: JobResult, passthrough: bool = False) -> int:
    """The launcher's exit status; with ``passthrough`` (one process ran every rank: ``mpirun``), its own status."""
    if passthrough and result.interrupted_by is None and result.exits:
        code = result.exits[0].returncode
        return code if code >= 0 else 128 - code
    return result.exit_code


def _stdout(text: str) -> None:
    print(text, file=sys.stdout, flush=True)  # verbose lines go where Horovod's verbose launcher prints them
