"""The rendezvous service: a small authenticated HTTP key/value store where a job's workers meet.

The launcher (``horovodrun``, ``horovod.run``, elastic driver, Ray, Spark, or rank 0 under ``mpirun``) serves it on an
ephemeral port; workers publish their data-plane addresses into it and wait for their peers'.

Protocol (HTTP/1.1):
    ``PUT /kv/<scope>/<key>``            body = value; 200.
    ``GET /kv/<scope>/<key>?wait=<s>``   200 with the value, or 404 once ``wait`` seconds (capped) pass without it.
    ``DELETE /kv/<scope>/<key>``         200; ``DELETE /kv/<scope>`` drops the whole scope.
    ``GET /keys/<scope>``                200 with the scope's keys, one per line.

Every request carries ``X-Horovod-Auth``: HMAC-SHA256 over method, path, a fresh nonce and the body's digest, keyed
with the per-job secret, and ``X-Horovod-Nonce``. A request without a valid signature gets 403, a malformed one 400;
neither changes anything. Nonces are remembered, so a captured request cannot be replayed.
"""

from __future__ import annotations

import hmac
import http.server
import socketserver
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Tuple

from horovod.common.rendezvous_client import MAX_VALUE_BYTES, MAX_WAIT_SECONDS, sign
from horovod.common.rendezvous_client import NAME_PATTERN as _NAME



class KVStore:
    """Scoped key/value store with a bounded wait for a key; thread-safe."""

    def __init__(self):
        self._data: Dict[str, Dict[str, bytes]] = {}
        self._changed = threading.Condition()

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``scope/key`` and wake every waiting reader."""
        with self._changed:
            self._data.setdefault(scope, {})[key] = value
            self._changed.notify_all()

    def get(self, scope: str, key: str, wait: float = 0.0) -> Optional[bytes]:
        """The value of ``scope/key``, waiting up to ``wait`` seconds for it; None if it did not come."""
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                value = self._data.get(scope, {}).get(key)
                remaining = deadline - time.monotonic()
                if value is not None or remaining <= 0:
                    return value
                self._changed.wait(remaining)

    def delete(self, scope: str, key: Optional[str] = None) -> None:
        """Delete ``scope/key``, or the whole scope when ``key`` is None."""
        with self._changed:
            if key is None:
                self._data.pop(scope, None)
            else:
                self._data.get(scope, {}).pop(key, None)
            self._changed.notify_all()

    def keys(self, scope: str) -> List[str]:
        """The keys of ``scope``, sorted."""
        with self._changed:
            return sorted(self._data.get(scope, {}))


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:  # silence the default stderr access log
        pass

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _parse(self) -> Optional[Tuple[List[str], Dict[str, List[str]], bytes]]:
        """Authenticate and split the request; replies and returns None when it is refused."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._reply(400, b"bad Content-Length")
            return None
        if length < 0 or length > MAX_VALUE_BYTES:
            self._reply(400, b"body too large")
            self.close_connection = True
            return None
        body = self.rfile.read(length) if length else b""
        nonce = self.headers.get("X-Horovod-Nonce") or ""
        signature = self.headers.get("X-Horovod-Auth") or ""
        expected = sign(self.server.secret, self.command, self.path, nonce, body)
        if not nonce or not hmac.compare_digest(signature, expected) or not self.server.fresh_nonce(nonce):
            self._reply(403, b"forbidden")
            return None
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if not parts or not all(_NAME.match(p) for p in parts):
            self._reply(400, b"malformed path")
            return None
        return parts, urllib.parse.parse_qs(url.query), body

    def do_PUT(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        parts, _, body = parsed
        if len(parts) != 3 or parts[0] != "kv":
            return self._reply(400, b"expected /kv/<scope>/<key>")
        self.server.store.put(parts[1], parts[2], body)
        self._reply(200)

    def do_GET(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        parts, query, _ = parsed
        if len(parts) == 2 and parts[0] == "keys":
            return self._reply(200, "\n".join(self.server.store.keys(parts[1])).encode())
        if len(parts) != 3 or parts[0] != "kv":
            return self._reply(400, b"expected /kv/<scope>/<key>")
        try:
            wait = min(max(float(query.get("wait", ["0"])[0]), 0.0), MAX_WAIT_SECONDS)
        except ValueError:
            return self._reply(400, b"bad wait")
        value = self.server.store.get(parts[1], parts[2], wait)
        if value is None:
            return self._reply(404)
        self._reply(200, value)

    def do_DELETE(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        parts, _, _ = parsed
        if parts[0] != "kv" or len(parts) not in (2, 3):
            return self._reply(400, b"expected /kv/<scope>[/<key>]")
        self.server.store.delete(parts[1], parts[2] if len(parts) == 3 else None)
        self._reply(200)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address, secret: bytes, store: KVStore):
        super().__init__(address, _Handler)
        self.secret = secret
        self.store = store
        self._nonces: Dict[str, float] = {}
        self._nonce_lock = threading.Lock()

    def fresh_nonce(self, nonce: str) -> bool:
        now = time.monotonic()
        with self._nonce_lock:
            if nonce in self._nonces:
                return False
            if len(self._nonces) > 100000:
                self._nonces = {n: t for n, t in self._nonces.items() if now - t < 600}
            self._nonces[nonce] = now
            return True


class RendezvousServer:
    """Serves a :class:`KVStore` over authenticated HTTP on an ephemeral port, in a daemon thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, secret: bytes, host: str = "0.0.0.0", port: int = 0):
        self.secret = secret
        self.store = KVStore()
        self._address = (host, port)
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> int:
        """Start serving; returns the port."""
        self._server = _Server(self._address, self.secret, self.store)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="horovod-rendezvous", daemon=True)
        self._thread.start()
        return self.port

    @property
    def port(self) -> int:
        """The port the server listens on (after :meth:`start`)."""
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    def stop(self) -> None:
        """Stop serving and close the listening socket; a server never started is fine."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "RendezvousServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["KVStore", "RendezvousServer"]
