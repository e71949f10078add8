"""The frames of a host channel: every worker of one host over one ssh connection (see :mod:`.ssh_host`).

Remote to launcher, on ssh's standard output: a 9-byte header (the rank, the kind, the length) and the payload.
Kinds: :data:`STDOUT` and :data:`STDERR` carry a chunk of a worker's output as written (lines are cut by the
launcher), :data:`EXIT` the worker's exit status as ASCII (negative: the signal that killed it, as in
:mod:`subprocess`). Launcher to remote, on ssh's standard input: the payload line, then ``signal RANK SIGNUM`` lines;
the end of input stops every worker of the host.

Standard library only: the remote end runs before the job's environment is set.
"""

from __future__ import annotations

import struct
from typing import Iterator, Tuple

__all__ = ["STDOUT", "STDERR", "EXIT", "MAX_CHUNK", "frame", "FrameReader", "signal_line", "parse_signal_line"]

STDOUT, STDERR, EXIT = 1, 2, 3
MAX_CHUNK = 1 << 16
_HEADER = struct.Struct("!iBI")


def frame(rank: int, kind: int, payload: bytes) -> bytes:
    """One frame."""
    return _HEADER.pack(rank, kind, len(payload)) + payload


class FrameReader:
    """Cuts a byte stream into frames, whatever the chunks it arrives in."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Tuple[int, int, bytes]]:
        """The complete frames ``data`` finishes, as ``(rank, kind, payload)``.

        Raises:
            ValueError: a frame of an unknown kind or longer than :data:`MAX_CHUNK` (not this protocol).
        """
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            rank, kind, length = _HEADER.unpack_from(self._buffer)
            if kind not in (STDOUT, STDERR, EXIT) or length > MAX_CHUNK:
                raise ValueError(f"not a host-channel frame (kind {kind}, {length} bytes)")
            if len(self._buffer) < _HEADER.size + length:
                return
            payload = bytes(self._buffer[_HEADER.size:_HEADER.size + length])
            del self._buffer[:_HEADER.size + length]
            yield rank, kind, payload

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)


def signal_line(rank: int, signum: int) -> bytes:
    """The launcher's request to signal one worker's process group."""
    return f"signal {int(rank)} {int(signum)}\n".encode()


def parse_signal_line(line: bytes) -> Tuple[int, int]:
    """``(rank, signum)`` of a request line.

    Raises:
        ValueError: not a request.
    """
    word, rank, signum = line.decode("ascii").split()
    if word != "signal":
        raise ValueError(f"unknown request {line[:40]!r}")
    return int(rank), int(signum)
