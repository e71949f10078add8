"""Start and stop an elastic job's workers one at a time, relaying their output.

The driver decides which slot gets a worker; this module only carries it out. Each worker runs in its own session
(its process group id is its pid), so stopping it signals its whole group and never a process found by name. A host
that is this machine (``localhost``, ``127.x``, this machine's names and addresses) is started locally; another host
is started over ssh exactly as :mod:`horovod.runner.multihost` does it (the same check, command line and payload
through ssh's standard input, see :mod:`horovod.runner.ssh`), with :class:`SshHosts`. The process the driver then
holds for a remote worker is its ssh client: signalling it ends the ssh channel, and the remote side stops the
worker's process group; its exit status is the worker's (``128+N`` for signal N, 255 when ssh itself failed).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from horovod.elastic.protocol import slot_key
from horovod.runner import network
from horovod.runner.hosts import SlotInfo, is_local_host
from horovod.runner.launch import RendezvousInfo, worker_env
from horovod.runner.multihost import RendezvousPool
from horovod.runner.processes import DEFAULT_GRACE_SECONDS, OutputSink, signal_group
from horovod.runner.ssh import HostCheckError, SshConfig, SshSpawner, boot_command, check_hosts, ssh_argv


class SshHosts:
    """How the executor reaches hosts that are not this machine: ssh, and a rendezvous address each can reach.

    A host is checked once, before its first worker (as :func:`~horovod.runner.multihost.launch_multihost` checks
    every host before a static job): ssh logs in, the remote Python runs horovod and reaches the rendezvous address
    that routes to it (or ``--network-interface``'s), which ``pool`` starts serving then. A host that fails is
    refused with ssh's own words, and the driver blacklists it.

    Args:
        ssh: port, identity, options, remote Python; ``ssh.timeout`` bounds each check (the start timeout).
        pool: the job's rendezvous, served on each address a host needs.
        ssh_env: the environment of the ssh clients (the launcher's, never the job secret).
        cwd: the working directory remote workers start in.
        nics: interfaces named by ``--network-interface(s)``.
    """

    def __init__(self, ssh: SshConfig, pool: RendezvousPool, ssh_env: Mapping[str, str], cwd: str,
                 nics: Sequence[str] = ()):
        self.ssh = ssh
        self.pool = pool
        self.ssh_env = dict(ssh_env)
        self.cwd = cwd
        self.nics = list(nics)
        self.popen = SshSpawner(self.ssh_env)
        self._checked: Dict[str, RendezvousInfo] = {}

    def rendezvous_for(self, host: str) -> RendezvousInfo:
        """The rendezvous as ``host`` reaches it, checking the host the first time.

        Raises:
            OSError: the host does not route, or fails the check (the message says why).
        """
        info = self._checked.get(host)
        if info is not None:
            return info
        try:
            address = network.launcher_addresses([host], self.nics)[host]
        except network.NetworkError as exc:
            raise OSError(str(exc)) from None
        info = self.pool.serve(address)
        try:
            check_hosts(self.ssh, {host: [f"{info.addr}:{info.port}"]}, self.ssh_env)
        except HostCheckError as exc:
            raise OSError(exc.failures.get(host, str(exc))) from None
        self._checked[host] = info
        return info

    def argv_for(self, slot: SlotInfo, command: Sequence[str], env: Mapping[str, str], grace: float) -> List[str]:
        """The ssh command line of ``slot``'s worker; its environment and command go to :attr:`popen` as payload."""
        argv = ssh_argv(self.ssh, slot.hostname, boot_command(self.ssh))
        self.popen.add(argv, command, env, self.cwd, grace)
        return argv


class LocalSpawner:
    """Starts workers of slots (on this machine, or over ssh with ``remote``); exits come back through :meth:`exits`.

    Args:
        command: the worker command line.
        rendezvous: the job's rendezvous service, as workers on this machine reach it.
        base_env: the environment to start from; extra_env: variables for every worker.
        sink: where prefixed output lines go (the prefix is the slot, ``[host:slot]``).
        popen: the process spawner for workers on this machine (a parameter so tests can substitute it).
        remote: how to start workers on other hosts; None: such hosts are refused.
    """

    def __init__(self, command, rendezvous: RendezvousInfo, base_env: Mapping[str, str],
                 extra_env: Mapping[str, str], sink: OutputSink, popen: Callable[..., subprocess.Popen] =
                 subprocess.Popen, grace_seconds: float = DEFAULT_GRACE_SECONDS, remote: Optional[SshHosts] = None):
        self.command = list(command)
        self.rendezvous = rendezvous
        self.base_env = dict(base_env)
        self.extra_env = dict(extra_env)
        self.sink = sink
        self.grace_seconds = grace_seconds
        self.remote = remote
        self._popen = popen
        self.procs: Dict[str, subprocess.Popen] = {}
        self._events: "queue.Queue[Tuple[str, int, int]]" = queue.Queue()
        self._readers: List[threading.Thread] = []

    def spawn(self, slot: SlotInfo) -> int:
        """Start the worker of ``slot``; returns its pid.

        Raises:
            OSError: the command cannot be started, or the host is another one and cannot be reached over ssh.
        """
        key = slot_key(slot.hostname, slot.local_rank)
        local = is_local_host(slot.hostname)
        if not local and self.remote is None:
            raise OSError(f"host {slot.hostname!r} is not this machine and this job has no ssh launch")
        rendezvous = self.rendezvous if local else self.remote.rendezvous_for(slot.hostname)
        env = worker_env(self.base_env, slot, rendezvous, self.extra_env)
        env["HOROVOD_ELASTIC"] = "1"
        argv, popen = self.command, self._popen
        if not local:
            argv, popen = self.remote.argv_for(slot, self.command, env, self.grace_seconds), self.remote.popen
        proc = popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, start_new_session=True)
        self.procs[key] = proc
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            reader = threading.Thread(target=self._relay, args=(key, stream, pipe), daemon=True,
                                      name=f"horovod-output-{key}-{stream}")
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._await_exit, args=(key, proc), daemon=True, name=f"horovod-wait-{key}").start()
        return proc.pid

    def _relay(self, key: str, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                self.sink.write(key, stream, raw.decode("utf-8", errors="replace").rstrip("\r\n"))

    def _await_exit(self, key: str, proc: subprocess.Popen) -> None:
        self._events.put((key, proc.pid, proc.wait()))

    def exits(self, timeout: float) -> List[Tuple[str, int, int]]:
        """``(key, pid, returncode)`` of workers that exited, waiting up to ``timeout`` for the first one."""
        found = []
        try:
            found.append(self._events.get(timeout=timeout))
            while True:
                found.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return found

    def send_signal(self, key: str, sig: int) -> None:
        proc = self.procs.get(key)
        if proc is not None and proc.poll() is None:
            signal_group(proc.pid, sig)

    def forget(self, key: str, pid: int) -> None:
        """Drop an exited worker (unless the slot already holds a newer one)."""
        proc = self.procs.get(key)
        if proc is not None and proc.pid == pid:
            del self.procs[key]
            if proc.stdin is not None:  # a remote worker's ssh channel (its payload pipe)
                proc.stdin.close()
        signal_group(pid, signal.SIGKILL)  # whatever the worker left running in its group

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self.procs.values()]

    def close(self, sig: int = signal.SIGTERM) -> None:
        """Stop every worker: ``sig``, then SIGKILL after the grace period; also kills what lingers in their groups."""
        for proc in self.procs.values():
            if proc.poll() is None:
                signal_group(proc.pid, sig)
        deadline = time.monotonic() + self.grace_seconds
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=self.grace_seconds)
            except subprocess.TimeoutExpired:
                pass
        end = time.monotonic() + 2.0
        for reader in self._readers:
            reader.join(max(0.0, end - time.monotonic()))
        self.sink.close()


__all__ = ["LocalSpawner", "SshHosts"]
