"""Local launch: worker environment (tier unit), fail-fast, signal forwarding and no orphans (tiers cli and ranks)."""

import io
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from horovod.common.config import environ_snapshot
from horovod.runner.hosts import HostInfo, get_host_assignments
from horovod.runner.pipeline import LaunchConfig, package_pythonpath, plan_launches, worker_env
from horovod.runner.output import OutputSink
from horovod.runner.procgroup import ProcessHandle, start_session
from horovod.runner.rendezvous import RendezvousInfo
from horovod.runner.supervisor import Supervisor, WorkerExit, failure_message
from horovod.testing.fixtures import live_processes


@pytest.mark.unit
def test_worker_env_overrides_inherited_topology():
    slot = get_host_assignments([HostInfo("localhost", 4)], 4)[2]
    base = {"PATH": "/bin", "HOROVOD_RANK": "9", "HOROVOD_RENDEZVOUS_SCOPE": "stale", "HOROVOD_SECRET_KEY": "00"}
    env = worker_env(base, slot, RendezvousInfo("127.0.0.1", 4321, b"\x01\xff"), {"HOROVOD_CYCLE_TIME": "2"})
    assert env == {"PATH": "/bin", "HOROVOD_CYCLE_TIME": "2", "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4",
                   "HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "4", "HOROVOD_CROSS_RANK": "0",
                   "HOROVOD_CROSS_SIZE": "1", "HOROVOD_HOSTNAME": "localhost",
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321",
                   "HOROVOD_SECRET_KEY": "01ff", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
                   "PYTHONUNBUFFERED": "1", "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2",
                   "LOCAL_WORLD_SIZE": "4", "TF_CPP_MIN_LOG_LEVEL": "1"}   # (TensorFlow's INFO off: runner/noise.py)
    assert base["HOROVOD_RANK"] == "9"  # the input is not modified
    scoped = worker_env({}, slot, RendezvousInfo("h", 1, b"", scope="job7"))
    assert scoped["HOROVOD_RENDEZVOUS_SCOPE"] == "job7"


@pytest.mark.unit
def test_plan_launches_one_per_slot():
    slots = tuple(get_host_assignments([HostInfo("localhost", 3)], 3))
    launches = plan_launches(LaunchConfig(("python", "x.py"), slots), RendezvousInfo("127.0.0.1", 1, b"k"),
                             {"A": "1"})
    assert [(s.rank, s.hostname, s.command, s.env["A"], s.env["HOROVOD_RANK"]) for s in launches] == [
        (r, "localhost", ("python", "x.py"), "1", str(r)) for r in range(3)]


@pytest.mark.unit
def test_failure_message_names_rank_host_and_code():
    text = failure_message(WorkerExit(2, "localhost", 17))
    assert text.startswith("Horovod detected that one or more processes exited with non-zero status")
    assert "Process name: 2\nHost: localhost\nExit code: 17\n" in text
    assert "killed by SIGKILL" in failure_message(WorkerExit(0, "h", -9))
    assert WorkerExit(0, "h", -15).describe() == "signal SIGTERM"


# A worker that records its pid (and rank 0 a grandchild's), meets the others through the rendezvous store, then
# rank 1 exits with 17 while the others sleep: fail-fast must stop them and their process groups.
FAIL_FAST_WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    from horovod.common.config import load_config
    from horovod.runner.run_task import client_from_env
    rank, size = load_config().rank, load_config().size
    piddir = sys.argv[1]
    pids = [os.getpid()]
    if rank == 0:
        pids.append(subprocess.Popen(["sleep", "60"]).pid)
    with open(os.path.join(piddir, f"pids.{rank}"), "w") as f:
        f.write(" ".join(map(str, pids)))
    client = client_from_env()
    client.put("test", f"ready.{rank}", b"1")
    if rank == 1:
        for other in range(size):
            client.get("test", f"ready.{other}", timeout=20)
        os._exit(17)
    time.sleep(60)
