"""Start an elastic job from ``horovodrun``'s flags or ``horovod.run``'s arguments."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TextIO, Tuple

from horovod.common import config
from horovod.runner import network
from horovod.runner.elastic.discovery import FixedHosts, HostDiscoveryError, HostDiscoveryScript
from horovod.runner.elastic.driver import ElasticSettings
from horovod.runner.elastic.executor import LocalSpawner, SshHosts
from horovod.runner.elastic.job import ElasticJob
from horovod.runner.hosts import resolve_hosts
from horovod.runner.multihost import RendezvousPool, _nics, launcher_environment, plan_rendezvous, remote_hosts
from horovod.runner.processes import OutputSink
from horovod.runner.ssh import SshConfig


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


def ssh_from_values(values: Mapping[str, Any], settings: ElasticSettings) -> SshConfig:
    """How to reach remote hosts: ``-p``, ``-i``, ``HOROVOD_SSH_ARGS``; each host check is bounded by the start
    timeout."""
    return SshConfig.from_values(values.get("ssh_port"), values.get("ssh_identity_file"),
                                 config.load_config().ssh_args, settings.start_timeout)


def local_rendezvous_address(discovery, nics: Sequence[str]) -> str:
    """The address workers on this machine use: ``--network-interface``'s, else as for a static job of the first
    discovered hosts (not loopback when some of them are remote, so what those workers publish is reachable from the
    others); loopback when discovery fails now or a host does not route (the job reports either itself)."""
    try:
        if nics:
            return network.launcher_addresses(["localhost"], nics)["localhost"]
        hostnames = [h.hostname for h in discovery.find_available_hosts_and_slots()]
        if not remote_hosts(hostnames):
            return "127.0.0.1"
        return plan_rendezvous([*hostnames, "localhost"], nics)["localhost"]
    except (HostDiscoveryError, network.NetworkError):
        return "127.0.0.1"


@contextlib.contextmanager
def _forward_signals(job: ElasticJob) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: job.interrupt(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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
    env = dict(extra_env)
    env["HOROVOD_ELASTIC_TIMEOUT"] = repr(settings.elastic_timeout)
    env["HOROVOD_START_TIMEOUT"] = repr(settings.start_timeout)
    if ssh is None:
        ssh = SshConfig.from_values(None, None, config.load_config().ssh_args, settings.start_timeout)
    pool = RendezvousPool()
    try:
        rendezvous = pool.serve(local_rendezvous_address(discovery, nics))
        if prepare_store is not None:
            prepare_store(pool.store)
        sink = OutputSink(0, stdout, stderr, None, prefix_timestamp)
        remote = SshHosts(ssh, pool, launcher_environment(), os.getcwd(), nics)
        spawner = LocalSpawner(command, rendezvous, config.environ_snapshot(), env, sink, remote=remote)
        job = ElasticJob(settings, discovery, spawner, pool.store)
        with _forward_signals(job):
            result = job.run()
        if finish_store is not None:
            finish_store(pool.store)
    finally:
        pool.close()
    return result


def main_elastic(values: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """``horovodrun`` for an elastic job; returns the exit status."""
    settings = settings_from_values(values)
    code, _ = run_elastic_job(values["command"], settings, discovery_from_values(values), env,
                              prefix_timestamp=bool(values.get("prefix_output_with_timestamp")),
                              ssh=ssh_from_values(values, settings), nics=_nics(values))
    return code


__all__ = ["is_elastic", "settings_from_values", "discovery_from_values", "ssh_from_values",
           "local_rendezvous_address", "run_elastic_job", "main_elastic"]
