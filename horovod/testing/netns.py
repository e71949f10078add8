"""Real test hosts on one machine: network namespaces joined by veth pairs to a bridge, each with its own ``sshd``.

:class:`NetnsCluster` creates, for a test session, a bridge in the root namespace (``10.99.X.1/24``, ``X`` picked
free), and per host a namespace with a veth pair (one end on the bridge, the other inside as that host's only
interface, named differently on every host), an address ``10.99.X.N`` and Debian's ``sshd`` running in the
foreground with a config, host key and authorized client key made for the session in a private temporary directory.
Hosts may be created without ``sshd`` (a host that refuses ssh). The mount and PID namespaces are shared, so remote
workers run this very Python on the same paths; only the network differs.

Everything is removed by :meth:`NetnsCluster.close`, even after a failed start: every process inside each namespace
(found with ``ip netns pids``, killed by pid), the namespaces (and their veths), the bridge and the directory.
Needs root (CAP_NET_ADMIN), ``ip``, ``sshd``, ``ssh`` and ``ssh-keygen``: :func:`unavailable_reason` says precisely
what is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

SSHD = "/usr/sbin/sshd"
_CMD_TIMEOUT = 20.0


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


# A process's clusters take turns through 256 suffixes: two alive at once in one process never share a tag (a
# random suffix once gave a second cluster of the same test run the name of a live one's bridge).
_SERIALS = itertools.count(random.randrange(256))


def _tag() -> str:
    """A cluster's tag: this process's id and its next suffix."""
    return f"{os.getpid() % 100000:05d}{next(_SERIALS) % 256:02x}"


@contextlib.contextmanager
def _subnet_lock():
    """Held while a cluster picks its subnet and claims it on its bridge (an flock, released when the file closes)."""
    with open(os.path.join(tempfile.gettempdir(), "hvd-netns-subnets.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def unavailable_reason() -> Optional[str]:
    """Why namespace hosts cannot be made here (None when they can): not root, a tool missing, or no netns."""
    if os.geteuid() != 0:
        return "network namespace hosts need root (CAP_NET_ADMIN); CI runs as root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: iproute2, openssh-client)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (Debian: openssh-server; make venv / .ci/run install it)"
    name = f"hvdprobe{os.getpid()}"[:15]
    try:
        made = _run("ip", "netns", "add", name, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ip netns add failed: {exc}"
    if made.returncode != 0:
        return f"cannot create a network namespace (ip netns add: {made.stderr.strip()})"
    _run("ip", "netns", "del", name, check=False)
    return None


@dataclasses.dataclass
class TestHost:
    """One namespace host: its namespace, address, interface names and sshd process (None: refuses ssh)."""

    netns: str
    address: str
    iface: str
    root_veth: str
    sshd: Optional[subprocess.Popen] = None


class NetnsCluster:
    """``count`` namespace hosts on one bridge; ``sshd_on[i]`` says whether host ``i`` runs sshd.

    Use as a context manager or call :meth:`start` and :meth:`close`. After start: :attr:`hosts`,
    :attr:`identity_file`, :attr:`ssh_args` (for ``HOROVOD_SSH_ARGS``: this session's known_hosts, no user config).
    """

    def __init__(self, count: int, sshd_on: Optional[Sequence[bool]] = None):
        self.count = count
        self.sshd_on = list(sshd_on) if sshd_on is not None else [True] * count
        self._name(_tag())
        self.hosts: List[TestHost] = []
        self.dir = ""
        self.subnet = ""
        self.identity_file = ""
        self.ssh_args = ""

    # -- set-up ---------------------------------------------------------------------------------------------------

    def start(self) -> "NetnsCluster":
        try:
            self.dir = tempfile.mkdtemp(prefix="hvd-netns-")
            os.chmod(self.dir, 0o700)
            with _subnet_lock():     # clusters of parallel test runners must not pick the same free subnet
                self.subnet = self._free_subnet()
                for _ in range(256):    # (nor a name a cluster still alive holds: its bridge is up while it lives)
                    if _run("ip", "link", "show", self.bridge, check=False).returncode != 0:
                        break
                    self._name(_tag())
                _run("ip", "link", "add", self.bridge, "type", "bridge")
                _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for index in range(self.count):
                self._add_host(index)
            self._make_keys()
            for index, host in enumerate(self.hosts):
                if self.sshd_on[index]:
                    self._start_sshd(index, host)
            for host in self.hosts:
                if host.sshd is not None:
                    self._await_sshd(host)
        except BaseException:
            self.close()
            raise
        return self

    def _name(self, tag: str) -> None:
        """The cluster's tag, which names its bridge, namespaces and veths (7 characters: interface names hold 15)."""
        self.tag = tag
        self.bridge = f"hvb{tag}"

    def _free_subnet(self) -> str:
        used = _run("ip", "-4", "-o", "addr").stdout + _run("ip", "-4", "route").stdout
        candidates = [x for x in range(1, 255) if f"10.99.{x}." not in used]
        if not candidates:
            raise RuntimeError("no free 10.99.X.0/24 subnet for test hosts")
        return f"10.99.{random.choice(candidates)}"

    def _add_host(self, index: int) -> None:
        host = TestHost(netns=f"hvdns{self.tag}{index}", address=f"{self.subnet}.{index + 2}",
                        iface=f"hvnic{index}x", root_veth=f"hv{self.tag}r{index}")
        peer = f"hv{self.tag}p{index}"
        _run("ip", "netns", "add", host.netns)
        self.hosts.append(host)  # from here on close() removes it
        _run("ip", "link", "add", host.root_veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", host.netns)
        _run("ip", "link", "set", host.root_veth, "master", self.bridge)
        _run("ip", "link", "set", host.root_veth, "up")
        inside = ("ip", "netns", "exec", host.netns)
        _run(*inside, "ip", "link", "set", peer, "name", host.iface)
        _run(*inside, "ip", "addr", "add", f"{host.address}/24", "dev", host.iface)
        _run(*inside, "ip", "link", "set", host.iface, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")

    def _make_keys(self) -> None:
        for name in ("host_key", "client_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"horovod-test-{name}",
                 "-f", os.path.join(self.dir, name))
        self.identity_file = os.path.join(self.dir, "client_key")
        shutil.copy(self.identity_file + ".pub", os.path.join(self.dir, "authorized_keys"))
        with open(os.path.join(self.dir, "host_key.pub"), encoding="ascii") as handle:
            host_key = " ".join(handle.read().split()[:2])
        known_hosts = os.path.join(self.dir, "known_hosts")
        with open(known_hosts, "w", encoding="ascii") as handle:
            for host in self.hosts:
                handle.write(f"{host.address} {host_key}\n")
        self.ssh_args = (f"-F /dev/null -o UserKnownHostsFile={known_hosts} -o GlobalKnownHostsFile=/dev/null "
                         f"-o StrictHostKeyChecking=yes -o LogLevel=ERROR")

    def replace_host_key(self, host: TestHost) -> None:
        """Give ``host`` a new host key: its sshd restarts with it (a reinstalled host, or an impostor)."""
        index = self.hosts.index(host)
        key = os.path.join(self.dir, f"host_key.{index}")
        for path in (key, key + ".pub"):
            if os.path.exists(path):
                os.unlink(path)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"horovod-test-host-{index}", "-f", key)
        if host.sshd is not None:
            os.killpg(host.sshd.pid, signal.SIGKILL)
            host.sshd.wait(timeout=10)
        self._start_sshd(index, host, key)
        self._await_sshd(host)

    def _start_sshd(self, index: int, host: TestHost, host_key: Optional[str] = None) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        config = os.path.join(self.dir, f"sshd_config.{index}")
        with open(config, "w", encoding="ascii") as handle:
            handle.write(f"ListenAddress {host.address}\nPort 22\nHostKey {host_key or self.dir + '/host_key'}\n"
                         f"PidFile none\nAuthorizedKeysFile {self.dir}/authorized_keys\n"
                         "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
                         "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
                         "ClientAliveInterval 5\nClientAliveCountMax 2\nMaxStartups 64\nMaxSessions 64\n"
                         "LogLevel ERROR\n")
        log = open(os.path.join(self.dir, f"sshd.{index}.log"), "w", encoding="utf-8")
        with log:
            host.sshd = subprocess.Popen(["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", config],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def _await_sshd(self, host: TestHost, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if host.sshd.poll() is not None:
                raise RuntimeError(f"sshd in {host.netns} exited with {host.sshd.returncode}: {self.sshd_log(host)}")
            try:
                socket.create_connection((host.address, 22), timeout=1.0).close()
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"sshd in {host.netns} not listening on {host.address}:22 after "
                                       f"{timeout:g} s: {exc}; log: {self.sshd_log(host)}") from None
                time.sleep(0.05)  # polling a port with a deadline: sshd gives no readiness signal without -D's fd

    def sshd_log(self, host: TestHost) -> str:
        """The sshd log of ``host`` (for failure messages)."""
        try:
            with open(os.path.join(self.dir, f"sshd.{self.hosts.index(host)}.log"), encoding="utf-8") as handle:
                return handle.read()[-2000:]
        except (OSError, ValueError):
            return ""

    # -- during a test --------------------------------------------------------------------------------------------

    def pids(self, host: TestHost) -> List[int]:
        """Every process inside ``host``'s namespace."""
        out = _run("ip", "netns", "pids", host.netns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def worker_pids(self, host: TestHost) -> List[int]:
        """The processes inside ``host`` other than its sshd listener and the sessions sshd still winds down."""
        listener = host.sshd.pid if host.sshd is not None else None
        return [p for p in self.pids(host) if p != listener and not _is_sshd(p)]

    def set_link(self, host: TestHost, up: bool) -> None:
        """Bring ``host``'s link to the bridge up or down (its root-side veth)."""
        _run("ip", "link", "set", host.root_veth, "up" if up else "down")

    def env(self) -> Dict[str, str]:
        """Variables a launcher needs to reach these hosts (``HOROVOD_SSH_ARGS``; a known-hosts file of the session
        so that nothing is recorded in the user's)."""
        return {"HOROVOD_SSH_ARGS": self.ssh_args, "HOROVOD_SSH_KNOWN_HOSTS": os.path.join(self.dir, "tofu_hosts")}

    # -- tear-down ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        for host in self.hosts:
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if host.sshd is not None:
                try:
                    host.sshd.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            _run("ip", "netns", "del", host.netns, check=False)
            _run("ip", "link", "del", host.root_veth, check=False)
        self.hosts = []
        _run("ip", "link", "del", self.bridge, check=False)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "NetnsCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _is_sshd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as handle:
            return handle.read().strip() == "sshd"
    except OSError:
        return False


__all__ = ["NetnsCluster", "TestHost", "unavailable_reason", "SSHD"]
