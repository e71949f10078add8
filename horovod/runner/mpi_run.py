"""``horovodrun --mpi``: start the workers with Open MPI's ``mpirun`` instead of ssh.

``mpirun`` only starts processes here; the workers do not call MPI. Each derives its rank from
``OMPI_COMM_WORLD_*`` (:mod:`horovod.common.launch_env`) and meets the others through the rendezvous this launcher
serves, as with ssh launch. Variables reach the workers with ``-x NAME``, which exports the value from ``mpirun``'s
own environment: the job secret is never on a command line. Output lines carry ``mpirun``'s ``[1,rank]<stdout>:``
tags, as Horovod's do under ``--mpi``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence

from horovod.common.exceptions import HorovodError
from horovod.common.rendezvous_client import secret_to_hex
from horovod.runner.hosts import HostInfo
from horovod.runner.launch import RendezvousInfo

# Variables of the launcher's own environment that remote ranks need as well as the job's HOROVOD_* ones.
_CARRIED = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED")
_POLL_SECONDS = 0.1


class MpiNotFoundError(HorovodError):
    """``--mpi`` was asked for but no Open MPI ``mpirun`` is on PATH."""


def find_mpirun(path: Optional[str] = None) -> str:
    """The path of Open MPI's ``mpirun``.

    Raises:
        MpiNotFoundError: none on ``PATH``, or it is not Open MPI's (MPICH's flags differ).
    """
    mpirun = shutil.which("mpirun", path=path)
    if mpirun is None:
        raise MpiNotFoundError("horovodrun --mpi needs mpirun on PATH (Debian: apt-get install openmpi-bin); "
                               "or run without --mpi to launch over ssh")
    try:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpiNotFoundError(f"{mpirun} --version failed: {exc}") from None
    if "Open MPI" not in version and "OpenRTE" not in version:
        raise MpiNotFoundError(f"{mpirun} is not Open MPI's mpirun ({version.strip()[:80]!r}); horovodrun --mpi "
                               f"drives Open MPI only. Start the workers with your mpirun and set "
                               f"HOROVOD_RENDEZVOUS_ADDR/PORT instead (docs/cluster.md)")
    return mpirun


def mpi_env(base: Mapping[str, str], extra: Mapping[str, str], rendezvous: RendezvousInfo,
            launcher_vars: Sequence[str]) -> Dict[str, str]:
    """``mpirun``'s environment: ``base`` without launcher-decided variables, the tunables and the rendezvous."""
    env = {k: v for k, v in base.items() if k not in launcher_vars}
    env.update(extra)
    env.update({"HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous.addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous.port),
                "HOROVOD_SECRET_KEY": secret_to_hex(rendezvous.secret), "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo", "PYTHONUNBUFFERED": "1"})
    if rendezvous.scope:
        env["HOROVOD_RENDEZVOUS_SCOPE"] = rendezvous.scope
    return env


def mpirun_command(mpirun: str, num_proc: int, hosts: Sequence[HostInfo], command: Sequence[str],
                   env: Mapping[str, str], ssh_port: Optional[int] = None, ssh_identity_file: Optional[str] = None,
                   mpi_args: Optional[str] = None, as_root: bool = False) -> List[str]:
    """The ``mpirun`` command line: hosts and slots, no binding, tagged output, ``-x`` for every job variable.

    Only variable names appear (``-x NAME``); ``mpirun`` reads the values from its environment.
    """
    argv = [mpirun, "--tag-output", "-np", str(num_proc),
            "-H", ",".join(f"{h.hostname}:{h.slots}" for h in hosts), "-bind-to", "none", "-map-by", "slot"]
    if as_root:
        argv.append("--allow-run-as-root")
    rsh = []
    if ssh_port:
        rsh += ["-p", str(ssh_port)]
    if ssh_identity_file:
        rsh += ["-i", ssh_identity_file]
    if rsh:
        argv += ["-mca", "plm_rsh_args", " ".join(shlex.quote(a) for a in rsh)]
    for name in sorted(env):
        if name.startswith("HOROVOD_") or name in _CARRIED:
            argv += ["-x", name]
    argv += shlex.split(mpi_args or "")
    return argv + list(command)


def run_mpirun(argv: Sequence[str], env: Mapping[str, str], grace_seconds: float = 5.0,
               timeout: Optional[float] = None) -> int:
    """Run ``mpirun`` in its own session; forward SIGINT/SIGTERM to it; nothing of it outlives this call.

    Returns:
        mpirun's exit status (128+N when this launcher was interrupted by signal N).
    """
    proc = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, start_new_session=True)
    received: List[int] = []
    previous = {}
    if _main_thread():
        handler = lambda signum, frame: received.append(signum)  # noqa: E731
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        kill_at = None
        while True:
            try:
                code = proc.wait(timeout=_POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            if (received or (deadline is not None and time.monotonic() >= deadline)) and kill_at is None:
                proc.send_signal(received[0] if received else signal.SIGTERM)  # mpirun stops its ranks
                kill_at = time.monotonic() + grace_seconds
            if kill_at is not None and time.monotonic() >= kill_at:
                _killpg(proc.pid)
        return 128 + received[0] if received else code
    finally:
        _killpg(proc.pid)
        for sig, old in previous.items():
            signal.signal(sig, old)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def euid_is_root() -> bool:
    """Whether this launcher runs as root (Open MPI then needs ``--allow-run-as-root``)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


__all__ = ["MpiNotFoundError", "find_mpirun", "mpi_env", "mpirun_command", "run_mpirun", "euid_is_root"]


def run_cli(values: Mapping[str, object], hosts: Sequence[HostInfo], num_proc: int, extra_env: Mapping[str, str],
            command: Sequence[str]) -> int:
    """``horovodrun --mpi``: serve the rendezvous, run ``mpirun``. Returns the exit status."""
    from horovod.common import config
    from horovod.runner.launch import _LAUNCHER_VARS
    from horovod.runner.multihost import _nics, multihost_rendezvous, plan_rendezvous
    from horovod.runner.network import NetworkError
    try:
        mpirun = find_mpirun()
        addresses = plan_rendezvous([h.hostname for h in hosts], _nics(values))
    except (MpiNotFoundError, NetworkError) as exc:
        print(f"horovodrun: {exc}", file=sys.stderr, flush=True)
        return 1
    with multihost_rendezvous({"*": next(iter(addresses.values()))}) as (_, rendezvous):
        env = mpi_env(config.environ_snapshot(), extra_env, rendezvous["*"], _LAUNCHER_VARS)
        argv = mpirun_command(mpirun, num_proc, hosts, command, env, values.get("ssh_port"),
                              values.get("ssh_identity_file"), values.get("mpi_args"), euid_is_root())
        if values.get("verbose"):
            print(f"horovodrun: {' '.join(shlex.quote(a) for a in argv)}", file=sys.stderr, flush=True)
        return run_mpirun(argv, env)
