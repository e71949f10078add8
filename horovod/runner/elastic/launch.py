"""Start an elastic job from ``horovodrun``'s flags or ``horovod.run``'s arguments.

The same pipeline as a static job, one slot at a time: the driver (:mod:`.job`) plans slots, the
:class:`~horovod.runner.backends.ssh.SshBackend` starts each worker locally or over ssh, one
:class:`~horovod.runner.supervisor.Supervisor` relays output and reaps, and SIGINT/SIGTERM stop the job.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO, Tuple

from horovod.common import config
from horovod.runner import network
from horovod.runner.backends.ssh import SshBackend
from horovod.runner.elastic.discovery import FixedHosts, HostDiscoveryError, HostDiscoveryScript
from horovod.runner.elastic.driver import ElasticSettings
from horovod.runner.elastic.job import ElasticJob
from horovod.runner.elastic.spawner import ElasticSpawner
from horovod.runner.hosts import resolve_hosts
from horovod.runner.network import parse_nics
from horovod.runner.noise import hides_notes, quiet_defaults
from horovod.runner.output import OutputSink
from horovod.runner.procgroup import forward_signals
from horovod.runner.rendezvous import LOOPBACK, RendezvousPool, plan_rendezvous, remote_hosts
from horovod.runner.ssh import SshConfig, ssh_config
from horovod.runner.supervisor import Supervisor

__all__ = ["is_elastic", "settings_from_values", "discovery_from_values", "local_rendezvous_address",
           "run_elastic_job", "main_elastic"]


def is_elastic(values: Mapping[str, Any]) -> bool:
    """Whether the flags ask for an elastic job (a discovery script, ``--min-np`` or ``--max-np``)."""
    return bool(values.get("host_discovery_script")) or values.get("min_np") is not None \
        or values.get("max_np") is not None


def settings_from_values(values: Mapping[str, Any]) -> ElasticSettings:
    """:class:`ElasticSettings` from parsed flags; ``HOROVOD_ELASTIC_TIMEOUT``/``_START_TIMEOUT`` as defaults.

    Raises:
        ValueError: inconsistent numbers of processes or a bad cooldown range.
    """
    defaults = config.load_config()
    np, min_np, max_np = values.get("np"), values.get("min_np"), values.get("max_np")
    if np is None and min_np is None:
        raise ValueError("an elastic job needs -np or --min-np")
    min_np = min_np if min_np is not None else np
    cooldown = values.get("blacklist_cooldown_range")
    timeout = values.get("elastic_timeout")
    start = values.get("start_timeout")
    return ElasticSettings(min_np=min_np, max_np=max_np,
                           elastic_timeout=float(timeout if timeout is not None else defaults.elastic_timeout),
                           start_timeout=float(start if start is not None else defaults.start_timeout),
                           reset_limit=values.get("reset_limit"),
                           cooldown_range=tuple(float(v) for v in cooldown) if cooldown else None)


def discovery_from_values(values: Mapping[str, Any]):
    """The discovery script, else the fixed hosts of ``-H``/``--hostfile`` (default ``localhost:<np>``)."""
    if values.get("host_discovery_script"):
        return HostDiscoveryScript(values["host_discovery_script"], values.get("slots"))
    count = values.get("np") or values.get("max_np") or values.get("min_np")
    return FixedHosts(resolve_hosts(count, values.get("hosts"), values.get("hostfile")))


def local_rendezvous_address(discovery, nics: Sequence[str]) -> str:
    """The address workers on this machine use: ``--network-interface``'s, else as for a static job of the first
    discovered hosts (not loopback when some of them are remote, so what those workers publish is reachable from the
    others); loopback when discovery fails now or a host does not route (the job reports either itself)."""
    try:
        if nics:
            return network.launcher_addresses(["localhost"], nics)["localhost"]
        hostnames = [h.hostname for h in discovery.find_available_hosts_and_slots()]
        if not remote_hosts(hostnames):
            return LOOPBACK
        return plan_rendezvous([*hostnames, "localhost"], nics)["localhost"]
    except (HostDiscoveryError, network.NetworkError):
        return LOOPBACK


def run_elastic_job(command: Sequence[str], settings: ElasticSettings, discovery, extra_env: Mapping[str, str],
                    prefix_timestamp: bool = False, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                    prepare_store: Optional[Callable[[Any], None]] = None,
                    finish_store: Optional[Callable[[Any], None]] = None, ssh: Optional[SshConfig] = None,
                    nics: Sequence[str] = ()) -> Tuple[int, str]:
    """Serve a rendezvous, run the elastic driver until the job ends; returns ``(exit_code, message)``.

    Args:
        prepare_store, finish_store: called with the store before the job starts and after it ended
            (``horovod.run`` puts its function in and takes the results out).
        ssh: how to reach hosts that are not this machine (default: ``HOROVOD_SSH_ARGS``, start timeout).
        nics: ``--network-interface(s)``, for the rendezvous address each host uses.
    """
    env = {**extra_env, "HOROVOD_ELASTIC_TIMEOUT": repr(settings.elastic_timeout),
           "HOROVOD_START_TIMEOUT": repr(settings.start_timeout)}
    backend = SshBackend(ssh or ssh_config({"start_timeout": settings.start_timeout}))
    with RendezvousPool() as pool:
        local_address = local_rendezvous_address(discovery, nics)
        pool.serve(local_address)
        if prepare_store is not None:
            prepare_store(pool.store)
        base = config.environ_snapshot()
        shared = {**base, **env}                # what every worker's environment holds but its place and address
        supervisor = Supervisor(OutputSink(0, stdout, stderr, None, prefix_timestamp,
                                           hide_notes=hides_notes({**shared, **quiet_defaults(shared)})))
        spawner = ElasticSpawner(command, backend, supervisor, lambda host: pool.serve_for(host, nics, local_address),
                                 base, env)
        job = ElasticJob(settings, discovery, spawner, pool.store)
        with forward_signals(job.interrupt):
            result = job.run()
        if finish_store is not None:
            finish_store(pool.store)
        # A failed job whose store ran out of descriptors says so where the user reads, not only in the log.
        if result[0] != 0 and pool.exhausted:
            trouble = f"The launcher could not serve: {pool.exhausted.rstrip('.')}."
            print(f"horovodrun: {trouble}", file=stderr or sys.stderr, flush=True)
            result = (result[0], f"{result[1]}\n{trouble}" if result[1] else trouble)
    return result


def main_elastic(values: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """``horovodrun`` for an elastic job; returns the exit status."""
    settings = settings_from_values(values)
    code, _ = run_elastic_job(values["command"], settings, discovery_from_values(values), env,
                              prefix_timestamp=bool(values.get("prefix_output_with_timestamp")),
                              ssh=ssh_config(values), nics=parse_nics(values.get("nic"), values.get("nics")))
    return code
