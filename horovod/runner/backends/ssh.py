"""The ssh backend: workers of this machine start as local processes, those of other hosts through ssh.

This is the runner's one place that decides local-or-ssh per slot, for static and elastic jobs alike. Before the
first worker of a remote host starts, the host is checked once (:func:`horovod.runner.ssh.check_hosts`, in parallel
and bounded by the start timeout): ssh logs in, the remote Python runs horovod, and the host reaches the rendezvous
address its workers were given. The workers of a remote host run under one ``ssh ... python -m horovod.runner.ssh_boot --host-mode``
(:mod:`horovod.runner.ssh_host`): their environments (secret included), working directory and commands travel as one
payload line on ssh's standard input, which stays open for the workers' lives; their output and exits come back as
frames on ssh's standard output (:mod:`.host_channel`). Releasing the host's last handle or killing the ssh client
ends the channel, and the remote side stops the workers' process groups.
"""

from __future__ import annotations

import os
import subprocess
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

from horovod.common import config
from horovod.runner.backends.base import WorkerHandle, WorkerLaunch, start_groups
from horovod.runner.backends.host_channel import HostChannel
from horovod.runner.backends.local import start_local
from horovod.runner.hosts import is_local_host
from horovod.runner.pipeline import without_launcher_vars
from horovod.runner.procgroup import start_session
from horovod.runner.ssh import SshConfig, boot_command, check_hosts, remote_env, ssh_argv
from horovod.runner.ssh_host import make_host_payload

__all__ = ["SshBackend", "launcher_environment", "rendezvous_probes"]


def launcher_environment() -> Dict[str, str]:
    """The launcher's environment without any variable a launcher decides (never a job secret): what ssh clients
    run with."""
    return without_launcher_vars(config.environ_snapshot())


def rendezvous_probes(launches: Sequence[WorkerLaunch]) -> Dict[str, List[str]]:
    """For each remote host of ``launches``, the rendezvous addresses (``addr:port``) its workers were given."""
    probes: Dict[str, List[str]] = {}
    for launch in launches:
        if is_local_host(launch.hostname):
            continue
        address = f"{launch.env['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{launch.env['HOROVOD_GLOO_RENDEZVOUS_PORT']}"
        known = probes.setdefault(launch.hostname, [])
        if address not in known:
            known.append(address)
    return probes


class SshBackend:
    """Starts each worker locally or over ssh, by its host; checks every remote host once, before its first worker.

    Args:
        ssh: how to reach remote hosts (:func:`horovod.runner.ssh.ssh_config`); ``ssh.timeout`` bounds each check.
        ssh_env: the ssh clients' environment (default: :func:`launcher_environment`).
        cwd: the working directory remote workers start in (default: this one).
        log: where to report the checks (None: silent).
        popen: the process spawner (a parameter so tests can substitute it).
    """

    name = "ssh"

    def __init__(self, ssh: SshConfig, ssh_env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                 log: Optional[Callable[[str], None]] = None,
                 popen: Callable[..., subprocess.Popen] = subprocess.Popen):
        self.ssh = ssh
        self.ssh_env = dict(launcher_environment() if ssh_env is None else ssh_env)
        self.cwd = os.getcwd() if cwd is None else cwd
        self._log = log
        self._popen = popen
        self._checked: Set[str] = set()

    def check(self, launches: Sequence[WorkerLaunch]) -> None:
        """Check the remote hosts of ``launches`` not checked before, all in parallel.

        Raises:
            HostCheckError: naming every host that failed and why (ssh's own words); nothing was started.
        """
        probes = {h: p for h, p in rendezvous_probes(launches).items() if h not in self._checked}
        if probes:
            check_hosts(self.ssh, probes, self.ssh_env, self._log)
            self._checked.update(probes)

    def start(self, launches: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        """Check new remote hosts, then start the workers: local ones as processes, each remote host's through one
        ssh client (:mod:`.host_channel`); see :meth:`horovod.runner.backends.base.Backend.start`."""
        self.check(launches)
        groups: Dict[str, List[WorkerLaunch]] = {}
        for launch in launches:
            # A local worker is a group of its own; a remote host's workers share one ssh client.
            groups.setdefault(f"local:{launch.rank}" if is_local_host(launch.hostname) else launch.hostname,
                              []).append(launch)
        return start_groups(list(groups.values()), lambda group: self._start_group(group, grace_seconds))

    def _start_group(self, group: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        if is_local_host(group[0].hostname):
            return {group[0].rank: start_local(group[0], self._popen)}
        return self._start_host(group[0].hostname, group, grace_seconds)

    def _start_host(self, hostname: str, group: Sequence[WorkerLaunch],
                    grace_seconds: float) -> Dict[int, WorkerHandle]:
        argv = ssh_argv(self.ssh, hostname, boot_command(self.ssh, "--host-mode"))
        proc = start_session(argv, self.ssh_env, stdin=subprocess.PIPE, popen=self._popen)
        workers = [{"rank": launch.rank, "command": launch.command, "env": remote_env(launch.env)}
                   for launch in group]
        try:
            proc.stdin.write(make_host_payload(workers, self.cwd, grace_seconds))
            proc.stdin.flush()
        except OSError:
            pass  # ssh already exited; its exit status tells why
        channel = HostChannel(proc, [launch.rank for launch in group])
        return dict(channel.workers)
