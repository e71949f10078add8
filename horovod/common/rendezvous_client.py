"""Client of the rendezvous service (see :mod:`horovod.common.rendezvous_server` for the protocol) and request signing.

Workers use it to publish and find data-plane addresses; it lives in ``common`` because workers never import the
runner.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import re
import secrets
import time
import urllib.parse
from typing import List, Optional

from horovod.common.exceptions import RendezvousError

MAX_VALUE_BYTES = 64 * 1024 * 1024
MAX_WAIT_SECONDS = 10.0
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
_NAME = NAME_PATTERN


def make_secret() -> bytes:
    """A fresh 32-byte job secret."""
    return secrets.token_bytes(32)


def sign(secret: bytes, method: str, path: str, nonce: str, body: bytes) -> str:
    """The HMAC-SHA256 signature (hex) of one request: method, path, nonce and the body's digest."""
    message = b"\n".join([method.encode(), path.encode(), nonce.encode(), hashlib.sha256(body).digest()])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class RendezvousClient:
    """Talks to a :class:`RendezvousServer`; every call is bounded in time."""

    def __init__(self, addr: str, port: int, secret: bytes, timeout: float = 30.0):
        self.addr = addr
        self.port = int(port)
        self.secret = secret
        self.timeout = timeout

    def _request(self, method: str, path: str, body: bytes = b"", http_timeout: float = 30.0):
        nonce = secrets.token_hex(16)
        headers = {"X-Horovod-Nonce": nonce, "X-Horovod-Auth": sign(self.secret, method, path, nonce, body),
                   "Content-Length": str(len(body))}
        last_error: Optional[Exception] = None
        for attempt in range(3):
            conn = http.client.HTTPConnection(self.addr, self.port, timeout=http_timeout)
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as exc:
                last_error = exc
                time.sleep(0.2 * (attempt + 1))
                nonce = secrets.token_hex(16)
                headers["X-Horovod-Nonce"] = nonce
                headers["X-Horovod-Auth"] = sign(self.secret, method, path, nonce, body)
            finally:
                conn.close()
        raise RendezvousError(f"rendezvous server {self.addr}:{self.port} unreachable: {last_error}")

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
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            wait = max(0.0, min(MAX_WAIT_SECONDS, deadline - time.monotonic()))
            status, body = self._request("GET", self._path("kv", scope, key) + f"?wait={wait:.3f}",
                                         http_timeout=wait + 30.0)
            if status == 200:
                return body
            if status != 404:
                self._check(status, body, f"GET {scope}/{key}")
            if time.monotonic() >= deadline:
                raise RendezvousError(f"timed out after {timeout if timeout is not None else self.timeout:.1f}s "
                                      f"waiting for rendezvous key {scope}/{key}")

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


def secret_to_hex(secret: bytes) -> str:
    """The job secret as the hex text workers receive in ``HOROVOD_SECRET_KEY``."""
    return secret.hex()


def secret_from_hex(text: str) -> bytes:
    """The job secret from ``HOROVOD_SECRET_KEY``'s hex text; raises HorovodConfigError if it is not hex."""
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise RendezvousError("HOROVOD_SECRET_KEY is not a hex string") from None


__all__ = ["RendezvousClient", "make_secret", "sign", "secret_to_hex", "secret_from_hex"]
