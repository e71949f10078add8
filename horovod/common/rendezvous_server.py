"""The rendezvous service: a small authenticated HTTP key/value store where a job's workers meet.

The launcher (``horovodrun``, ``horovod.run``, elastic driver, Ray, Spark, or rank 0 under ``mpirun``) serves it on an
ephemeral port; workers publish their data-plane addresses into it and wait for their peers'.

Protocol (HTTP/1.1):
    ``PUT /kv/<scope>/<key>``            body = value; 200.
    ``GET /kv/<scope>/<key>?wait=<s>``   200 with the value, or 404 once ``wait`` seconds (capped) pass without it.
    ``DELETE /kv/<scope>/<key>``         200; ``DELETE /kv/<scope>`` drops the whole scope.
    ``GET /keys/<scope>``                200 with the scope's keys, one per line.
    ``GET /all/<scope>?count=<n>&wait=<s>``  200 with every key and value of the scope once it holds ``n`` keys
                                         (:func:`pack_items`), or 404 once ``wait`` seconds pass before that: one
                                         request per worker where reading each peer's key would be ``n``.

Every request carries ``X-Horovod-Auth``: HMAC-SHA256 over method, path, a fresh nonce, the sender's clock and the
body's digest, keyed with the per-job secret, with ``X-Horovod-Nonce``, ``X-Horovod-Time`` and
``X-Horovod-Body-Digest``. The signature is checked before a byte of the body is read (the body must then match its
signed digest). A request without a valid signature gets 403, a malformed one 400; neither changes anything. Nonces
are remembered by the store, so a captured request cannot be replayed on any address that serves the job, and for
longer than a request is accepted: one whose clock is more than :data:`MAX_CLOCK_SKEW` seconds from the server's is
refused (403 with the server's clock, which the client adopts as an offset), so no replay outlives its nonce.

Strangers are bounded: a request (line, headers, body) must arrive within :data:`REQUEST_SECONDS` in all, at most
:data:`MAX_UNAUTHENTICATED` connections may be waiting to authenticate at once (more are closed at once), and a
client that hangs up early costs nothing but its thread.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import math
import socket
import socketserver
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Tuple

from horovod.common.rendezvous_client import MAX_CLOCK_SKEW, MAX_VALUE_BYTES, MAX_WAIT_SECONDS, pack_items, sign_digest
from horovod.common.rendezvous_client import NAME_PATTERN as _NAME

REQUEST_SECONDS = 10.0          # a request's line, headers and body arrive within this, however slowly
MAX_UNAUTHENTICATED = 128       # connections waiting to authenticate at once; more are closed at once
_NONCE_SECONDS = 2 * MAX_CLOCK_SKEW + 60     # a nonce is kept longer than any request carrying it is accepted


class KVStore:
    """Scoped key/value store with a bounded wait for a key; thread-safe."""

    def __init__(self):
        self._data: Dict[str, Dict[str, bytes]] = {}
        self._changed = threading.Condition()
        self._nonces: Dict[str, float] = {}
        self._nonce_lock = threading.Lock()
        self._pruned = time.monotonic()

    def fresh_nonce(self, nonce: str) -> bool:
        """Whether ``nonce`` is new to this store (on any address serving it); it is remembered from now on.

        Nonces go only after :data:`_NONCE_SECONDS`, past which the request's clock is refused anyway.
        """
        now = time.monotonic()
        with self._nonce_lock:
            if nonce in self._nonces:
                return False
            if now - self._pruned > 60:
                self._nonces = {n: t for n, t in self._nonces.items() if now - t < _NONCE_SECONDS}
                self._pruned = now
            self._nonces[nonce] = now
            return True

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

    def get_all(self, scope: str, count: int, wait: float = 0.0) -> Optional[Dict[str, bytes]]:
        """Every key and value of ``scope`` once it holds at least ``count`` keys, waiting up to ``wait`` seconds;
        None if it did not fill in time."""
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                items = self._data.get(scope, {})
                remaining = deadline - time.monotonic()
                if len(items) >= count:
                    return dict(items)
                if remaining <= 0:
                    return None
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


def _number(query: Dict[str, List[str]], name: str) -> float:
    try:
        return float(query.get(name, ["0"])[0])
    except ValueError:
        return math.nan


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:  # silence the default stderr access log
        pass

    def handle_one_request(self) -> None:
        # Each request, on a kept-alive connection too, must arrive within REQUEST_SECONDS until it authenticates.
        self.server.arm(self.connection)
        try:
            super().handle_one_request()
        except (OSError, ValueError):
            self.close_connection = True     # the client hung up or was cut off by the deadline
        finally:
            self.server.disarm(self.connection)

    def _reply(self, code: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _refuse(self, code: int, text: bytes, headers: Optional[Dict[str, str]] = None) -> None:
        self.close_connection = True     # the body (if any) was not read: the connection is of no further use
        self._reply(code, text, headers)

    def _authentic(self, length: int) -> bool:
        """Check the signature from the headers alone (the body is read only after); replies when refused."""
        nonce = self.headers.get("X-Horovod-Nonce") or ""
        signature = self.headers.get("X-Horovod-Auth") or ""
        digest = self.headers.get("X-Horovod-Body-Digest") or ""
        stamp = self.headers.get("X-Horovod-Time") or ""
        expected = sign_digest(self.server.secret, self.command, self.path, nonce, digest, stamp)
        if not nonce or len(digest) != 64 or not hmac.compare_digest(signature, expected):
            self._refuse(403, b"forbidden")
            return False
        try:
            skew = float(stamp) - time.time()
        except ValueError:
            skew = math.inf
        if not abs(skew) <= MAX_CLOCK_SKEW:
            # Signed, but too old or too new for its nonce to be remembered: tell the client our clock.
            self._refuse(403, b"request clock out of range", {"X-Horovod-Time": f"{time.time():.3f}"})
            return False
        if not self.server.store.fresh_nonce(nonce):
            self._refuse(403, b"replayed request")
            return False
        return True

    def _parse(self) -> Optional[Tuple[List[str], Dict[str, List[str]], bytes]]:
        """Authenticate and split the request; replies and returns None when it is refused."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._refuse(400, b"bad Content-Length")
            return None
        if length < 0 or length > MAX_VALUE_BYTES:
            self._refuse(400, b"body too large")
            return None
        if not self._authentic(length):
            return None
        body = self.rfile.read(length) if length else b""
        if len(body) != length or not hmac.compare_digest(hashlib.sha256(body).hexdigest(),
                                                          self.headers.get("X-Horovod-Body-Digest", "")):
            self._refuse(403, b"body does not match its signed digest")
            return None
        self.server.disarm(self.connection)      # authenticated: a GET may now wait for its key
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
        if len(parts) == 2 and parts[0] == "all":
            wait, count = _number(query, "wait"), _number(query, "count")
            if not (math.isfinite(wait) and math.isfinite(count)):
                return self._reply(400, b"bad wait or count")
            items = self.server.store.get_all(parts[1], int(count), min(max(wait, 0.0), MAX_WAIT_SECONDS))
            return self._reply(404) if items is None else self._reply(200, pack_items(items))
        if len(parts) != 3 or parts[0] != "kv":
            return self._reply(400, b"expected /kv/<scope>/<key>")
        wait = _number(query, "wait")
        if not math.isfinite(wait):
            return self._reply(400, b"bad wait")
        value = self.server.store.get(parts[1], parts[2], min(max(wait, 0.0), MAX_WAIT_SECONDS))
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
        self._armed: Dict[socket.socket, float] = {}     # connections yet to authenticate -> their deadline
        self._armed_lock = threading.Lock()
        self._stopped = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="horovod-rendezvous-reaper", daemon=True)
        self._reaper.start()

    def process_request(self, request, client_address) -> None:
        with self._armed_lock:
            crowded = len(self._armed) >= MAX_UNAUTHENTICATED
        if crowded:
            self.shutdown_request(request)      # a flood of strangers: real clients retry within their deadline
            return
        self.arm(request)
        super().process_request(request, client_address)

    def arm(self, connection) -> None:
        """``connection`` must deliver its next request within REQUEST_SECONDS."""
        with self._armed_lock:
            self._armed[connection] = time.monotonic() + REQUEST_SECONDS

    def disarm(self, connection) -> None:
        """``connection`` authenticated its request (or is done)."""
        with self._armed_lock:
            self._armed.pop(connection, None)

    def _reap(self) -> None:
        """Cut connections that did not deliver an authentic request in time (trickling or silent strangers)."""
        while not self._stopped.wait(0.5):
            now = time.monotonic()
            with self._armed_lock:
                late = [c for c, deadline in self._armed.items() if deadline < now]
                for connection in late:
                    del self._armed[connection]
            for connection in late:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle_error(self, request, client_address) -> None:
        pass    # a client that hung up early, or garbage: nothing to report, the request is simply dropped

    def server_close(self) -> None:
        self._stopped.set()
        super().server_close()


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
