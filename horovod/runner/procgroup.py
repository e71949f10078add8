"""Processes in their own session: start one, signal its whole group, forward this process's signals to a callback.

Every process the runner starts (a worker, an ssh client, ``mpirun``, the worker under the remote bootstrap) leads its
own session, so its process group id is its pid: stopping it signals the group (the process and anything it started),
never a process found by name. This is the runner's only ``killpg`` and its only signal-handler installer.

A process started from the main thread on Linux also dies with its starter (``PR_SET_PDEATHSIG``, SIGKILL): a
``horovodrun`` killed with SIGKILL takes its local workers and its ssh clients with it (each ssh client's end closes
the remote worker's channel, and the remote bootstrap stops the worker). Only from the main thread, because the
kernel sends the signal when the *thread* that started the process ends.

Standard library only: the remote bootstrap (:mod:`horovod.runner.ssh_boot`) uses it before any job environment is
set.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import subprocess
import threading
from typing import IO, Callable, Iterator, Mapping, Optional, Sequence

__all__ = ["signal_group", "start_session", "forward_signals", "ProcessHandle", "DEFAULT_SIGNALS"]

DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()     # loaded before any fork: the child only calls it


def _dies_with(parent: int) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child die with this process (None where that cannot be arranged)."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None

    def arrange() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:      # the starter died before the request took effect
            os._exit(137)

    return arrange


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid``; a group that is already gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_session(argv: Sequence[str], env: Mapping[str, str], *, stdin=subprocess.DEVNULL, pipes: bool = True,
                  popen: Callable[..., subprocess.Popen] = subprocess.Popen, **kwargs) -> subprocess.Popen:
    """Start ``argv`` with exactly ``env`` as the leader of a new session (its pid is its process group id).

    Args:
        argv: the command line.
        env: its whole environment.
        stdin: as for :class:`subprocess.Popen` (default: nothing to read).
        pipes: capture standard output and error as pipes (else they are inherited).
        popen: the process spawner (a parameter so tests can substitute it).

    Raises:
        OSError: the command cannot be started.
    """
    streams = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE) if pipes else {}
    if "preexec_fn" not in kwargs:
        kwargs["preexec_fn"] = _dies_with(os.getpid())
    return popen(list(argv), env=dict(env), stdin=stdin, start_new_session=True, **streams, **kwargs)


@contextlib.contextmanager
def forward_signals(on_signal: Callable[[int], None], signals: Sequence[int] = DEFAULT_SIGNALS) -> Iterator[None]:
    """While the block runs, call ``on_signal(signum)`` for each of ``signals`` instead of their handlers.

    Only the main thread may install handlers; elsewhere the block runs under the caller's own handling. The
    previous handlers come back when the block ends. ``on_signal`` runs in a signal handler: it should only record.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: on_signal(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ProcessHandle:
    """A started process as the supervisor sees it (see :class:`horovod.runner.backends.base.WorkerHandle`).

    ``channel`` is a pipe the process reads (an ssh client's standard input): it stays open while the worker runs,
    and :meth:`release` closes it, which tells the remote side to stop.
    """

    def __init__(self, proc: subprocess.Popen, channel: Optional[IO[bytes]] = None):
        self.proc = proc
        self.channel = channel

    @property
    def pid(self) -> int:
        """The process id, also its process group id."""
        return self.proc.pid

    @property
    def stdout(self) -> Optional[IO[bytes]]:
        """Its standard output pipe, or None when inherited."""
        return self.proc.stdout

    @property
    def stderr(self) -> Optional[IO[bytes]]:
        """Its standard error pipe, or None when inherited."""
        return self.proc.stderr

    def poll(self) -> Optional[int]:
        """The exit status if it has ended (negative: killed by that signal), else None."""
        return self.proc.poll()

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Wait up to ``timeout`` seconds (None: for ever); the exit status, or None if it still runs."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to its whole process group."""
        signal_group(self.proc.pid, sig)

    def release(self) -> None:
        """Close its channel, if it has one (the remote side then stops the worker)."""
        if self.channel is not None:
            try:
                self.channel.close()
            except OSError:
                pass