""")


def _recorded_pids(piddir):
    return [int(p) for name in os.listdir(piddir) for p in (piddir / name).read_text().split()]


@pytest.mark.timed
@pytest.mark.cli
def test_fail_fast_names_rank_and_code_and_leaves_nothing(tmp_path, horovodrun):
    script = tmp_path / "worker.py"
    script.write_text(FAIL_FAST_WORKER)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    start = time.monotonic()
    proc = horovodrun(["-np", "3", sys.executable, str(script), str(piddir)], timeout=30)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert elapsed < 10, elapsed
    assert "Horovod detected that one or more processes exited with non-zero status" in proc.stderr
    assert "Process name: 1" in proc.stderr and "Exit code: 17" in proc.stderr and "Host: localhost" in proc.stderr
    pids = _recorded_pids(piddir)
    assert len(pids) == 4
    assert live_processes(pids) == []


def _read_lines(stream, out_queue):
    for line in stream:
        out_queue.put(line)
    out_queue.put(None)


SLEEPER = ("import os, time; print('ready', os.getpid(), flush=True); time.sleep(60)")


@pytest.mark.cli
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_horovodrun_stops_every_worker(sig):
    env = {**environ_snapshot(), **package_pythonpath()}
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", "2", sys.executable, "-c", SLEEPER],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        lines: "queue.Queue" = queue.Queue()
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
        pids = [int(lines.get(timeout=20).split()[-1]) for _ in range(2)]
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 128 + sig
        assert live_processes(pids) == []
        assert f"received {signal.Signals(sig).name}" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _start(supervisor, commands):
    for rank, command in enumerate(commands):
        supervisor.add(rank, "localhost", ProcessHandle(start_session(command, environ_snapshot())))


class _RecordingSink(OutputSink):
    def __init__(self, size):
        super().__init__(size, io.StringIO(), io.StringIO())
        self.lines: "queue.Queue" = queue.Queue()

    def write(self, rank, stream, line, end="\n"):
        super().write(rank, stream, line, end)
        self.lines.put((rank, stream, line))


@pytest.mark.timed
@pytest.mark.ranks
def test_worker_ignoring_sigterm_is_killed_after_grace():
    code = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(os.getpid(), flush=True); time.sleep(60)")
    sink = _RecordingSink(1)
    with Supervisor(sink, grace_seconds=0.3, log=lambda text: None) as group:
        _start(group, [(sys.executable, "-c", code)])
        rank, stream, line = sink.lines.get(timeout=20)
        start = time.monotonic()
        result = group.wait(timeout=0)
        assert time.monotonic() - start < 5
    assert result.timed_out and not result.ok and result.exit_code == 1
    assert result.exits == (WorkerExit(0, "localhost", -signal.SIGKILL),)
    assert live_processes([int(line)]) == []


@pytest.mark.ranks
def test_worker_killed_by_signal_is_the_first_failure():
    commands = [(sys.executable, "-c", "import time; time.sleep(60)"),
                (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)")]
    messages = []
    with Supervisor(_RecordingSink(2), grace_seconds=2, log=messages.append) as group:
        _start(group, commands)
        result = group.wait(timeout=30)
    assert result.first_failure == WorkerExit(1, "localhost", -9)
    assert result.exits[0].returncode == -signal.SIGTERM
    assert "Process 1 exit with status code -9." in messages
    assert live_processes(group.pids) == []


@pytest.mark.ranks
def test_survivors_get_the_settle_time_to_report_their_own_error(tmp_path):
    # Rank 1 fails; rank 0 learns of it (end of file on a pipe rank 1 held, as a rank sees a peer's connection close)
    # and takes half a second to report, as a survivor of a lost host takes up to one keepalive probe longer than
    # another: its own exit code must be what ends it, not the launcher's SIGTERM.
    fifo = str(tmp_path / "link")
    os.mkfifo(fifo)
    survivor = f"import sys, time; open({fifo!r}).read(); time.sleep(0.5); sys.exit(5)"
    failing = f"import os; open({fifo!r}, 'w'); os._exit(3)"
    with Supervisor(_RecordingSink(2), grace_seconds=2, log=lambda text: None, settle_seconds=3) as group:
        _start(group, [(sys.executable, "-c", survivor), (sys.executable, "-c", failing)])
        result = group.wait(timeout=30)
    assert result.first_failure == WorkerExit(1, "localhost", 3)
    assert result.exits[0].returncode == 5


@pytest.mark.unit
def test_settle_time_follows_the_workers_liveness_timeout():
    from horovod.runner.pipeline import settle_seconds
    slots = tuple(get_host_assignments([HostInfo("localhost", 1)], 1))
    assert settle_seconds(LaunchConfig(("true",), slots)) == 2.0
    assert settle_seconds(LaunchConfig(("true",), slots, extra_env={"HOROVOD_LIVENESS_TIMEOUT": "60"})) == 7.0


@pytest.mark.cli
@pytest.mark.parametrize("case", ["missing script", "syntax error"])
def test_a_failure_before_init_is_summarised_with_what_python_said(tmp_path, horovodrun, case):
    script = tmp_path / "train.py"
    if case == "syntax error":
        script.write_text("import horovod.numpy as hvd\nhvd.init(\n")
    proc = horovodrun(["-np", "2", sys.executable, str(script)], timeout=60)
    assert proc.returncode != 0
    said = "can't open file" if case == "missing script" else "SyntaxError: '(' was never closed"
    root = [line for line in proc.stderr.splitlines() if line.startswith("Root cause: rank ")]
    assert len(root) == 1 and said in root[0], proc.stderr[-3000:]
    assert "Root cause, rank" in proc.stderr, proc.stderr[-3000:]
