"""The rendezvous store and its client against hostile or broken peers (issue 19, item 6; tier unit).

Each test failed before its fix: the store read an unauthenticated body before checking the signature, kept silent
or trickling clients' threads for ever, printed a traceback per client that hung up early, spun on a signed
``wait=nan``, accepted a replay on a second listener of the same store; the client waited ~90 s on a store that
accepts and never answers, whatever its timeout. Also: shared-memory segment and wake-up names are keyed hashes that
reveal nothing without the secret.
"""

import contextlib
import socket
import threading
import time

import pytest

from horovod.common import rendezvous_admission, rendezvous_client
from horovod.common.exceptions import RendezvousError
from horovod.common.rendezvous_client import RendezvousClient, make_secret, signed_headers
from horovod.common.rendezvous_server import RendezvousServer
from horovod.transport import shm

pytestmark = [pytest.mark.unit, pytest.mark.timed]


@pytest.fixture
def server():
    with RendezvousServer(make_secret(), host="127.0.0.1") as srv:
        yield srv


def _request(port, method, path, body=b"", headers=None, timeout=10.0):
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    with sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in
                                                                      (headers or {}).items()) + "\r\n"
        sock.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        return int(data.split(b" ", 2)[1]) if data else None


def test_an_unauthenticated_body_is_never_read(server):
    # A forged request announcing 60 MiB is refused from its headers alone: the server answers before any body.
    started = time.monotonic()
    status = _request(server.port, "PUT", "/kv/job/k", b"",
                      {"Content-Length": str(60 << 20), "X-Horovod-Nonce": "n", "X-Horovod-Auth": "0" * 64,
                       "X-Horovod-Body-Digest": "0" * 64, "X-Horovod-Time": str(time.time())})
    assert status == 403
    assert time.monotonic() - started < 5


def test_silent_and_trickling_clients_are_cut_off_and_crowds_refused(server, monkeypatch):
    monkeypatch.setattr(rendezvous_admission, "REQUEST_SECONDS", 1.0)     # where connections are admitted
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    trickle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        started = time.monotonic()
        cut_after = None
        while time.monotonic() - started < 6:      # a byte every 0.3 s: each receive alone would never time out
            try:
                trickle.send(b"G")
                trickle.settimeout(0.3)
                if trickle.recv(1) == b"":
                    raise ConnectionResetError
            except socket.timeout:
                continue
            except OSError:
                cut_after = time.monotonic() - started
                break
        assert cut_after is not None and cut_after < 3, cut_after
        # The server hung up on the silent one too, within the request deadline (plus its half-second reaper).
        assert silent.recv(1) == b""
    finally:
        silent.close()
        trickle.close()
    # A crowd of silent connections: beyond MAX_UNAUTHENTICATED they are closed at once, and a real client still
    # gets through once the crowd is cut off.
    crowd = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(200)]
    try:
        client = RendezvousClient("127.0.0.1", server.port, server.secret, timeout=10)
        client.put("job", "k", b"v")
        assert client.get("job", "k") == b"v"
        assert threading.active_count() < 200 + 50
    finally:
        for sock in crowd:
            sock.close()


def test_a_client_hanging_up_early_prints_nothing(server, capsys):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"PUT /kv/job/k HTTP/1.1\r\nContent-Length: 100\r\n")
    time.sleep(0.5)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out


def test_a_signed_wait_of_nan_is_refused(server):
    path = "/kv/job/missing?wait=nan"
    status = _request(server.port, "GET", path, headers=signed_headers(server.secret, "GET", path))
    assert status == 400


def test_a_replay_on_another_address_of_the_same_store_is_refused(server):
    other = RendezvousServer(server.secret, host="127.0.0.1")
    other.store = server.store      # as RendezvousPool serves one job on several addresses
    other.start()
    try:
        headers = signed_headers(server.secret, "PUT", "/kv/job/k", b"one")
        assert _request(server.port, "PUT", "/kv/job/k", b"one", headers) == 200
        assert _request(other.port, "PUT", "/kv/job/k", b"one", headers) == 403
    finally:
        other.stop()


def test_a_request_older_than_the_nonce_memory_is_refused(server):
    # Nonces are forgotten after a while; a request signed with an old clock is refused, so no replay outlives them.
    headers = signed_headers(server.secret, "PUT", "/kv/job/k", b"old", clock_offset=-3600)
    assert _request(server.port, "PUT", "/kv/job/k", b"old", headers) == 403
    # A client whose clock is off learns the server's from the refusal, and gets through.
    client = RendezvousClient("127.0.0.1", server.port, server.secret, timeout=5)
    client._clock_offset = -3600
    client.put("job", "k", b"v")
    assert client.get("job", "k") == b"v"


def test_the_client_gives_up_within_its_timeout_on_a_store_that_never_answers(monkeypatch):
    # A get waits for its timeout plus the grace it gives a loaded server's answer (5 s); half a second shows the same.
    monkeypatch.setattr(rendezvous_client, "_REPLY_GRACE_SECONDS", 0.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])    # and never answer

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        client = RendezvousClient("127.0.0.1", listener.getsockname()[1], make_secret(), timeout=1)
        started = time.monotonic()
        with pytest.raises(RendezvousError):
            client.put("job", "k", b"v")
        assert time.monotonic() - started < 1 + 1      # its timeout (1 s, the least a request gets), and slack
        started = time.monotonic()
        with pytest.raises(RendezvousError):
            client.get("job", "k")
        assert time.monotonic() - started < 1 + 0.5 + 1
    finally:
        stop.set()
        thread.join(2)
        for sock in accepted:
            sock.close()
        listener.close()


def test_wake_up_and_segment_names_reveal_nothing_without_the_secret():
    secret = make_secret()
    token = shm.job_token(secret, "job.mesh.1")
    prefix = f"hvdpy-{token}-s0"
    wakes = [shm.wake_name(secret, prefix, rank) for rank in range(4)]
    segments = [shm.segment_name(secret, prefix, rank, generation) for rank in range(4) for generation in (1, 2)]
    names = wakes + segments
    assert len(set(names)) == len(names)
    assert all(name.startswith("hvdpy-") and token not in name for name in names)
    # The same fields under another secret give other names: nothing but the secret makes them.
    assert shm.segment_name(make_secret(), prefix, 0, 1) != shm.segment_name(secret, prefix, 0, 1)

