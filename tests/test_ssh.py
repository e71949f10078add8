"""ssh launch pieces: command lines, host-check verdicts, the payload, and the remote bootstrap stopping its worker
when the launcher's connection ends (tier unit; the bootstrap runs locally, ssh replaced by a pipe)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from horovod.runner.rendezvous import plan_rendezvous, remote_hosts
from horovod.runner.network import NetworkError, bind_addresses, route_source
from horovod.runner.ssh import SshConfig, boot_command, explain_check, remote_env, ssh_argv
from horovod.runner.ssh_boot import PayloadError, make_payload, parse_payload
from horovod.testing.fixtures import process_alive

pytestmark = pytest.mark.unit
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ssh_argv_user_options_first_then_batch_mode_port_identity():
    ssh = SshConfig(port=2222, identity_file="/k", extra_args=("-o", "StrictHostKeyChecking=no"), timeout=7.5)
    argv = ssh_argv(ssh, "node1", "exec true")
    assert argv[:3] == ["ssh", "-o", "StrictHostKeyChecking=no"]  # ssh keeps the first value of an option
    assert "BatchMode=yes" in argv and "ConnectTimeout=8" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k"
    assert argv[-2:] == ["node1", "exec true"]
    assert SshConfig.from_values(None, None, "-o 'A=b c'", 3).extra_args == ("-o", "A=b c")


def test_boot_command_is_quoted_and_carries_no_environment():
    command = boot_command(SshConfig(python="/opt/my python/bin/python"), "--rank", "3")
    assert command.startswith("exec env PYTHONPATH=")
    assert "'/opt/my python/bin/python' -m horovod.runner.ssh_boot --rank 3" in command


def test_remote_env_leaves_host_specific_variables_to_the_remote_login():
    env = {"PATH": "/venv/bin", "HOME": "/root", "SSH_CONNECTION": "x", "HOROVOD_SECRET_KEY": "ab",
           "BASH_FUNC_f%%": "() { :; }", "PYTHONPATH": "/src"}
    assert remote_env(env) == {"PATH": "/venv/bin", "HOROVOD_SECRET_KEY": "ab", "PYTHONPATH": "/src"}


@pytest.mark.parametrize("code, out, err, expected", [
    (0, json.dumps({"reachable": {"1.2.3.4:5": True}}), "", None),
    (255, "", "ssh: connect to host h port 22: Connection refused\n", "ssh failed: ssh: connect to host h port 22: "
                                                                       "Connection refused"),
    (255, "", "Host key verification failed.\n", "ssh-keyscan"),
    (255, "", "root@h: Permission denied (publickey).\n", "Permission denied (publickey)"),
    (None, "", "", "no answer over ssh within 9 s"),
    (1, "", "/usr/bin/python: No module named horovod\n", "could not run horovod (exit 1): /usr/bin/python: No "
                                                          "module named horovod"),
    (0, json.dumps({"reachable": {"1.2.3.4:5": False}}), "", "cannot reach the launcher's rendezvous at 1.2.3.4:5"),
    (0, "motd noise", "", "unexpected answer"),
])
def test_explain_check(code, out, err, expected):
    verdict = explain_check("h", code, out, err, ["1.2.3.4:5"], 9)
    if expected is None:
        assert verdict is None
    else:
        assert expected in verdict


def test_payload_round_trip_and_rejections():
    line = make_payload(["python", "t.py"], {"A": "1"}, "/w", 5.0)
    assert parse_payload(line) == {"version": 1, "cwd": "/w", "command": ["python", "t.py"], "env": {"A": "1"},
                                   "grace": 5.0}
    for bad in (b"", line[:-1], b"{not json}\n", b"[]\n", json.dumps({"version": 2}).encode() + b"\n",
                make_payload([], {}, "/w", 1), line.replace(b'"A": "1"', b'"A": 1')):
        with pytest.raises(PayloadError):
            parse_payload(bad)


def test_network_planning_local_and_unresolvable():
    assert remote_hosts(["localhost", "127.0.0.1"]) == []
    assert plan_rendezvous(["localhost"]) == {"localhost": "127.0.0.1"}
    assert route_source("127.0.0.1") == "127.0.0.1"
    assert bind_addresses({"a": "10.0.0.1", "b": "10.0.0.1", "c": "10.1.0.1"}) == ["10.0.0.1", "10.1.0.1"]
    with pytest.raises(NetworkError, match="no-such-host.invalid"):
        plan_rendezvous(["no-such-host.invalid"])
    with pytest.raises(NetworkError, match="none of the network interfaces"):
        plan_rendezvous(["10.0.0.9"], nics=["hvd-no-such-nic"])


def _boot(tmp_path, command, grace=5.0):
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.ssh_boot", "--rank", "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    proc.stdin.write(make_payload(command, {"HVD_TEST_VAR": "from-launcher"}, str(tmp_path), grace))
    proc.stdin.flush()
    return proc


def _reap(proc, timeout=20):
    """Wait for the bootstrap with its standard input left open (as ssh leaves it), then read its output."""
    try:
        proc.wait(timeout=timeout)
        return proc.stdout.read().decode(), proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()


@pytest.mark.ranks
def test_bootstrap_runs_the_worker_with_payload_env_cwd_and_exit_status(tmp_path):
    code = "import os, sys; print(os.environ['HVD_TEST_VAR'], os.getcwd()); sys.exit(7)"
    proc = _boot(tmp_path, [sys.executable, "-c", code])
    out, err = _reap(proc)
    assert proc.returncode == 7, err
    assert out.strip() == f"from-launcher {tmp_path}"


@pytest.mark.timed
@pytest.mark.ranks
def test_bootstrap_stops_the_worker_when_the_launcher_connection_closes(tmp_path):
    pid_file = tmp_path / "pid"
    code = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            "[time.sleep(0.05) for _ in range(2000)]")
    proc = _boot(tmp_path, [sys.executable, "-c", code], grace=2.0)
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, _reap(proc)
        time.sleep(0.02)
    worker = int(pid_file.read_text())
    started = time.monotonic()
    proc.stdin.close()  # what the remote side sees when the launcher's ssh dies
    _reap(proc)
    assert time.monotonic() - started < 10
    assert proc.returncode == 128 + signal.SIGTERM
    assert not process_alive(worker)


@pytest.mark.ranks
def test_bootstrap_reports_a_missing_working_directory_and_command(tmp_path):
    proc = _boot(tmp_path / "nowhere", [sys.executable, "-c", "pass"])
    _, err = _reap(proc)
    assert proc.returncode == 126 and "does not exist on host" in err
    proc = _boot(tmp_path, ["/no/such/program"])
    _, err = _reap(proc)
    assert proc.returncode == 127 and "cannot start '/no/such/program'" in err
