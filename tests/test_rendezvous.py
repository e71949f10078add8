"""The rendezvous store: scoped key/value with bounded waits; every request authenticated (tier unit, in-process)."""

import hashlib
import http.client
import secrets
import threading

import time

import pytest

from horovod.common.exceptions import RendezvousError
from horovod.common.rendezvous_client import (RendezvousClient, make_secret, secret_from_hex, secret_to_hex,
                                              signed_headers)
from horovod.runner.rendezvous import KVStore, RendezvousServer

pytestmark = pytest.mark.unit


@pytest.fixture
def server():
    with RendezvousServer(make_secret(), host="127.0.0.1") as srv:
        yield srv


@pytest.fixture
def client(server):
    return RendezvousClient("127.0.0.1", server.port, server.secret, timeout=5)


def raw(server, method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def signed(secret, method, path, body=b"", nonce=None):
    return signed_headers(secret, method, path, body, nonce=nonce or secrets.token_hex(16))


def test_put_get_keys_delete(client):
    client.put("job", "rank.0", b"addr0")
    client.put("job", "rank.1", b"\x00\xff" * 1000)
    client.put("other", "rank.0", b"x")
    assert client.get("job", "rank.0") == b"addr0"
    assert client.get("job", "rank.1") == b"\x00\xff" * 1000
    assert client.keys("job") == ["rank.0", "rank.1"]
    client.delete("job", "rank.0")
    assert client.try_get("job", "rank.0") is None
    client.delete("job")
    assert client.keys("job") == []
    assert client.get("other", "rank.0") == b"x"


def test_get_waits_for_a_key_put_later(client):
    started = threading.Event()

    def put_later():
        started.wait(5)
        RendezvousClient(client.addr, client.port, client.secret).put("job", "late", b"here")

    thread = threading.Thread(target=put_later)
    thread.start()
    started.set()
    assert client.get("job", "late", timeout=10) == b"here"
    thread.join(5)


def test_get_times_out(client):
    with pytest.raises(RendezvousError, match="timed out"):
        client.get("job", "never", timeout=0.2)


def test_wrong_secret_is_refused(server, client):
    client.put("job", "k", b"v")
    intruder = RendezvousClient("127.0.0.1", server.port, make_secret())
    with pytest.raises(RendezvousError, match="403"):
        intruder.put("job", "k", b"evil")
    with pytest.raises(RendezvousError, match="403"):
        intruder.get("job", "k", timeout=1)
    with pytest.raises(RendezvousError, match="403"):
        intruder.delete("job")
    assert server.store.get("job", "k") == b"v"


def test_unauthenticated_and_badly_signed_requests_get_403(server):
    server.store.put("job", "k", b"v")
    assert raw(server, "PUT", "/kv/job/k", b"evil")[0] == 403
    assert raw(server, "DELETE", "/kv/job")[0] == 403
    assert raw(server, "GET", "/kv/job/k")[0] == 403
    headers = signed(server.secret, "PUT", "/kv/job/k", b"good")
    assert raw(server, "PUT", "/kv/job/k", b"evil", headers)[0] == 403  # body does not match signature
    headers = signed(server.secret, "PUT", "/kv/job/other", b"evil")
    assert raw(server, "PUT", "/kv/job/k", b"evil", headers)[0] == 403  # path does not match signature
    assert server.store.keys("job") == ["k"] and server.store.get("job", "k") == b"v"


def test_replayed_request_is_refused(server):
    headers = signed(server.secret, "PUT", "/kv/job/k", b"one")
    assert raw(server, "PUT", "/kv/job/k", b"one", headers)[0] == 200
    server.store.put("job", "k", b"two")
    assert raw(server, "PUT", "/kv/job/k", b"one", headers)[0] == 403
    assert server.store.get("job", "k") == b"two"


@pytest.mark.parametrize("method, path", [
    ("PUT", "/kv/job"),             # no key
    ("PUT", "/kv/job/k/extra"),     # too deep
    ("PUT", "/store/job/k"),        # unknown root
    ("PUT", "/kv/job/bad%20key"),   # name outside the allowed alphabet
    ("GET", "/kv/job/k?wait=soon"),  # wait not a number
    ("DELETE", "/keys/job"),
])
def test_malformed_requests_get_400_and_change_nothing(server, method, path):
    server.store.put("job", "k", b"v")
    status, _ = raw(server, method, path, b"x" if method == "PUT" else b"", signed(server.secret, method, path,
                                                                                    b"x" if method == "PUT" else b""))
    assert status == 400
    assert server.store.keys("job") == ["k"] and server.store.get("job", "k") == b"v"


def test_bad_content_length_gets_400(server):
    status, _ = raw(server, "PUT", "/kv/job/k", b"", {"Content-Length": "abc"})
    assert status == 400
    assert server.store.keys("job") == []


def test_kvstore_wait_is_bounded():
    store = KVStore()
    assert store.get("s", "k", wait=0.05) is None
    store.put("s", "k", b"1")
    assert store.get("s", "k", wait=5) == b"1"


def test_secret_hex_round_trip():
    secret = make_secret()
    assert len(secret) == 32 and secret_from_hex(secret_to_hex(secret)) == secret
    with pytest.raises(RendezvousError, match="hex"):
        secret_from_hex("not hex")
    assert hashlib.sha256(secret).digest() != hashlib.sha256(make_secret()).digest()


def _signed_request(secret, method, path, body=b""):
    from horovod.common.rendezvous_client import signed_headers
    headers = signed_headers(secret, method, path, body)
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body


@pytest.mark.serial
def test_a_thousand_workers_registering_at_once_cost_sockets_not_threads(server):
    """1,024 clients connect at once, each registers and waits for everyone's records in one request: every one is
    answered with all 1,024 records, from the server's one thread, with bounded memory."""
    import resource
    import selectors
    import socket
    import threading
    clients = 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * clients + 256:
        pytest.skip(f"needs {2 * clients + 256} open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * clients + 256), hard))
    threads_before = threading.active_count()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    selector = selectors.DefaultSelector()
    try:
        # Every client registers, then every client asks for all records: 1,024 waits parked at once.
        for phase in ("register", "gather"):
            pending = {}
            for worker in range(clients):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                sock.setblocking(False)
                if phase == "register":
                    request = _signed_request(server.secret, "PUT", f"/kv/load/{worker}", f"rank {worker}".encode())
                else:
                    request = _signed_request(server.secret, "GET", f"/all/load?count={clients}&wait=10")
                sock.sendall(request)
                pending[sock] = bytearray()
                selector.register(sock, selectors.EVENT_READ)
            answers = []
            deadline = time.monotonic() + 60
            while pending:
                assert time.monotonic() < deadline, f"{len(pending)} clients unanswered in the {phase} phase"
                assert threading.active_count() <= threads_before + 1
                for key, _ in selector.select(1.0):
                    chunk = key.fileobj.recv(1 << 20)
                    if chunk:
                        pending[key.fileobj] += chunk
                        continue
                    selector.unregister(key.fileobj)
                    answers.append(bytes(pending.pop(key.fileobj)))
                    key.fileobj.close()
            assert len(answers) == clients
            assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:40] for a in answers[:3]]
        from horovod.common.rendezvous_client import unpack_items
        items = unpack_items(answers[0].split(b"\r\n\r\n", 1)[1])
        assert items == {str(w): f"rank {w}".encode() for w in range(clients)}
    finally:
        selector.close()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 200, f"the server grew by {grown_mib:.0f} MiB"
