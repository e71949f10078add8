"""The Spark driver–agent link carries typed records, checked field by field where they arrive (issue 47, item 3;
tier unit: no Spark, the driver's agent server and a hand-made agent over a real socket)."""

import ast
import pathlib
import signal
import socket
import time

import pytest

import horovod
from horovod.common import wire
from horovod.runner.backends import spark_link
from horovod.runner.backends.spark import AGENT_PURPOSE, AgentServer
from horovod.runner.backends.spark_link import (DONE, FROM_AGENT, FROM_DRIVER, Done, Exit, Hello, Launch, Out,
                                                Signal, StartError, Started, decode)

pytestmark = pytest.mark.unit

RECORDS = [Hello(3, 1, "host-a-spark3.1", 4242, "/usr/bin/python3"), Started(4243), StartError("python: not found"),
           Out("stdout", b"line\n"), Out("stderr", b""), Exit(-9), Exit(0),
           Launch(("python", "-c", "pass"), {"HOROVOD_RANK": "0"}), Signal(int(signal.SIGTERM)), DONE]

WRONG = [
    (("hello", -1, 0, "h", 1, "py"), "hello", "index"), (("hello", 0, 0.0, "h", 1, "py"), "hello", "attempt"),
    (("hello", 0, 0, "", 1, "py"), "hello", "host"), (("hello", 0, 0, "h", 0, "py"), "hello", "pid"),
    (("hello", 0, 0, "h", 1, None), "hello", "python"), (("hello", True, 0, "h", 1, "py"), "hello", "index"),
    (("started", "12"), "started", "pid"), (("error", 3), "error", "text"),
    (("out", "stdin", b"x"), "out", "stream"), (("out", "stdout", "x"), "out", "data"),
    (("exit", "0"), "exit", "code"), (("exit", None), "exit", "code"),
    (("launch", (), {}), "launch", "argv"), (("launch", ["python"], {}), "launch", "argv"),
    (("launch", ("python", 1), {}), "launch", "argv"), (("launch", ("python",), {"A": 1}), "launch", "env"),
    (("launch", ("python",), [("A", "1")]), "launch", "env"), (("signal", 0), "signal", "sig"),
    (("signal", 1000), "signal", "sig"), (("signal", "TERM"), "signal", "sig"),
]


@pytest.mark.parametrize("record", RECORDS, ids=repr)
def test_every_record_round_trips_through_the_wire_codec(record):
    raw = wire.decode(wire.encode(record.to_wire()))
    assert raw[0] == record.KIND
    got = decode(raw)
    assert type(got) is type(record) and got == record
    assert type(record).from_wire(raw) == record
    assert decode(raw, *(FROM_AGENT if type(record) in FROM_AGENT else FROM_DRIVER)) == record


@pytest.mark.parametrize("raw, kind, field", WRONG, ids=repr)
def test_a_wrong_field_is_refused_naming_the_kind_and_the_field(raw, kind, field):
    with pytest.raises(ValueError, match=rf"malformed '{kind}' message: {field} is not"):
        decode(raw)


@pytest.mark.parametrize("raw", [("hello", 0, 0, "h", 1), ("started",), ("done", None), ("out", "stdout")], ids=repr)
def test_a_wrong_number_of_fields_is_refused(raw):
    with pytest.raises(ValueError, match=rf"malformed '{raw[0]}' message: \d+ fields, not \d+"):
        decode(raw)


@pytest.mark.parametrize("raw", [None, (), ["done"], ("bye",), (7,), "done"], ids=repr)
def test_what_is_no_known_message_is_refused(raw):
    with pytest.raises(ValueError, match="unknown kind"):
        decode(raw)


def test_each_end_takes_only_the_other_ends_kinds():
    with pytest.raises(ValueError, match=r"expected a 'launch' or 'signal' or 'done' message .* got 'exit'"):
        decode(Exit(0).to_wire(), *FROM_DRIVER)
    with pytest.raises(ValueError, match="got 'launch'"):
        decode(Launch(("x",), {}).to_wire(), *FROM_AGENT)
    with pytest.raises(ValueError, match="not a 'started' message"):
        Started.from_wire(Exit(0).to_wire())
    assert {cls.KIND for cls in FROM_AGENT + FROM_DRIVER} == set(spark_link._CHECKS)
    assert all(len(spark_link._CHECKS[cls.KIND]) == len(cls._fields) for cls in FROM_AGENT + FROM_DRIVER)
    assert Done() == DONE


def test_neither_end_reads_a_message_by_index():
    """The driver's server and the agent read the records' fields by name: no subscript of a decoded message."""
    package = pathlib.Path(horovod.__file__).resolve().parent
    for path in (package / "runner" / "backends" / "spark.py", package / "spark" / "task.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
                assert node.value.id != "message", f"{path}:{node.lineno} reads a link message by index"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "encode":
                assert isinstance(node.args[0], ast.Call) and node.args[0].func.attr == "to_wire", \
                    f"{path}:{node.lineno} sends something other than a record's to_wire()"


SECRET = b"k" * 32


def _agent(server: AgentServer, first: tuple) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    wire.handshake(sock, SECRET, 0, AGENT_PURPOSE, dialer=True)
    wire.send_frame(sock, wire.encode(first))
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while True:
            if not sock.recv(4096):     # the driver sends "done" on close; an agent it dropped reads EOF
                return True
    except OSError:
        return True


def test_the_driver_drops_an_agent_whose_message_is_malformed(caplog):
    server = AgentServer(SECRET, "127.0.0.1", handshake_timeout=10)
    try:
        bad = _agent(server, ("hello", 0, 0, "", 5, "py"))          # no host: refused before it counts
        assert _closed_by_peer(bad)
        assert server.history == []
        good = _agent(server, Hello(0, 0, "h", 5, "py").to_wire())
        assert server.wait_for(lambda agents: len(agents) == 1, 10)
        assert server.agents()[0].info.host == "h"
        wire.send_frame(good, wire.encode(("exit", "zero")))        # a malformed message: the agent is lost
        assert server.wait_for(lambda agents: agents == [], 10)
        deadline = time.monotonic() + 5
        while "code is not an int" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "malformed" in caplog.text and "code is not an int" in caplog.text
        good.close()
        bad.close()
    finally:
        server.close()
