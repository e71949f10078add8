"""A small process that ends the sessions its owner started when the owner dies, however it dies.

Why: the kernel's parent-death signal (``PR_SET_PDEATHSIG``) reaches only a process's direct children. A worker
started through a wrapper (``sh -c "python train.py; echo done"``, a shell script, ``env``, ``timeout``) is the
wrapper's child: when ``horovodrun`` is SIGKILLed the wrapper dies with it, and the worker is reparented and lives
on. Only a process that outlives the launcher can end it.

How: the first time a process starts a session (:func:`horovod.runner.procgroup.start_session`: ``horovodrun``,
and on each remote host the ssh bootstrap), it spawns one guardian, in a session of its own, that holds the other
end of a socket pair. Each new session registers itself from the forked child before ``exec`` (so it never runs
unregistered); the owner releases a session once it has stopped it, and the guardian then ends what is left of it.
When the owner's process ends, by SIGKILL too, the kernel closes its end: the guardian reads end of file, SIGKILLs
every session still registered and exits.

"Ending a session" kills every process group in it: the leader's group, and the groups a member made for itself
(``timeout`` does), found by their session id in ``/proc``; whole groups at a time, so a process forking meanwhile
cannot slip out. A process that starts a session of its own (``setsid``, a daemon) has left the job; it is not
covered. Processes are found by their session, never by name.

The guardian runs as a script by path (``python -I -S guardian.py``): standard library only, it starts in tens of
milliseconds and imports nothing of the job; :func:`session_groups` and :func:`end_sessions` are also used from
:mod:`.procgroup`. One guardian per process that starts sessions: what it watches is that process's life.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import time
from typing import Collection, Iterator, List, Mapping, Optional, Set, Tuple

__all__ = ["Guardian", "session_groups", "end_sessions", "signal_sessions", "serve"]

_MESSAGE = 32             # "+PID" / "-PID", one datagram each
_SWEEP_SECONDS = 1.0      # killing is repeated while members remain (one forking meanwhile), up to this long
_SEND_SECONDS = 2         # a registration waits this long for room (a burst of starts before the guardian reads)


def _processes() -> Iterator[Tuple[int, int, int]]:
    """``(pid, pgid, sid)`` of every live (not zombie) process this host shows in ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                # The fields after the parenthesised command (which may hold spaces): state ppid pgrp session.
                state, _, pgid, sid = handle.read().rsplit(b")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if state != b"Z":
            yield int(name), int(pgid), int(sid)


def session_groups(sessions: Collection[int]) -> Set[int]:
    """The process groups with a live member in one of ``sessions`` (session ids: their leaders' pids)."""
    return {pgid for _, pgid, sid in _processes() if sid in sessions}


def signal_sessions(sessions: Collection[int], sig: int) -> None:
    """Send ``sig`` to every process group of ``sessions`` (each leader's group, whether or not ``/proc`` lists
    it); groups already gone are fine."""
    for pgid in set(sessions) | session_groups(sessions):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_sessions(sessions: Collection[int]) -> None:
    """SIGKILL everything in ``sessions``, again while a pass still finds a member (bounded: about a second)."""
    sessions = set(sessions)
    pause, deadline = 0.005, time.monotonic() + _SWEEP_SECONDS
    while sessions:
        signal_sessions(sessions, signal.SIGKILL)
        time.sleep(pause)       # a killed process takes a moment to die
        if not session_groups(sessions) or time.monotonic() > deadline:
            return
        pause = min(pause * 2, 0.1)


def _receive(channel: socket.socket) -> Tuple[List[bytes], bool]:
    """The messages waiting (at least one, waiting for it), and whether the owner's end is closed."""
    messages: List[bytes] = []
    flags = 0
    while True:
        try:
            message = channel.recv(_MESSAGE, flags)
        except BlockingIOError:
            return messages, False
        except OSError:
            return messages, True
        if not message:
            return messages, True
        messages.append(message)
        flags = socket.MSG_DONTWAIT


def serve(channel: socket.socket) -> None:
    """The guardian's loop: track ``+PID`` (registered) and ``-PID`` (released: end what is left of it now, all
    releases that arrived together in one sweep), and at end of input end every session still registered."""
    registered: Set[int] = set()
    closed = False
    while not closed:
        messages, closed = _receive(channel)
        released = set()
        for message in messages:
            try:
                pid = int(message[1:])
            except ValueError:
                continue
            if message[:1] == b"+":
                registered.add(pid)
            elif message[:1] == b"-" and pid in registered:   # only a session registered by its own child
                registered.discard(pid)
                released.add(pid)
        end_sessions(released)
    end_sessions(registered)


class Guardian:
    """The owner's side: the guardian's pid and this end of the socket pair.

    Args:
        pid: the guardian's process id.
        channel: this end of the pair (never inherited by a started program: it is close-on-exec).
    """

    def __init__(self, pid: int, channel: socket.socket):
        self.pid = pid
        self.channel = channel
        self.owner = os.getpid()

    @classmethod
    def spawn(cls, env: Mapping[str, str]) -> Optional["Guardian"]:
        """Start a guardian for this process, its interpreter with ``env``; None where one cannot be started (no
        interpreter path, no ``posix_spawn``), in which case only the direct children die with this process."""
        if not sys.executable or not hasattr(os, "posix_spawn"):
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Its own session: a signal to the owner's process group (a terminal's ^C, kill -9 -PGID) leaves it be.
            pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", os.path.abspath(__file__)], dict(env),
                                 file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), 0),
                                               (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                               (os.POSIX_SPAWN_DUP2, 1, 2)],
                                 setsid=True)
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        # Blocking sends, but bounded: a guardian that is stopped must not hang every start.
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", _SEND_SECONDS, 0))
        return cls(pid, mine)

    def alive(self) -> bool:
        """Whether the guardian still runs (reaps it if it ended)."""
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def register_self(self) -> None:
        """Register the calling process's session; meant for a forked child before ``exec`` (never raises, blocks
        at most a moment: a guardian that is gone or stuck costs only the registration)."""
        self._send(b"+%d" % os.getpid())

    def release(self, pid: int) -> None:
        """The owner has stopped the session led by ``pid``: end what is left of it, and forget it."""
        self._send(b"-%d" % pid)

    def _send(self, message: bytes) -> None:
        try:
            self.channel.send(message, socket.MSG_NOSIGNAL)
        except OSError:
            pass


def main() -> None:
    """Run as the guardian: standard input is the owner's socket. (In a session of its own it has no terminal to
    hang up or interrupt it, and Python ignores SIGPIPE: no handlers to install.)"""
    serve(socket.socket(fileno=0))


if __name__ == "__main__":
    main()
