"""ssh to remote hosts: the command lines, the pre-flight check of every host, and starting remote workers.

A remote host's workers run under one ``ssh [options] HOST exec env PYTHONPATH=... PYTHON -m horovod.runner.ssh_boot
--host-mode``; their environments (the job secret included), working directory and commands go through ssh's
standard input, which stays open for the job: when the launcher stops the job, or dies, the channel closes and the
remote side stops the workers' process groups (see :mod:`horovod.runner.ssh_host`). ssh runs with ``BatchMode=yes``:
it never prompts, and a host it cannot log into fails the check with ssh's own message.

Host keys: Horovod turns host-key checking off. Here a host met for the first time is trusted and its key recorded
(``StrictHostKeyChecking=accept-new``) in a known-hosts file the next jobs reuse (``HOROVOD_SSH_KNOWN_HOSTS``,
default ``~/.horovod/known_hosts``; the user's ``~/.ssh/known_hosts`` is read too); a key that changed since is
refused, and the check's message says which file holds the old key and how to remove it.

Options from ``HOROVOD_SSH_ARGS`` come first on ssh's command line, so they win over the launcher's defaults
(ssh takes the first value it sees of each option).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from horovod.common import config
from horovod.common.exceptions import HorovodError
from horovod.runner.procgroup import release_session, signal_group, start_session

# Host-specific variables a remote worker takes from its own host's login, not from the launcher's environment.
HOST_SPECIFIC_VARS = frozenset({
    "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "DISPLAY",
    "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "XDG_RUNTIME_DIR",
    "XDG_SESSION_ID", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "MOTD_SHOWN",
})
_STDERR_TAIL = 600
_OFFENDING = re.compile(r"Offending \S+ key in (\S+?):\d+")


class HostCheckError(HorovodError):
    """One or more remote hosts failed the pre-flight check; the message names each with ssh's own words."""

    def __init__(self, failures: Mapping[str, str]):
        self.failures = dict(failures)
        lines = "\n".join(f"  {host}: {why}" for host, why in self.failures.items())
        super().__init__(f"cannot start workers on {len(self.failures)} host(s):\n{lines}")


@dataclasses.dataclass(frozen=True)
class SshConfig:
    """How to reach remote hosts: port, identity file, extra options, the remote Python and the time allowed."""

    port: Optional[int] = None
    identity_file: Optional[str] = None
    extra_args: Tuple[str, ...] = ()
    python: str = sys.executable
    timeout: float = 30.0
    known_hosts: Optional[str] = None

    @staticmethod
    def from_values(port: Optional[int], identity_file: Optional[str], extra_args: str, timeout: float,
                    python: Optional[str] = None, known_hosts: Optional[str] = None) -> "SshConfig":
        """Build from ``horovodrun`` values (``HOROVOD_SSH_ARGS`` is a shell-quoted string)."""
        return SshConfig(port, identity_file, tuple(shlex.split(extra_args or "")), python or sys.executable, timeout,
                         known_hosts)


def default_known_hosts() -> str:
    """``~/.horovod/known_hosts``: where the keys of hosts met for the first time are recorded."""
    return os.path.join(os.path.expanduser("~"), ".horovod", "known_hosts")


def host_key_options(known_hosts: Optional[str]) -> List[str]:
    """Trust on first use: record new host keys in ``known_hosts`` (also reading ``~/.ssh/known_hosts``), refuse
    changed ones. None: ssh's own defaults."""
    if not known_hosts:
        return []
    files = [known_hosts, os.path.join(os.path.expanduser("~"), ".ssh", "known_hosts")]
    return ["-o", "StrictHostKeyChecking=accept-new",
            "-o", "UserKnownHostsFile=" + " ".join('"' + f.replace('"', "") + '"' for f in files)]


def prepare_known_hosts(ssh: "SshConfig") -> None:
    """Create the directory of ``ssh.known_hosts`` (private to the user) so ssh can record keys there."""
    if ssh.known_hosts:
        os.makedirs(os.path.dirname(os.path.abspath(ssh.known_hosts)), mode=0o700, exist_ok=True)


def ssh_config(values: Mapping[str, Any]) -> SshConfig:
    """How a job reaches its remote hosts, from ``horovodrun``'s flags or ``horovod.run``'s arguments.

    Reads ``ssh_port``, ``ssh_identity_file``, ``start_timeout`` (default ``HOROVOD_START_TIMEOUT``) and ``python``
    (the remote interpreter; default this one) from ``values``, and the extra options from ``HOROVOD_SSH_ARGS``.
    """
    settings = config.load_config()
    timeout = values.get("start_timeout")
    return SshConfig.from_values(values.get("ssh_port"), values.get("ssh_identity_file"), settings.ssh_args,
                                 float(timeout if timeout is not None else settings.start_timeout),
                                 values.get("python"), settings.ssh_known_hosts or default_known_hosts())


