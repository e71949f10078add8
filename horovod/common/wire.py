"""Framing, the control-message codec and connection authentication.

Control messages are tuples, lists, dicts, strings, bytes, numbers, booleans and None only: they are pickled and
unpickled with an unpickler that refuses every class, so nothing from the network can name code to run, and the
decoded value is checked to hold nothing else (no sets, bytearrays or other types a pickle can build without naming
a class). Each frame is a 4-byte big-endian length then the payload, capped at :data:`MAX_CONTROL_BYTES`; anything
malformed is one :class:`HorovodInternalError`.

Authentication is a mutual challenge-response: each side sends a random nonce and proves knowledge of the job secret
with an HMAC over both nonces, both ranks, its role (dialer or acceptor) and the connection's purpose, before anything
else is read. The dialer proves itself first; the acceptor answers only a dialer that has.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import re
import select
import socket
import struct
import time
from typing import Any, Callable, Optional

from horovod.common.exceptions import HorovodInternalError

__all__ = ["MAGIC", "MAX_CONTROL_BYTES", "HELLO_SIZE", "PROOF_SIZE", "encode", "decode", "recv_exact", "send_frame",
           "recv_frame", "recv_by", "hello", "hello_matches", "parse_hello", "proof", "handshake"]

MAGIC = b"HVDPY1\0\0"
MAX_CONTROL_BYTES = 64 * 1024 * 1024
_LEN = struct.Struct("!I")
_HELLO = struct.Struct("!8s16sii")   # magic, nonce, rank, purpose id
HELLO_SIZE = _HELLO.size
PROOF_SIZE = 32


class _NoClassUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"control message names a class ({module}.{name}); refused")


_SCALARS = (str, bytes, int, float, bool, type(None))
_NON_PLAIN_OPCODES = re.compile(b"[\x8f-\x91\x96-\x98]")   # EMPTY_SET, ADDITEMS, FROZENSET, BYTEARRAY8, *_BUFFER
_MAX_DEPTH = 32


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data: scalars, and tuples, lists and dicts (scalar keys) of plain data."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth >= _MAX_DEPTH:
        return False
    if kind is tuple or kind is list:
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(key) in _SCALARS and _plain(item, depth + 1) for key, item in value.items())
    return False


def encode(message: Any) -> bytes:
    """A control message (primitives only) as bytes."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(payload: bytes) -> Any:
    """A control message from bytes, refusing every class.

    Raises:
        HorovodInternalError: the bytes are not a valid message.
    """
    try:
        message = _NoClassUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:  # any garbage must become one clear error, never a crash elsewhere
        raise HorovodInternalError(f"garbled control message ({len(payload)} bytes): {exc}") from None
    # Only pickle's set, frozenset, bytearray and buffer opcodes build something other than plain data without
    # naming a class: look for their bytes first (one regex scan), and walk the message only when one
    # appears (inside a string or a float too, now and then), so that frames of plain data cost no walk.
    if _NON_PLAIN_OPCODES.search(payload) is not None and not _plain(message):
        raise HorovodInternalError(f"control message of {len(payload)} bytes holds something other than plain data "
                                   f"({type(message).__name__}); refused")
    return message


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; a closed connection raises ConnectionError."""
    got = 0
    total = len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n


def send_frame(sock: socket.socket, payload: bytes) -> None:
    """Send ``payload`` as one length-prefixed frame."""
    sock.sendall(_LEN.pack(len(payload)) + payload if len(payload) < 65536 else _LEN.pack(len(payload)))
    if len(payload) >= 65536:
        sock.sendall(payload)


def recv_frame(sock: socket.socket, on_silence: Optional[Callable[[float], None]] = None,
               tick: float = 0.0) -> bytes:
    """Receive one length-prefixed frame (size-capped).

    With ``on_silence``, silence before the first byte of the frame is not an error: every ``tick`` seconds it is
    called with how long the wait has lasted (it may raise to end it), and the wait goes on (a live peer may be busy;
    a lost one is the connection's liveness to report).
    """
    header = bytearray(_LEN.size)
    if on_silence is None or tick <= 0:
        recv_exact(sock, memoryview(header))
    else:
        _recv_header_patiently(sock, memoryview(header), on_silence, tick)
    (length,) = _LEN.unpack(header)
    if length > MAX_CONTROL_BYTES:
        raise HorovodInternalError(f"control frame of {length} bytes exceeds the {MAX_CONTROL_BYTES} limit")
    payload = bytearray(length)
    recv_exact(sock, memoryview(payload))
    return bytes(payload)


def _recv_header_patiently(sock: socket.socket, view: memoryview, on_silence: Callable[[float], None],
                           tick: float) -> None:
    started = time.monotonic()
    poller = select.poll()     # not select.select: descriptors past 1,024 are common at scale
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    got = 0
    while got < len(view):
        if not got and not poller.poll(max(1, int(tick * 1000))):
            on_silence(time.monotonic() - started)
            continue
        n = sock.recv_into(view[got:], len(view) - got)
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n


def recv_by(sock: socket.socket, size: int, deadline: Optional[float]) -> bytes:
    """``size`` bytes from ``sock`` before ``deadline`` in all, however slowly they trickle in."""
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("handshake not complete by its deadline")
            sock.settimeout(left)
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n
    return bytes(data)


def hello(nonce: bytes, my_rank: int, purpose: int) -> bytes:
    """The first bytes each end of a connection sends."""
    return _HELLO.pack(MAGIC, nonce, my_rank, purpose)


def hello_matches(data: bytes, purpose: int) -> bool:
    """Whether a peer's hello speaks this protocol for ``purpose``."""
    magic, _, _, their_purpose = _HELLO.unpack(data)
    return magic == MAGIC and their_purpose == purpose


def parse_hello(data: bytes):
    """A peer's hello as ``(nonce, rank)``."""
    _, nonce, rank, _ = _HELLO.unpack(data)
    return nonce, rank


def proof(secret: bytes, role: bytes, dialer_nonce: bytes, acceptor_nonce: bytes, dialer_rank: int,
           acceptor_rank: int, purpose: int) -> bytes:
    """One side's HMAC proof of the job secret over both nonces, both ranks, its role and the purpose."""
    # The role and both ranks are bound into the proof, so a proof obtained from one connection (or from the other
    # direction of the handshake) is worthless on any other: no reflection of a peer's own answer.
    message = role + dialer_nonce + acceptor_nonce + struct.pack("!iii", dialer_rank, acceptor_rank, purpose)
    return hmac.new(secret, message, hashlib.sha256).digest()


def handshake(sock: socket.socket, secret: bytes, my_rank: int, purpose: int, dialer: bool = True,
              deadline: Optional[float] = None) -> int:
    """Authenticate both ends of a fresh connection; returns the peer's rank.

    The dialer proves itself first; the acceptor answers with its own proof only after checking the dialer's, so an
    unauthenticated stranger never obtains a proof computed with the secret.

    Args:
        sock: the fresh connection.
        secret: the job secret.
        my_rank: this end's rank.
        purpose: what the connection is for (both ends must agree).
        dialer: True on the side that connected, False on the side that accepted.
        deadline: ``time.monotonic()`` by which the whole handshake must be done (None: the socket's timeout
            bounds each receive).

    Raises:
        HorovodInternalError: the peer does not know the secret, speaks another protocol or another purpose.
    """
    nonce = os.urandom(16)
    sock.sendall(hello(nonce, my_rank, purpose))
    theirs = recv_by(sock, HELLO_SIZE, deadline)
    if not hello_matches(theirs, purpose):
        raise HorovodInternalError("peer speaks another protocol or belongs to another job")
    their_nonce, their_rank = parse_hello(theirs)
    if dialer:
        sock.sendall(proof(secret, b"D", nonce, their_nonce, my_rank, their_rank, purpose))
        expected = proof(secret, b"A", nonce, their_nonce, my_rank, their_rank, purpose)
    else:
        expected = proof(secret, b"D", their_nonce, nonce, their_rank, my_rank, purpose)
    answer = recv_by(sock, PROOF_SIZE, deadline)
    if not hmac.compare_digest(answer, expected):
        raise HorovodInternalError("peer failed authentication (wrong job secret)")
    if not dialer:
        sock.sendall(proof(secret, b"A", their_nonce, nonce, their_rank, my_rank, purpose))
    return their_rank
