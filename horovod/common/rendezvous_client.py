"""Client of the rendezvous service (see :mod:`horovod.common.rendezvous_server` for the protocol) and request signing.

Workers use it to publish and find data-plane addresses; it lives in ``common`` because workers never import the
runner.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import socket
import struct
import time
import urllib.parse
from typing import Dict, List, Optional

from horovod.common.exceptions import RendezvousError

MAX_VALUE_BYTES = 64 * 1024 * 1024
MAX_WAIT_SECONDS = 10.0
_REPLY_GRACE_SECONDS = 5.0
MAX_CLOCK_SKEW = 120.0          # seconds a request's clock may differ from the server's (see the server's docstring)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
_NAME = NAME_PATTERN


def make_secret() -> bytes:
    """A fresh 32-byte job secret."""
    return secrets.token_bytes(32)


def sign_digest(secret: bytes, method: str, path: str, nonce: str, digest: str, stamp: str) -> str:
    """The HMAC-SHA256 signature (hex) of one request: method, path, nonce, the body's SHA-256 (hex) and the
    sender's clock (text)."""
    message = "\n".join([method, path, nonce, digest, stamp]).encode("utf-8", "surrogateescape")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path: str, nonce: str, body: bytes, stamp: str = "") -> str:
    """The HMAC-SHA256 signature (hex) of one request with this body (see :func:`sign_digest`)."""
    return sign_digest(secret, method, path, nonce, hashlib.sha256(body).hexdigest(), stamp)


def signed_headers(secret: bytes, method: str, path: str, body: bytes = b"", clock_offset: float = 0.0,
                   nonce: Optional[str] = None) -> Dict[str, str]:
    """Every header that authenticates one request (a fresh nonce unless given)."""
    nonce = nonce or secrets.token_hex(16)
    stamp = f"{time.time() + clock_offset:.3f}"
    digest = hashlib.sha256(body).hexdigest()
    return {"X-Horovod-Nonce": nonce, "X-Horovod-Time": stamp, "X-Horovod-Body-Digest": digest,
            "X-Horovod-Auth": sign_digest(secret, method, path, nonce, digest, stamp),
            "Content-Length": str(len(body))}


