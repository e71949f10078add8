"""Jobs whose hosts are not all this machine: the rendezvous where remote hosts can reach it, then ssh launch.

Decide, then execute: :func:`plan_rendezvous` picks, per host, the launcher address that host will use (routing or
``--network-interface``, see :mod:`horovod.runner.network`); :func:`multihost_rendezvous` serves one store on each of
those addresses only; :func:`launch_multihost` checks every remote host over ssh (in parallel, bounded by the start
timeout) and then starts local workers directly and remote ones through ssh, under one fail-fast
:class:`~horovod.runner.processes.WorkerGroup`. Local workers of such a job use the same non-loopback address, so the
data-plane address they publish is one the remote workers can reach too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple

from horovod.common import config
from horovod.common.rendezvous_client import make_secret
from horovod.runner import network
from horovod.runner.hosts import is_local_host
from horovod.runner.launch import _LAUNCHER_VARS, LaunchConfig, RendezvousInfo, _forward_signals, worker_env
from horovod.runner.processes import JobResult, OutputSink, WorkerExit, WorkerGroup, WorkerSpec
from horovod.runner.rendezvous import KVStore, RendezvousServer
from horovod.runner.ssh import SshConfig, SshSpawner, boot_command, check_hosts, ssh_argv


def remote_hosts(hostnames: Sequence[str]) -> List[str]:
    """The hosts of ``hostnames`` that are not this machine, in order."""
    return [h for h in hostnames if not is_local_host(h)]


def plan_rendezvous(hostnames: Sequence[str], nics: Sequence[str] = ()) -> Dict[str, str]:
    """For every host of the job, the launcher address its workers use for the rendezvous.

    Remote hosts get the address that routes to them (or the named interface's); local hosts get the first of those
    addresses, never loopback, so that what their workers publish is reachable from the other hosts.

    Raises:
        NetworkError: a host does not resolve or route, or no named interface exists here.
    """
    remote = remote_hosts(hostnames)
    by_host = network.launcher_addresses(remote, nics)
    first = network.bind_addresses(by_host)[0] if by_host else "127.0.0.1"
    return {h: by_host.get(h, first) for h in hostnames}


class RendezvousPool:
    """One store and one fresh secret, served on each address asked for (an elastic job meets hosts as it goes).

    :meth:`serve` starts a server on an address the first time it is asked for; :meth:`close` stops them all.
    """

    def __init__(self, scope: Optional[str] = None):
        self.secret = make_secret()
        self.store = KVStore()
        self.scope = scope
        self._servers: Dict[str, RendezvousServer] = {}

    def serve(self, address: str) -> RendezvousInfo:
        """Where workers find the store on ``address`` (a server there is started once)."""
        server = self._servers.get(address)
        if server is None:
            server = RendezvousServer(self.secret, host=address, port=0)
            server.store = self.store  # every address serves the same job
            server.start()
            self._servers[address] = server
        return RendezvousInfo(address, server.port, self.secret, self.scope)

    def close(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers = {}


@contextlib.contextmanager
def multihost_rendezvous(addresses: Mapping[str, str], scope: Optional[str] = None
                         ) -> Iterator[Tuple[KVStore, Dict[str, RendezvousInfo]]]:
    """Serve one store, with one fresh secret, on each distinct address of ``addresses`` (host → address).

    Yields:
        The shared store and, per host, the :class:`RendezvousInfo` its workers get.
    """
    pool = RendezvousPool(scope)
    try:
        served = {a: pool.serve(a) for a in network.bind_addresses(addresses)}
        yield pool.store, {h: served[a] for h, a in addresses.items()}
    finally:
        pool.close()


def launcher_environment() -> Dict[str, str]:
    """The launcher's environment without any variable a launcher decides (never a job secret)."""
    return {k: v for k, v in config.environ_snapshot().items() if k not in _LAUNCHER_VARS}


def build_multihost_specs(launch: LaunchConfig, rendezvous: Mapping[str, RendezvousInfo], ssh: SshConfig,
                          spawner: SshSpawner, base_env: Mapping[str, str], cwd: str) -> List[WorkerSpec]:
    """One spec per slot: local slots run the command, remote ones its ssh command line (payload registered)."""
    specs = []
    for slot in launch.slots:
        env = worker_env(base_env, slot, rendezvous[slot.hostname], launch.extra_env)
        if is_local_host(slot.hostname):
            specs.append(WorkerSpec(slot.rank, slot.hostname, tuple(launch.command), env))
            continue
        argv = ssh_argv(ssh, slot.hostname, boot_command(ssh, "--rank", str(slot.rank)))
        spawner.add(argv, launch.command, env, cwd, launch.grace_seconds)
        specs.append(WorkerSpec(slot.rank, slot.hostname, tuple(argv), env))
    return specs


def launch_multihost(launch: LaunchConfig, rendezvous: Mapping[str, RendezvousInfo], ssh: SshConfig,
                     stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                     timeout: Optional[float] = None, on_exit: Optional[Callable[[WorkerExit], None]] = None,
                     on_start: Optional[Callable[[WorkerGroup], None]] = None) -> JobResult:
    """Check every remote host, then start and supervise every worker of ``launch``, failing fast.

    Args:
        launch: the job (its slots may name local and remote hosts).
        rendezvous: per host, where its workers find the rendezvous (see :func:`multihost_rendezvous`).
        ssh: how to reach remote hosts; ``ssh.timeout`` bounds the checks (the start timeout).
        stdout, stderr, timeout, on_exit, on_start: as for :func:`~horovod.runner.launch.launch_local`.

    Raises:
        HostCheckError: a remote host cannot be logged into, cannot run horovod or cannot reach the rendezvous;
            nothing has been started then.
    """
    log = (lambda text: print(text, file=stderr or sys.stderr, flush=True))
    base = launcher_environment()
    remote = remote_hosts(sorted({s.hostname for s in launch.slots}, key=[s.hostname for s in launch.slots].index))
    probes = {h: [f"{rendezvous[h].addr}:{rendezvous[h].port}"] for h in remote}
    check_hosts(ssh, probes, base, log if launch.verbose else None)
    spawner = SshSpawner(base)
    specs = build_multihost_specs(launch, rendezvous, ssh, spawner, base, os.getcwd())
    sink = OutputSink(len(specs), stdout, stderr, launch.output_filename, launch.prefix_timestamp)
    if launch.verbose:
        log(f"Launching {len(specs)} worker(s) on {len({s.hostname for s in specs})} host(s): "
            f"{' '.join(launch.command)}")
    with WorkerGroup(specs, sink, launch.grace_seconds, popen=spawner, log=log) as group, _forward_signals(group):
        group.start()
        if on_start is not None:
            on_start(group)
        return group.wait(timeout=timeout, on_exit=on_exit)


__all__ = ["remote_hosts", "plan_rendezvous", "RendezvousPool", "multihost_rendezvous", "launcher_environment",
           "build_multihost_specs", "launch_multihost"]


def run_cli(values: Mapping[str, object], launch: LaunchConfig) -> int:
    """``horovodrun`` with remote hosts: plan, serve, check, launch. Returns the exit status."""
    from horovod.runner.processes import failure_message
    from horovod.runner.ssh import HostCheckError
    nics = _nics(values)
    timeout = _start_timeout(values)
    ssh = SshConfig.from_values(values.get("ssh_port"), values.get("ssh_identity_file"),
                                config.load_config().ssh_args, timeout)
    try:
        addresses = plan_rendezvous([s.hostname for s in launch.slots], nics)
    except network.NetworkError as exc:
        print(f"horovodrun: {exc}", file=sys.stderr, flush=True)
        return 1
    with multihost_rendezvous(addresses) as (_, rendezvous):
        try:
            result = launch_multihost(launch, rendezvous, ssh)
        except HostCheckError as exc:
            print(f"horovodrun: {exc}", file=sys.stderr, flush=True)
            return 1
        except OSError as exc:
            print(f"horovodrun: cannot start {launch.command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
            return 127
    if result.first_failure is not None:
        print(failure_message(result.first_failure), file=sys.stderr, flush=True)
    return result.exit_code


def _nics(values: Mapping[str, object]) -> List[str]:
    nics = list(values.get("nic") or [])
    if values.get("nics"):
        nics += [n.strip() for n in str(values["nics"]).split(",") if n.strip()]
    return nics


def _start_timeout(values: Mapping[str, object]) -> float:
    given = values.get("start_timeout")
    return float(given) if given is not None else float(config.load_config().start_timeout)
