"""The Spark backend without Spark: agents (horovod.spark.task) in threads of this process, the driver's agent
server, worker handles as the supervisor drives them."""

import signal
import sys
import threading

import pytest

from horovod.common.exceptions import HorovodInternalError
from horovod.runner.backends.base import WorkerLaunch
from horovod.runner.backends.spark import AgentServer, SparkBackend
from horovod.runner.hosts import SlotInfo
from horovod.spark.task import AgentSpec, merge_env, run_agent

pytestmark = pytest.mark.unit

SECRET = b"s" * 32


@pytest.fixture
def server():
    server = AgentServer(SECRET, "127.0.0.1", handshake_timeout=10)
    yield server
    server.close()


def start_agent(server, index=0, secret=SECRET):
    box = {}

    def target():
        try:
            box["code"] = run_agent(AgentSpec("127.0.0.1", server.port, secret, timeout=10), index, 0, "hostA")
        except BaseException as exc:  # noqa: B902 — checked by the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def launch(server, code, index=0):
    assert server.wait_for(lambda agents: len(agents) > index, 10)
    slot = SlotInfo("hostA", 0, 0, 0, 1, 1, 1)
    backend = SparkBackend(lambda _: server.agents()[index], start_timeout=10)
    return backend.start([WorkerLaunch(slot, ("python", "-c", code), {"HOROVOD_RANK": "0"})], 5.0)[0]


def test_worker_output_and_exit_status_come_back(server):
    thread, box = start_agent(server)
    handle = launch(server, "import os, sys; print('hello', os.environ['HOROVOD_RANK']); sys.exit(3)")
    assert handle.stdout.readline() == b"hello 0\n"
    assert handle.wait(10) == 3
    handle.release()
    thread.join(10)
    assert box == {"code": 3}
    assert server.history[0].host == "hostA" and server.history[0].python == sys.executable


def test_signal_reaches_the_worker_and_a_lost_agent_counts_as_killed(server):
    thread, box = start_agent(server)
    handle = launch(server, "import time; time.sleep(60)")
    assert handle.poll() is None
    handle.signal(signal.SIGTERM)
    assert handle.wait(10) == -signal.SIGTERM
    handle.release()
    thread.join(10)
    # The server learns of agent 0's end from its connection, after the agent's thread is done: wait for that, so
    # that agent 1 is the only one connected.
    assert server.wait_for(lambda agents: agents == [], 10)
    thread, box = start_agent(server, index=1)
    handle = launch(server, "import time; time.sleep(60)", index=0)
    server.agents()[0].sock.shutdown(2)  # the agent's connection ends, as when its process dies
    assert handle.wait(10) == -signal.SIGKILL
    thread.join(10)
    assert not thread.is_alive()


def test_an_agent_with_the_wrong_secret_is_refused(server):
    thread, box = start_agent(server, secret=b"x" * 32)
    thread.join(10)
    assert isinstance(box.get("error"), (HorovodInternalError, ConnectionError, OSError))
    assert server.agents() == []


def test_merge_env_keeps_the_tasks_environment_and_drops_inherited_launcher_variables():
    env = merge_env({"PATH": "/bin", "PYTHONPATH": "/task", "HOROVOD_RANK": "7", "HOROVOD_SECRET_KEY": "old"},
                    {"HOROVOD_SIZE": "2", "PYTHONPATH": "/driver"})
    assert env == {"PATH": "/bin", "HOROVOD_SIZE": "2", "PYTHONPATH": "/driver:/task"}
