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

One thread serves every connection from a selector (no thread per client: a job of a thousand workers registering
at once, or a crowd of strangers, costs sockets, not threads). A request whose key is not there yet is parked,
without a thread, until a change to the store answers it or its wait runs out. Strangers are bounded: a request
(line, headers, body) must arrive within :data:`REQUEST_SECONDS` in all, and at most :data:`MAX_UNAUTHENTICATED`
connections that connected over a second ago may be waiting to authenticate at once: past that the *oldest* is
closed, not the newcomer, so a crowd holding connections delays a real client by nothing, and a thousand workers
connecting in the same second are all heard. Descriptors are bounded too (:mod:`horovod.common.descriptors`): the
store raises its soft limit to the hard one, holds at most the limit less a reserve for the rest of its process,
and when it is full, or ``accept`` fails for want of descriptors, the oldest stranger is closed whatever its age;
with none to close the listener rests for a moment instead of spinning, and :attr:`RendezvousServer.exhausted`
says what could not be done and how to raise the limit.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import http
import math
import re
import selectors
import socket
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Tuple

from horovod.common.descriptors import raise_descriptor_limit, reserve
from horovod.common.kvstore import KVStore
from horovod.common.rendezvous_admission import MAX_UNAUTHENTICATED, REQUEST_SECONDS, Admission, Conn
from horovod.common.rendezvous_client import MAX_CLOCK_SKEW, MAX_VALUE_BYTES, MAX_WAIT_SECONDS, pack_items, sign_digest
from horovod.common.rendezvous_client import NAME_PATTERN as _NAME

__all__ = ["KVStore", "RendezvousServer", "REQUEST_SECONDS", "MAX_UNAUTHENTICATED"]

_MAX_HEAD_BYTES = 64 * 1024
_MAX_LINE_BYTES = 8 * 1024
_KNOWN_CODES = frozenset(status.value for status in http.HTTPStatus)
_REQUEST_LINE = re.compile(rb"^[A-Z]{1,16} /[!-~]* HTTP/1\.[01]\r$")
_METHOD_SO_FAR = re.compile(rb"^(?:[A-Z]{1,16} |[A-Z]{0,16}$)")      # what a request's first bytes can be


def _number(query: Dict[str, List[str]], name: str) -> float:
    try:
        return float(query.get(name, ["0"])[0])
    except ValueError:
        return math.nan