class RendezvousClient:
    """Talks to a :class:`RendezvousServer`; every call is bounded in time."""

    def __init__(self, addr: str, port: int, secret: bytes, timeout: float = 30.0):
        self.addr = addr
        self.port = int(port)
        self.secret = secret
        self.timeout = timeout
        self._clock_offset = 0.0     # the server's clock minus ours, learned when it refuses our clock

    def _request(self, method: str, path: str, body: bytes = b"", deadline: Optional[float] = None):
        """One request, retried until ``deadline`` (default: the client's timeout from now), never past it."""
        if deadline is None:
            deadline = time.monotonic() + max(self.timeout, 1.0)
        last_error: Optional[Exception] = None
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RendezvousError(f"rendezvous server {self.addr}:{self.port} gave no answer in time "
                                      f"(HOROVOD_START_TIMEOUT {self.timeout:g} s): {last_error or 'no reply'}")
            try:
                status, headers, reply = _exchange(self.addr, self.port, left, method, path, body,
                                                   signed_headers(self.secret, method, path, body,
                                                                  self._clock_offset))
                server_clock = headers.get("x-horovod-time")
                if status == 403 and server_clock and attempt == 0:
                    self._clock_offset = _offset(server_clock, self._clock_offset)
                    attempt += 1
                    continue
                return status, reply
            except OSError as exc:
                last_error = exc
                attempt += 1
                time.sleep(min(0.2 * attempt, 1.0, max(0.0, deadline - time.monotonic())))

    @staticmethod
    def _path(*parts: str) -> str:
        for p in parts:
            if not _NAME.match(p):
                raise ValueError(f"invalid rendezvous name {p!r}")
        return "/" + "/".join(urllib.parse.quote(p) for p in parts)

    def _check(self, status: int, body: bytes, what: str) -> None:
        if status != 200:
            raise RendezvousError(f"rendezvous {what} refused with HTTP {status}: {body[:200]!r}")

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``scope/key``, replacing any earlier value."""
        status, body = self._request("PUT", self._path("kv", scope, key), value)
        self._check(status, body, f"PUT {scope}/{key}")

    def get(self, scope: str, key: str, timeout: Optional[float] = None) -> bytes:
        """Wait up to ``timeout`` seconds (default: the client's) for the key; raises RendezvousError after."""
        return self._long_poll(self._path("kv", scope, key) + "?", timeout, _REPLY_GRACE_SECONDS,
                               f"rendezvous key {scope}/{key}")

    def get_all(self, scope: str, count: int, timeout: Optional[float] = None,
                grace: float = _REPLY_GRACE_SECONDS) -> Dict[str, bytes]:
        """Every key and value of ``scope`` once it holds ``count`` keys, waiting up to ``timeout`` seconds (default:
        the client's), plus ``grace`` for the server's answer; raises RendezvousError after."""
        return unpack_items(self._long_poll(self._path("all", scope) + f"?count={int(count)}&", timeout, grace,
                                            f"{count} keys in rendezvous scope {scope}"))

    def _long_poll(self, path: str, timeout: Optional[float], grace: float, what: str) -> bytes:
        """GET ``path`` with ``wait=`` appended until it answers 200, within ``timeout``; 404 means not yet."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            wait = max(0.0, min(MAX_WAIT_SECONDS, deadline - time.monotonic()))
            # The server answers after ``wait`` at the latest; a little grace for a loaded launcher, never more.
            status, body = self._request("GET", path + f"wait={wait:.3f}", deadline=time.monotonic() + wait + grace)
            if status == 200:
                return body
            if status != 404:
                self._check(status, body, f"GET {path}")
            if time.monotonic() >= deadline:
                raise RendezvousError(f"timed out after {timeout if timeout is not None else self.timeout:.1f}s "
                                      f"waiting for {what}")

    def try_get(self, scope: str, key: str) -> Optional[bytes]:
        """The value of ``scope/key`` now, or None if there is none (no waiting)."""
        status, body = self._request("GET", self._path("kv", scope, key) + "?wait=0")
        if status == 404:
            return None
        self._check(status, body, f"GET {scope}/{key}")
        return body

    def delete(self, scope: str, key: Optional[str] = None) -> None:
        """Delete ``scope/key``, or the whole scope when ``key`` is None."""
        path = self._path("kv", scope) if key is None else self._path("kv", scope, key)
        status, body = self._request("DELETE", path)
        self._check(status, body, f"DELETE {path}")

    def keys(self, scope: str) -> List[str]:
        """The keys of ``scope``, sorted."""
        status, body = self._request("GET", self._path("keys", scope))
        self._check(status, body, f"GET keys of {scope}")
        return [k for k in body.decode().split("\n") if k]


_ITEM = struct.Struct("!II")


class _BadReply(OSError):
    """The server's reply is not the HTTP/1.1 our server writes (retried like a connection error)."""


_MAX_REPLY_HEAD = 64 * 1024


def _exchange(addr: str, port: int, timeout: float, method: str, path: str, body: bytes,
              headers: Dict[str, str]) -> tuple:
    """One HTTP/1.1 request on a new connection: (status, lower-cased headers, body).

    Our server answers every request with a ``Content-Length`` and closes the connection, so this is all the HTTP a
    rank needs: ``http.client`` would cost every rank's start-up its imports (``ssl``, ``email``, ``calendar``:
    tens of milliseconds of CPU each time a rank starts, which a 256-rank start on two cores pays 256 times).

    Raises:
        OSError: the connection failed or timed out; ``_BadReply`` for a malformed reply.
    """
    lines = [f"{method} {path} HTTP/1.1", f"Host: {addr}:{port}", f"Content-Length: {len(body)}",
             "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection((addr, port), timeout=timeout) as sock:
        sock.sendall(request)
        received = bytearray()
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, sep, rest = bytes(received).partition(b"\r\n\r\n")
    if not sep or len(head) > _MAX_REPLY_HEAD:
        raise _BadReply(f"incomplete reply from {addr}:{port} ({len(received)} bytes)")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise _BadReply(f"malformed status line from {addr}:{port}: {status_line[:80]!r}")
    reply_headers: Dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if colon:
            reply_headers[name.strip().lower()] = value.strip()
    length = reply_headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > len(rest):
            raise _BadReply(f"reply from {addr}:{port} ended before its {length} bytes of body")
        rest = rest[:int(length)]
    return int(parts[1]), reply_headers, rest


def pack_items(items: Dict[str, bytes]) -> bytes:
    """Keys and values as one body: per item, the key's and the value's lengths (4 bytes each), then both."""
    parts = []
    for key in sorted(items):
        raw = key.encode()
        parts += [_ITEM.pack(len(raw), len(items[key])), raw, items[key]]
    return b"".join(parts)


def unpack_items(body: bytes) -> Dict[str, bytes]:
    """The inverse of :func:`pack_items`.

    Raises:
        RendezvousError: the body is cut short.
    """
    items, at = {}, 0
    while at < len(body):
        if at + _ITEM.size > len(body):
            raise RendezvousError("truncated rendezvous reply")
        key_len, value_len = _ITEM.unpack_from(body, at)
        at += _ITEM.size
        if at + key_len + value_len > len(body):
            raise RendezvousError("truncated rendezvous reply")
        items[body[at:at + key_len].decode()] = body[at + key_len:at + key_len + value_len]
        at += key_len + value_len
    return items


def _offset(server_clock: str, current: float) -> float:
    try:
        return float(server_clock) - time.time()
    except ValueError:
        return current


def secret_to_hex(secret: bytes) -> str:
    """The job secret as the hex text workers receive in ``HOROVOD_SECRET_KEY``."""
    return secret.hex()


def secret_from_hex(text: str) -> bytes:
    """The job secret from ``HOROVOD_SECRET_KEY``'s hex text; raises HorovodConfigError if it is not hex."""
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise RendezvousError("HOROVOD_SECRET_KEY is not a hex string") from None


__all__ = ["RendezvousClient", "make_secret", "sign", "sign_digest", "signed_headers", "secret_to_hex",
           "secret_from_hex", "MAX_CLOCK_SKEW"]
