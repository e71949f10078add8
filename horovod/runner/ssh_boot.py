"""The remote end of an ssh launch: ``python -m horovod.runner.ssh_boot`` on each remote host.

Worker mode reads one JSON line from standard input (the job's environment, secret included, the working directory
and the command: nothing of it appears on a command line), starts the worker in its own session with the ssh
channel as its output, then keeps reading standard input. End of input means the launcher is gone or is stopping
the job (its ssh client was killed): the worker's process group gets SIGTERM, then SIGKILL after the grace period.
So a worker never outlives its launcher's connection. The exit status is the worker's (128+N for signal N).

Check mode (``--check ADDR:PORT ...``) prints one JSON line: this host's name, Python and whether each address
accepts a TCP connection, which is how the launcher learns which of its addresses this host can reach.

It imports only the standard library, :mod:`horovod.runner.procgroup` and :mod:`horovod.common.config` (through which
it reads this host's environment): it runs before the job's environment is set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

from horovod.common.config import environ_snapshot
from horovod.runner.procgroup import forward_signals, signal_group, start_session

__all__ = ["PayloadError", "parse_payload", "make_payload", "probe", "supervise", "main", "MAX_PAYLOAD_BYTES",
           "PAYLOAD_VERSION"]

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
PAYLOAD_VERSION = 1


class PayloadError(ValueError):
    """The launcher's payload is missing, too large or not what it should be."""


def parse_payload(line: bytes) -> Dict[str, Any]:
    """Validate one payload line: ``{"version": 1, "cwd": str, "command": [str...], "env": {str: str}, "grace": n}``.

    Raises:
        PayloadError: naming what is wrong.
    """
    if not line.endswith(b"\n"):
        raise PayloadError("no complete payload line on standard input (launcher gone, or payload too large)")
    try:
        payload = json.loads(line)
    except ValueError as exc:
        raise PayloadError(f"payload is not JSON: {exc}") from None
    if not isinstance(payload, dict) or payload.get("version") != PAYLOAD_VERSION:
        raise PayloadError("payload is not a version-1 launch request")
    command, env, cwd, grace = payload.get("command"), payload.get("env"), payload.get("cwd"), payload.get("grace")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise PayloadError("payload command must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise PayloadError("payload env must map strings to strings")
    if not isinstance(cwd, str) or not isinstance(grace, (int, float)) or not 0 <= grace <= 3600:
        raise PayloadError("payload cwd must be a string and grace a number of seconds")
    return payload


def make_payload(command: Sequence[str], env: Mapping[str, str], cwd: str, grace: float) -> bytes:
    """The payload line the launcher writes to a remote worker's standard input."""
    return json.dumps({"version": PAYLOAD_VERSION, "cwd": cwd, "command": list(command), "env": dict(env),
                       "grace": grace}).encode() + b"\n"


def probe(addresses: Sequence[str], timeout: float) -> Dict[str, bool]:
    """Whether each ``host:port`` accepts a TCP connection within ``timeout`` seconds."""
    reachable = {}
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            reachable[address] = True
        except (OSError, ValueError):
            reachable[address] = False
    return reachable


def supervise(child: subprocess.Popen, stdin, grace: float) -> int:
    """Wait for ``child``; stop its process group when ``stdin`` ends or a signal arrives. Returns the exit status."""
    wake = threading.Event()
    stop_reason: List[str] = []

    def watch_stdin() -> None:
        # Raw reads on the descriptor: a daemon thread blocked in a buffered reader would abort interpreter exit.
        try:
            while os.read(stdin.fileno(), 65536):
                pass
        except (OSError, ValueError):
            pass
        stop_reason.append("launcher connection closed")
        wake.set()

    def await_child() -> None:
        child.wait()
        wake.set()

    def on_signal(signum: int) -> None:
        stop_reason.append(signal.Signals(signum).name)
        wake.set()

    with forward_signals(on_signal, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
        threading.Thread(target=watch_stdin, daemon=True).start()
        threading.Thread(target=await_child, daemon=True).start()
        while not wake.wait(1.0):  # bounded waits keep the main thread responsive to signals
            pass
        if child.poll() is None and stop_reason:
            signal_group(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        signal_group(child.pid, signal.SIGKILL)  # the worker, or whatever it left behind in its group
    code = child.wait()
    return code if code >= 0 else 128 - code


def _read_line(fd: int, limit: int) -> bytes:
    # Byte by byte up to the newline, unbuffered, so nothing after the payload is consumed here.
    line = bytearray()
    while len(line) < limit:
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
        if chunk == b"\n":
            break
    return bytes(line)


def _run_worker(stdin) -> int:
    try:
        payload = parse_payload(_read_line(stdin.fileno(), MAX_PAYLOAD_BYTES))
    except PayloadError as exc:
        print(f"horovod ssh_boot on {socket.gethostname()}: {exc}", file=sys.stderr, flush=True)
        return 125
    try:
        os.chdir(payload["cwd"])
    except OSError as exc:
        print(f"horovod: working directory {payload['cwd']!r} does not exist on host {socket.gethostname()} "
              f"({exc.strerror}); it is carried over from the launcher", file=sys.stderr, flush=True)
        return 126
    env = {**environ_snapshot(), **payload["env"]}
    try:
        child = start_session(payload["command"], env, pipes=False)
    except OSError as exc:
        print(f"horovod: cannot start {payload['command'][0]!r} on host {socket.gethostname()}: "
              f"{exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127
    return supervise(child, stdin, float(payload["grace"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m horovod.runner.ssh_boot")
    parser.add_argument("--check", nargs="*", metavar="ADDR:PORT", help="report this host and reachable addresses")
    parser.add_argument("--probe-timeout", type=float, default=5.0)
    parser.add_argument("--rank", type=int, help="the worker's rank (shown in ps, for the operator)")
    parser.add_argument("--host-mode", action="store_true",
                        help="run every worker of this host, relayed as frames (horovod.runner.ssh_host)")
    args = parser.parse_args(argv)
    if args.host_mode:
        from horovod.runner.ssh_host import run_host
        stdin = sys.stdin.buffer
        return run_host(stdin.fileno(), sys.stdout.fileno(), _read_line(stdin.fileno(), MAX_PAYLOAD_BYTES))
    if args.check is not None:
        print(json.dumps({"host": socket.gethostname(), "python": sys.version.split()[0],
                          "reachable": probe(args.check, args.probe_timeout)}), flush=True)
        return 0
    return _run_worker(sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main())
