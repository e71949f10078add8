"""``horovodrun --mpi``: start the workers with Open MPI's ``mpirun`` instead of ssh.

``mpirun`` only starts processes here; the workers do not call MPI. Each derives its rank from
``OMPI_COMM_WORLD_*`` (:mod:`horovod.runtime.launch_env`) and meets the others through the rendezvous this launcher
serves, as with ssh launch. Variables reach the workers with ``-x NAME``, which exports the value from ``mpirun``'s
own environment: the job secret is never on a command line. Output lines carry ``mpirun``'s ``[1,rank]<stdout>:``
tags, as Horovod's do under ``--mpi``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence

from horovod.common.exceptions import HorovodError
from horovod.runner.backends.base import WorkerHandle, WorkerLaunch
from horovod.runner.hosts import HostInfo
from horovod.runner.pipeline import SLOT_VARS
from horovod.runner.procgroup import ProcessHandle, start_session

__all__ = ["MpiNotFoundError", "MpirunBackend", "find_mpirun", "mpirun_command", "mpirun_hosts", "euid_is_root"]

# Variables of the launcher's own environment that remote ranks need as well as the job's HOROVOD_* ones.
_CARRIED = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED")


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


def euid_is_root() -> bool:
    """Whether this launcher runs as root (Open MPI then needs ``--allow-run-as-root``)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def mpirun_hosts(launches: Sequence[WorkerLaunch]) -> List[HostInfo]:
    """The ``-H`` hosts of ``launches``: each host once, in rank order, with the number of its planned workers."""
    counts: Dict[str, int] = {}
    for launch in sorted(launches, key=lambda w: w.rank):
        counts[launch.hostname] = counts.get(launch.hostname, 0) + 1
    return [HostInfo(host, slots) for host, slots in counts.items()]


class MpirunBackend:
    """Starts every rank with one Open MPI ``mpirun`` (``horovodrun --mpi``); its handle stands for all of them.

    The workers' shared environment is rank 0's without its placement (``mpirun`` places the ranks; each finds its
    own from ``OMPI_COMM_WORLD_*``). mpirun tags their output itself, so it goes straight to the terminal.

    Args:
        mpirun: the ``mpirun`` to run (default: :func:`find_mpirun`, when :meth:`start` runs).
        ssh_port, ssh_identity_file: for mpirun's own ssh.
        mpi_args: extra ``mpirun`` options (a shell-quoted string).
        verbose_log: where to print the command line (None: nowhere).
    """

    name = "mpirun"

    def __init__(self, mpirun: Optional[str] = None, ssh_port: Optional[int] = None,
                 ssh_identity_file: Optional[str] = None, mpi_args: Optional[str] = None, verbose_log=None):
        self.mpirun = mpirun
        self.ssh_port = ssh_port
        self.ssh_identity_file = ssh_identity_file
        self.mpi_args = mpi_args
        self._log = verbose_log

    def start(self, launches: Sequence[WorkerLaunch], grace_seconds: float) -> Dict[int, WorkerHandle]:
        """Start ``mpirun`` for all ``launches``; returns its one handle under the lowest rank.

        Raises:
            MpiNotFoundError: no Open MPI ``mpirun`` on PATH.
            OSError: mpirun cannot be started.
        """
        first = min(launches, key=lambda w: w.rank)
        env = {k: v for k, v in first.env.items() if k not in SLOT_VARS}
        argv = mpirun_command(self.mpirun or find_mpirun(), len(launches), mpirun_hosts(launches), first.command,
                              env, self.ssh_port, self.ssh_identity_file, self.mpi_args, euid_is_root())
        if self._log is not None:
            self._log(f"horovodrun: {' '.join(shlex.quote(a) for a in argv)}")
        return {first.rank: ProcessHandle(start_session(argv, env, pipes=False))}