def ssh_argv(ssh: SshConfig, host: str, remote_command: str) -> List[str]:
    """The ssh command line that runs ``remote_command`` (a shell string) on ``host``."""
    argv = ["ssh", *ssh.extra_args, *host_key_options(ssh.known_hosts), "-T", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, math.ceil(ssh.timeout))}",
            "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"]
    if ssh.port:
        argv += ["-p", str(ssh.port)]
    if ssh.identity_file:
        argv += ["-i", ssh.identity_file, "-o", "IdentitiesOnly=yes"]
    return argv + [host, remote_command]


def package_root() -> str:
    """The directory holding the ``horovod`` package (on a shared file system, the same path on every host)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def boot_command(ssh: SshConfig, *args: str) -> str:
    """The remote shell command that runs :mod:`horovod.runner.ssh_boot` with ``args``."""
    words = ["exec", "env", f"PYTHONPATH={package_root()}", ssh.python, "-m", "horovod.runner.ssh_boot", *args]
    return " ".join(shlex.quote(w) for w in words)


def remote_env(env: Mapping[str, str]) -> Dict[str, str]:
    """The part of a worker's environment that travels to a remote host (host-specific variables stay there)."""
    return {k: v for k, v in env.items() if k not in HOST_SPECIFIC_VARS and not k.startswith("BASH_FUNC_")}


def _tail(text: str) -> str:
    text = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text[-_STDERR_TAIL:] if text else "(no message)"


def _host_key_hint(host: str, stderr: str) -> str:
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "Host key for" in stderr and "has changed" in stderr:
        offending = _OFFENDING.search(stderr)
        where = offending.group(1) if offending else "your known-hosts file"
        return (f" -- REFUSED: {host}'s host key changed since it was recorded in {where}. If the host was "
                f"reinstalled or its key replaced, remove the old key with: ssh-keygen -R {host} -f {where} and run "
                f"again (the new key is then recorded); otherwise someone may be intercepting the connection")
    if "Host key verification failed" in stderr:
        return (f" (ssh does not trust {host}'s key: add it to a known-hosts file with ssh-keyscan, or let horovodrun "
                f"record it on first use by not setting StrictHostKeyChecking=yes in HOROVOD_SSH_ARGS)")
    return ""


def explain_check(host: str, returncode: Optional[int], stdout: str, stderr: str, probes: Sequence[str],
                  timeout: float) -> Optional[str]:
    """Why ``host`` failed its check, or None if it passed. A pure function of the check's outcome."""
    if returncode is None:
        return f"no answer over ssh within {timeout:g} s (--start-timeout); last message: {_tail(stderr)}"
    if returncode == 255:
        return f"ssh failed: {_tail(stderr)}{_host_key_hint(host, stderr)}"
    if returncode != 0:
        return f"ssh worked but the remote Python could not run horovod (exit {returncode}): {_tail(stderr)}"
    try:
        report = json.loads(stdout.strip().splitlines()[-1])
        reachable = report["reachable"]
    except (ValueError, IndexError, KeyError, TypeError):
        return f"unexpected answer to the check: {_tail(stdout + stderr)}"
    unreachable = [p for p in probes if not reachable.get(p)]
    if unreachable:
        return (f"cannot reach the launcher's rendezvous at {', '.join(unreachable)} from there; name an interface "
                f"both sides share with --network-interface")
    return None


def _check_one(ssh: SshConfig, host: str, probes: Sequence[str], env: Mapping[str, str]) -> Optional[str]:
    probe_timeout = max(1.0, min(5.0, ssh.timeout / 2))
    argv = ssh_argv(ssh, host, boot_command(ssh, "--probe-timeout", f"{probe_timeout:g}", "--check", *probes))
    proc = start_session(argv, env, text=True)
    try:
        out, err = proc.communicate(timeout=ssh.timeout)
        code: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    finally:
        signal_group(proc.pid, signal.SIGKILL)
        release_session(proc.pid)
    return explain_check(host, code, out, err, probes, ssh.timeout)


def check_hosts(ssh: SshConfig, probes_by_host: Mapping[str, Sequence[str]], env: Mapping[str, str],
                log: Optional[Callable[[str], None]] = None) -> None:
    """Check every remote host in parallel, within ``ssh.timeout``: ssh logs in, Python runs horovod, and the host
    reaches each of its probe addresses (``addr:port``).

    Raises:
        HostCheckError: naming every host that failed and why.
    """
    started = time.monotonic()
    prepare_known_hosts(ssh)
    if log is not None:
        log("Checking ssh on all remote hosts.")
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(probes_by_host)))) as pool:
        futures = {host: pool.submit(_check_one, ssh, host, probes, env) for host, probes in probes_by_host.items()}
        failures = {host: f.result() for host, f in futures.items() if f.result() is not None}
    if failures:
        raise HostCheckError(failures)
    if log is not None:
        log(f"SSH was successful into all the remote hosts ({len(probes_by_host)} checked in "
            f"{time.monotonic() - started:.1f} s).")


__all__ = ["SshConfig", "HostCheckError", "ssh_config", "ssh_argv", "boot_command", "remote_env", "check_hosts",
           "explain_check", "package_root", "HOST_SPECIFIC_VARS", "default_known_hosts", "host_key_options",
           "prepare_known_hosts"]
