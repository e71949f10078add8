"""A job nobody else can join: strangers refused on the rendezvous and on a worker's data port while the mesh forms,
the job unharmed; the secret on no command line; garbled and oversized frames rejected (tiers unit and ranks)."""

import http.client
import io
import os
import pickle
import random
import socket
import struct
import sys
import textwrap
import threading

import pytest

from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.runner.hosts import HostInfo, get_host_assignments
from horovod.runner.launch import LaunchConfig, launch_local, package_pythonpath
from horovod.runner.rendezvous import rendezvous_service
from horovod.transport.mesh import PURPOSE_MESH

WORKER = textwrap.dedent("""
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.config import load_config
    from horovod.runner.run_task import client_from_env
    if load_config().rank == 1:  # rank 1 joins only when the test says: rank 0 listens meanwhile
        client_from_env().get("test", "go", timeout=60)
    hvd.init()
    total = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum)
    assert total.tolist() == [3.0, 3.0, 3.0], total
    print("OK", hvd.rank())
    hvd.shutdown()
""")


def _http(port, method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _recv_all(sock):
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:  # closed with our bytes unread: a reset instead of an end of stream
            return data
        if not chunk:
            return data
        data += chunk


def _strangers_at_data_port(host, port):
    socket.create_connection((host, port), timeout=5).close()  # connect and leave
    with socket.create_connection((host, port), timeout=10) as sock:  # garbage, a lot of it
        try:
            sock.sendall(os.urandom(1 << 20))
        except OSError:
            pass  # dropped mid-way: fine
    with socket.create_connection((host, port), timeout=10) as sock:  # a well-formed hello, then a guessed proof
        sock.sendall(struct.pack("!8s16sii", wire.MAGIC, os.urandom(16), 1, PURPOSE_MESH) + os.urandom(32))
        answer = _recv_all(sock)
    # Rank 0 sent its hello and hung up without its own proof: a stranger learns nothing computed with the secret.
    assert len(answer) == struct.calcsize("!8s16sii"), answer
    with socket.create_connection((host, port), timeout=10) as sock:  # an oversized "frame"
        sock.sendall(struct.pack("!I", 0xFFFFFFFF) + b"x" * 64)
        assert _recv_all(sock)[:8] in (wire.MAGIC, b"")


@pytest.mark.ranks
def test_strangers_are_refused_while_the_mesh_forms_and_the_job_carries_on(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    slots = tuple(get_host_assignments([HostInfo("localhost", 2)], 2))
    launch = LaunchConfig((sys.executable, str(script)), slots, extra_env=package_pythonpath())
    out, err = io.StringIO(), io.StringIO()
    with rendezvous_service() as (server, rendezvous):
        result = {}
        job = threading.Thread(target=lambda: result.update(r=launch_local(launch, rendezvous, out, err, timeout=90)))
        job.start()
        try:
            published = server.store.get("job.mesh.1", "0", wait=60)
            assert published is not None, err.getvalue()
            address = published.decode().split(" ")[0]
            host, port = address.rsplit(":", 1)
            # The rendezvous: no signature, a wrong one, a rewrite of rank 0's address, raw garbage.
            assert _http(rendezvous.port, "GET", "/kv/job.mesh.1/0")[0] == 403
            forged = {"X-Horovod-Nonce": "n1", "X-Horovod-Auth": "0" * 64}
            assert _http(rendezvous.port, "PUT", "/kv/job.mesh.1/0", b"6.6.6.6:1", forged)[0] == 403
            assert _http(rendezvous.port, "GET", "/kv/job.mesh.1/0?wait=0", headers=forged)[0] == 403
            with socket.create_connection(("127.0.0.1", rendezvous.port), timeout=5) as sock:
                sock.sendall(os.urandom(4096) + b"\r\n\r\n")
            assert server.store.get("job.mesh.1", "0") == published
            # The data port of rank 0, waiting for rank 1.
            _strangers_at_data_port(host, int(port))
            # No command line shows the secret.
            secret = rendezvous.secret.hex()
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        assert secret.encode() not in handle.read(), f"secret on the command line of pid {pid}"
                except OSError:
                    pass
        finally:
            server.store.put("test", "go", b"1")
            job.join(120)
    assert not job.is_alive()
    assert result["r"].ok, err.getvalue()
    assert sorted(line for line in out.getvalue().splitlines() if "OK" in line) == ["[0]<stdout>:OK 0",
                                                                                   "[1]<stdout>:OK 1"]


@pytest.mark.unit
@pytest.mark.parametrize("payload", [
    b"", b"\x00" * 7, random.Random(64).randbytes(64), b"\x80\x05garbage",    # seeded: parallel runners agree
    pickle.dumps(ValueError("a class")),  # names a class: refused, nothing is imported or called
    pickle.dumps(socket.AF_INET),
])
def test_garbled_control_messages_raise_one_clear_error(payload):
    with pytest.raises(HorovodInternalError, match="garbled control message"):
        wire.decode(payload)


@pytest.mark.unit
def test_oversized_frame_is_refused_before_allocation():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(struct.pack("!I", wire.MAX_CONTROL_BYTES + 1))
        with pytest.raises(HorovodInternalError, match="exceeds"):
            wire.recv_frame(right)


def _handshake_pair(dialer_secret, acceptor_secret, dialer_rank=1, acceptor_rank=0):
    left, right = socket.socketpair()
    left.settimeout(5)
    right.settimeout(5)
    outcome = {}

    def accept():
        try:
            outcome["acceptor"] = wire.handshake(right, acceptor_secret, acceptor_rank, 1, dialer=False)
        except (HorovodInternalError, OSError) as exc:
            outcome["acceptor"] = exc
        finally:
            right.close()

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        outcome["dialer"] = wire.handshake(left, dialer_secret, dialer_rank, 1, dialer=True)
    except (HorovodInternalError, OSError) as exc:
        outcome["dialer"] = exc
    finally:
        left.close()
        thread.join(10)
    return outcome


@pytest.mark.unit
def test_handshake_both_ways():
    assert _handshake_pair(b"k" * 32, b"k" * 32) == {"dialer": 0, "acceptor": 1}
    wrong = _handshake_pair(b"k" * 32, b"x" * 32)
    assert isinstance(wrong["acceptor"], HorovodInternalError)
    assert isinstance(wrong["dialer"], (HorovodInternalError, ConnectionError, OSError))


@pytest.mark.unit
def test_a_proof_cannot_be_reflected():
    # The acceptor's proof, computed for the dialer's nonce, is not what an acceptor expects from a dialer with the
    # same nonces: the roles are bound into the proof (a stranger cannot relay one rank's answer to another).
    secret, a, b = b"s" * 32, b"A" * 16, b"B" * 16
    assert wire.proof(secret, b"A", a, b, 1, 0, 1) != wire.proof(secret, b"D", a, b, 1, 0, 1)
    assert wire.proof(secret, b"D", a, b, 1, 0, 1) != wire.proof(secret, b"D", a, b, 2, 0, 1)
