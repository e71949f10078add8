"""Processes in their own session: start one, signal its whole group, forward this process's signals to a callback.

Every process the runner starts (a worker, an ssh client, ``mpirun``, the worker under the remote bootstrap) leads its
own session, so its process group id is its pid: stopping it signals the group (the process and anything it started),
never a process found by name. This (with :mod:`.guardian`, whose :func:`signal_sessions` it passes on) is the runner's
only ``killpg``, and its only signal-handler installer.

Nothing a session started outlives the process that started it, at any depth: each session registers with this
process's guardian (:mod:`.guardian`, spawned with the first session), which SIGKILLs every session still registered
when this process ends, by SIGKILL too, and ends what is left of a session once it is released
(:func:`release_session`, :meth:`ProcessHandle.release`). So a ``horovodrun`` killed with SIGKILL takes its local
workers, whatever wrappers they run under (``sh -c``, scripts, ``timeout``), and its ssh clients with it; each ssh
client's end closes the remote host's channel, and the remote bootstrap stops its workers (and its own guardian
ends what they started). A process started from the main thread on Linux also dies with its starter at once
(``PR_SET_PDEATHSIG``, SIGKILL; only from the main thread, because the kernel sends the signal when the *thread* that
started the process ends).

Standard library and :mod:`horovod.common.config` only: the remote bootstrap (:mod:`horovod.runner.ssh_boot`) uses it
before any job environment is set.
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

from horovod.common.config import environ_snapshot
from horovod.runner.guardian import Guardian, signal_sessions

__all__ = ["signal_group", "signal_sessions", "start_session", "release_session", "forward_signals", "ProcessHandle",
           "DEFAULT_SIGNALS"]

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


_GUARDIAN: Optional[Guardian] = None     # this process's; a forked child starts its own
_GUARDIAN_LOCK = threading.Lock()


def _guardian() -> Optional[Guardian]:
    """This process's guardian, spawned on first use and again if it ended."""
    global _GUARDIAN
    with _GUARDIAN_LOCK:
        if _GUARDIAN is not None and _GUARDIAN.owner != os.getpid():
            _GUARDIAN.channel.close()     # the parent's: keeping it open would hide the parent's death
            _GUARDIAN = None
        if _GUARDIAN is None or not _GUARDIAN.alive():
            _GUARDIAN = Guardian.spawn(environ_snapshot())
        return _GUARDIAN


def _tie_to_starter(parent: int, guardian: Optional[Guardian]) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that registers the child's session with ``guardian`` and, from the main thread, makes the
    child die with this process (None where neither can be arranged)."""
    pdeathsig = _PRCTL is not None and threading.current_thread() is threading.main_thread()
    if guardian is None and not pdeathsig:
        return None

    def arrange() -> None:
        if guardian is not None:
            guardian.register_self()    # before exec: the session never runs unregistered
        if pdeathsig:
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
        kwargs["preexec_fn"] = _tie_to_starter(os.getpid(), _guardian())
    return popen(list(argv), env=dict(env), stdin=stdin, start_new_session=True, **streams, **kwargs)


def release_session(pid: int) -> None:
    """The session led by ``pid`` (started by :func:`start_session`) has been stopped: the guardian ends whatever
    is left of it (process groups its members made included) and stops watching it. Unknown pids are ignored."""
    with _GUARDIAN_LOCK:
        guardian = _GUARDIAN
    if guardian is not None and guardian.owner == os.getpid():
        guardian.release(pid)


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
        """Close its channel, if it has one (the remote side then stops the worker), and end what is left of its
        session (:func:`release_session`)."""
        if self.channel is not None:
            try:
                self.channel.close()
            except OSError:
                pass
        release_session(self.proc.pid)