class _Loop(Admission):
    """The server's thread: accept, read, authenticate, answer or park, write, close (one request a connection)."""

    def __init__(self, listener: socket.socket, secret: bytes, store: KVStore):
        self.listener, self.secret, self.store = listener, secret, store
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        for sock in (listener, self.wake_r, self.wake_w):
            sock.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.unauthenticated: "collections.OrderedDict[Conn, None]" = collections.OrderedDict()
        self.parked: Dict[Conn, None] = {}
        self.stopped = False
        soft = raise_descriptor_limit()
        self.budget = max(16, soft - reserve(soft))     # connections the loop holds at most (selector's included)
        self.resume_at: Optional[float] = None          # listening again then, after running out of descriptors
        self.exhausted: Optional[str] = None            # what running out of descriptors stopped, once it did
        store.on_change(self.wake)

    def wake(self) -> None:
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    def run(self) -> None:
        while not self.stopped:
            deadlines = [c.deadline for c in self.unauthenticated] + [c.waiting[0] for c in self.parked]
            deadlines += [self.resume_at] if self.resume_at is not None else []
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            for key, events in self.selector.select(timeout):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is self.wake_r:
                    try:
                        while self.wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                else:
                    self._serve(key.data, events)
            self._answer_parked()
            self._resume()
            now = time.monotonic()
            for conn in [c for c in self.unauthenticated if c.deadline <= now]:
                self._close(conn)       # silent or trickling: cut off at the request deadline
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, Conn):
                self._close(key.data)
        self.selector.close()
        self.wake_r.close()
        self.wake_w.close()

    def _serve(self, conn: Conn, events: int) -> None:
        """Move one connection on; whatever a client sends, it may cost its own connection, never the loop."""
        try:
            if events & selectors.EVENT_WRITE:
                self._write(conn)
            else:
                self._read(conn)
        except Exception:  # a request no rule foresaw: drop it, serve the others
            self._close(conn)

    def _close(self, conn: Conn) -> None:
        self.unauthenticated.pop(conn, None)
        self.parked.pop(conn, None)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: Conn) -> None:
        try:
            chunk = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            return self._close(conn)    # hung up (a parked client gave up, or a stranger left)
        if conn.waiting is not None:
            return                      # one request a connection: anything after it is ignored
        conn.inbox += chunk
        if conn.head is None:
            end = conn.inbox.find(b"\r\n\r\n")
            if end < 0:
                line_end = conn.inbox.find(b"\n")
                if len(conn.inbox) > _MAX_HEAD_BYTES or (line_end < 0 and len(conn.inbox) > _MAX_LINE_BYTES):
                    self._reply(conn, 400, b"request head too large")
                elif (line_end >= 0 and not _REQUEST_LINE.match(bytes(conn.inbox[:line_end]))) \
                        or not _METHOD_SO_FAR.match(bytes(conn.inbox[:17])):
                    self._reply(conn, 400, b"malformed request line")     # garbage: answered at once
                return
            if not self._parse_head(conn, bytes(conn.inbox[:end]).decode("latin-1")):
                return
            del conn.inbox[:end + 4]
        if len(conn.inbox) >= conn.length:
            self._dispatch(conn, bytes(conn.inbox[:conn.length]))

    def _parse_head(self, conn: Conn, text: str) -> bool:
        """Parse and authenticate the request line and headers; replies and returns False when refused."""
        lines = text.split("\r\n")
        words = lines[0].split(" ")
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            self._reply(conn, 400, b"malformed request line")
            return False
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        method, path = words[0], words[1]
        if method not in ("GET", "PUT", "DELETE"):
            self._reply(conn, 501, b"unsupported method")
            return False
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            self._reply(conn, 400, b"bad Content-Length")
            return False
        if length < 0 or length > MAX_VALUE_BYTES:
            self._reply(conn, 400, b"body too large")
            return False
        nonce, signature = headers.get("x-horovod-nonce", ""), headers.get("x-horovod-auth", "")
        digest, stamp = headers.get("x-horovod-body-digest", ""), headers.get("x-horovod-time", "")
        expected = sign_digest(self.secret, method, path, nonce, digest, stamp)
        if not nonce or len(digest) != 64 or not hmac.compare_digest(signature.encode("latin-1"), expected.encode()):
            self._reply(conn, 403, b"forbidden")
            return False
        try:
            skew = float(stamp) - time.time()
        except ValueError:
            skew = math.inf
        if not abs(skew) <= MAX_CLOCK_SKEW:
            # Signed, but too old or too new for its nonce to be remembered: tell the client our clock.
            self._reply(conn, 403, b"request clock out of range", {"X-Horovod-Time": f"{time.time():.3f}"})
            return False
        if not self.store.fresh_nonce(nonce):
            self._reply(conn, 403, b"replayed request")
            return False
        conn.head, conn.length = (method, path, headers), length
        return True

    def _dispatch(self, conn: Conn, body: bytes) -> None:
        method, path, headers = conn.head
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest().encode(),
                                   headers.get("x-horovod-body-digest", "").encode("latin-1")):
            return self._reply(conn, 403, b"body does not match its signed digest")
        self.unauthenticated.pop(conn, None)     # authenticated: a GET may now wait for its key
        url = urllib.parse.urlsplit(path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if not parts or not all(_NAME.match(p) for p in parts):
            return self._reply(conn, 400, b"malformed path")
        query = urllib.parse.parse_qs(url.query)
        store = self.store
        if method == "PUT":
            if len(parts) != 3 or parts[0] != "kv":
                return self._reply(conn, 400, b"expected /kv/<scope>/<key>")
            store.put(parts[1], parts[2], body)
            return self._reply(conn, 200)
        if method == "DELETE":
            if parts[0] != "kv" or len(parts) not in (2, 3):
                return self._reply(conn, 400, b"expected /kv/<scope>[/<key>]")
            store.delete(parts[1], parts[2] if len(parts) == 3 else None)
            return self._reply(conn, 200)
        if len(parts) == 2 and parts[0] == "keys":
            return self._reply(conn, 200, "\n".join(store.keys(parts[1])).encode())
        wait = _number(query, "wait")
        if len(parts) == 2 and parts[0] == "all":
            count = _number(query, "count")
            if not (math.isfinite(wait) and math.isfinite(count)):
                return self._reply(conn, 400, b"bad wait or count")
            scope, need = parts[1], int(count)

            def answer() -> Optional[Tuple[int, bytes]]:
                items = store.peek_all(scope, need)
                return None if items is None else (200, pack_items(items))
        elif len(parts) == 3 and parts[0] == "kv":
            if not math.isfinite(wait):
                return self._reply(conn, 400, b"bad wait")
            scope, key = parts[1], parts[2]

            def answer() -> Optional[Tuple[int, bytes]]:
                value = store.get(scope, key)
                return None if value is None else (200, value)
        else:
            return self._reply(conn, 400, b"expected /kv/<scope>/<key>")
        now = answer()
        if now is not None:
            return self._reply(conn, *now)
        conn.waiting = (time.monotonic() + min(max(wait, 0.0), MAX_WAIT_SECONDS), answer)
        self.parked[conn] = None

    def _answer_parked(self) -> None:
        now = time.monotonic()
        for conn in list(self.parked):
            deadline, answer = conn.waiting
            reply = answer()
            if reply is not None or deadline <= now:
                del self.parked[conn]
                self._reply(conn, *(reply or (404, b"")))

    def _reply(self, conn: Conn, code: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> None:
        """Answer and close after the last byte (one request a connection; a refused body is never read)."""
        self.unauthenticated.pop(conn, None)
        conn.waiting = conn.waiting or (math.inf, lambda: None)     # reads from now on are ignored
        reason = http.HTTPStatus(code).phrase if code in _KNOWN_CODES else ""
        head = [f"HTTP/1.1 {code} {reason}", f"Content-Length: {len(body)}", "Connection: close"]
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        conn.outbox += ("\r\n".join(head) + "\r\n\r\n").encode() + body
        self.selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(conn)
        del conn.outbox[:sent]
        if not conn.outbox:
            self._close(conn)


class RendezvousServer:
    """Serves a :class:`KVStore` over authenticated HTTP on an ephemeral port, from one daemon thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, secret: bytes, host: str = "0.0.0.0", port: int = 0):
        self.secret = secret
        self.store = KVStore()
        self._address = (host, port)
        self._listener: Optional[socket.socket] = None
        self._loop: Optional[_Loop] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> int:
        """Start serving; returns the port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._address)
        listener.listen(4096)
        self._listener = listener
        self._loop = _Loop(listener, self.secret, self.store)
        self._thread = threading.Thread(target=self._loop.run, name="horovod-rendezvous", daemon=True)
        self._thread.start()
        return self.port

    @property
    def port(self) -> int:
        """The port the server listens on (after :meth:`start`)."""
        assert self._listener is not None, "server not started"
        return self._listener.getsockname()[1]

    @property
    def exhausted(self) -> Optional[str]:
        """Why the store could not take a connection for want of descriptors, or None while it never ran out."""
        return self._loop.exhausted if self._loop is not None else None

    def stop(self) -> None:
        """Stop serving and close the listening socket; a server never started is fine."""
        if self._loop is not None:
            self._loop.stopped = True
            self.store.forget_listener(self._loop.wake)
            self._loop.wake()
            self._thread.join(5.0)
            self._listener.close()
            self._loop = None

    def __enter__(self) -> "RendezvousServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
