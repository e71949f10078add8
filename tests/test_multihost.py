"""Jobs on real hosts: network namespaces with their own address and a real sshd each (tier cli).

One cluster for the module (:class:`horovod.testing.netns.NetnsCluster`): hosts A and B run sshd, host C refuses
ssh (nothing listens on its port 22). The tests: a 2-host x 2-slot job over ssh with correct collectives (flat and
hierarchical allreduce), no process left on any host after it and the secret on no command line; hosts that refuse ssh or do not answer fail the start
with their names within the start timeout; a host whose link goes down mid-job makes every survivor fail within the
data-plane timeout.
"""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from horovod.testing.fixtures import run_horovodrun
from horovod.runner.worker_threads import host_cores
from horovod.testing.netns import NetnsCluster, unavailable_reason
from horovod.testing.fixtures import wait_for as _wait_for

pytestmark = pytest.mark.cli

_REASON = unavailable_reason()
if _REASON is not None:
    pytest.skip(f"namespace test hosts unavailable: {_REASON}", allow_module_level=True)

JOB = textwrap.dedent("""
    import os, socket, sys, time
    import numpy as np
    import horovod.numpy as hvd
    out = sys.argv[1]
    hvd.init()
    r, s = hvd.rank(), hvd.size()
    total = hvd.allreduce(np.arange(6, dtype=np.float64) + r, op=hvd.Sum)
    assert np.array_equal(total, np.arange(6) * s + sum(range(s))), total
    avg = hvd.allreduce(np.full(3, float(r)))
    assert np.allclose(avg, (s - 1) / 2), avg
    gathered = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int32))
    assert gathered.tolist() == [[q, q] for q in range(s) for _ in range(q + 1)], gathered
    print(f"OK rank={r} size={s} local={hvd.local_rank()}/{hvd.local_size()} "
          f"cross={hvd.cross_rank()}/{hvd.cross_size()} host={os.environ['HOROVOD_HOSTNAME']} cwd={os.getcwd()} "
          f"threads={os.environ.get('OMP_NUM_THREADS')}")
    if r == 0:  # hold the job while the test looks for the secret in every process's command line
        path = os.path.join(out, "secret")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, os.environ["HOROVOD_SECRET_KEY"].encode()); os.close(fd); os.rename(path + ".tmp", path)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(out, "checked")) and time.monotonic() < deadline:
            time.sleep(0.02)
    hvd.barrier()
    hvd.shutdown()
""")

LOOP = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import horovod.numpy as hvd
    out = sys.argv[1]
    hvd.init()
    r = hvd.rank()
    step = 0
    try:
        while True:
            hvd.allreduce(np.ones(1000))
            step += 1
            if step == 3:
                open(os.path.join(out, f"ready.{r}"), "w").close()
            time.sleep(0.02)  # pacing only
    except Exception as exc:
        with open(os.path.join(out, f"error.{r}"), "w") as f:
            f.write(f"{time.time()} {type(exc).__name__}: {exc}")
        sys.exit(3)
""")


@pytest.fixture(scope="module")
def cluster():
    with NetnsCluster(3, sshd_on=[True, True, False]) as made:
        yield made


def _cmdlines():
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    yield int(pid), handle.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass


def _launch(cluster, args, out_dir):
    env = {**os.environ, **cluster.env(), "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    return subprocess.Popen([sys.executable, "-m", "horovod.runner", "-i", cluster.identity_file, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=out_dir,
                            start_new_session=True)


def _finish(proc, timeout):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()


@pytest.mark.serial
@pytest.mark.parametrize("flags", [[], ["--hierarchical-allreduce"]], ids=["flat", "hierarchical"])
def test_two_hosts_two_slots_over_ssh(cluster, tmp_path, flags):
    a, b = cluster.hosts[0], cluster.hosts[1]
    (tmp_path / "job.py").write_text(JOB)
    started = time.monotonic()
    proc = _launch(cluster, ["-np", "4", "-H", f"{a.address}:2,{b.address}:2", *flags, sys.executable, "job.py",
                             str(tmp_path)], tmp_path)
    try:
        _wait_for(lambda: (tmp_path / "secret").exists() or proc.poll() is not None, 60, "rank 0's secret file")
        assert proc.poll() is None, proc.communicate()
        secret = (tmp_path / "secret").read_text()
        assert len(secret) == 64
        leaks = [(pid, line[:200]) for pid, line in _cmdlines() if secret in line]
        (tmp_path / "checked").touch()
    finally:
        out, err = _finish(proc, 60)
    assert not leaks, f"the job secret is on a command line: {leaks}"
    assert proc.returncode == 0, err
    lines = sorted(line for line in out.splitlines() if "OK rank=" in line)
    assert len(lines) == 4, out + err
    expected = {0: (a, "0/2", "0/2"), 1: (a, "1/2", "0/2"), 2: (b, "0/2", "1/2"), 3: (b, "1/2", "1/2")}
    # each host's share for its two workers, computed on the host, unless this test's environment sets it
    threads = os.environ.get("OMP_NUM_THREADS") or max(1, host_cores() // 2)
    for rank, (host, local, cross) in expected.items():
        assert (f"[{rank}]<stdout>:OK rank={rank} size=4 local={local} cross={cross} host={host.address} "
                f"cwd={tmp_path} threads={threads}") in lines, lines
    print(f"2x2 job over ssh: {time.monotonic() - started:.1f} s")
    for host in (a, b):  # nothing left running on any host
        _wait_for(lambda: not cluster.worker_pids(host), 10, f"the processes on {host.address} to end")


@pytest.mark.timed
def test_hosts_refusing_ssh_are_named_within_start_timeout(cluster, tmp_path):
    a, refusing = cluster.hosts[0], cluster.hosts[2]
    silent = f"{cluster.subnet}.250"  # on the bridge's subnet, but nobody answers
    started = time.monotonic()
    result = run_horovodrun(["-np", "3", "-H", f"{a.address}:1,{refusing.address}:1,{silent}:1", "--start-timeout",
                             "4", "-i", cluster.identity_file, sys.executable, "-c", "print('never')"],
                            timeout=30, env=cluster.env(), cwd=str(tmp_path))
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert "never" not in result.stdout
    assert f"{refusing.address}: ssh failed: ssh: connect to host {refusing.address} port 22: Connection refused" \
        in result.stderr, result.stderr
    # ARP gets no answer: ssh reports "No route to host" after a few seconds, or the check's bound cuts it off.
    assert (f"{silent}: no answer over ssh within 4 s" in result.stderr
            or f"{silent}: ssh failed: ssh: connect to host {silent} port 22: No route to host" in result.stderr), \
        result.stderr
    assert f"{a.address}:" not in result.stderr.split("cannot start workers")[1]
    assert elapsed < 4 + 6, f"took {elapsed:.1f} s with --start-timeout 4"
    assert not cluster.worker_pids(a)


@pytest.mark.timed(seconds=30)
def test_an_unreachable_host_among_16_is_named_within_the_default_start_timeout(tmp_path):
    # 16 hosts at default settings; one's link is down, so nothing at its address answers (no ARP reply, no ssh).
    with NetnsCluster(16) as big:
        lost = big.hosts[9]
        big.set_link(lost, up=False)
        started = time.monotonic()
        result = run_horovodrun(["-np", "16", "-H", ",".join(f"{h.address}:1" for h in big.hosts),
                                 "-i", big.identity_file, sys.executable, "-c", "print('never')"],
                                timeout=90, env=big.env(), cwd=str(tmp_path))
        elapsed = time.monotonic() - started
        assert result.returncode == 1, result.stderr
        assert "never" not in result.stdout
        named = result.stderr.split("cannot start workers")[-1]
        print(f"named within {elapsed:.1f} s:{named}")
        # The launcher's bound or ssh's own connect timeout may come first; either names the host and why.
        assert (f"{lost.address}: no answer over ssh within" in named
                or re.search(rf"{re.escape(lost.address)}: ssh failed: ssh: connect to host {re.escape(lost.address)} "
                             r"port 22: (No route to host|Connection timed out)", named)), result.stderr
        others = [h.address for h in big.hosts if h is not lost and f"{h.address}:" in named]
        assert not others, f"reachable hosts named as failed: {others}\n{result.stderr}"
        assert elapsed < 30 + 6, f"took {elapsed:.1f} s with the default start timeout (30 s)"
        assert not [pid for h in big.hosts for pid in big.worker_pids(h)]

NEVER_REGISTERS = textwrap.dedent("""
    import os, sys, time
    if os.environ["HOROVOD_HOSTNAME"] == sys.argv[1]:
        time.sleep(600)     # ssh answered, the worker started, and it never reaches hvd.init()
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    hvd.allreduce(np.ones(4))
""")


@pytest.mark.timed
def test_a_host_whose_workers_never_register_is_named_within_the_start_timeout(cluster, tmp_path):
    a, b = cluster.hosts[0], cluster.hosts[1]
    (tmp_path / "job.py").write_text(NEVER_REGISTERS)
    started = time.monotonic()
    result = run_horovodrun(["-np", "4", "-H", f"{a.address}:2,{b.address}:2", "--start-timeout", "5", "-i",
                             cluster.identity_file, sys.executable, "job.py", b.address],
                            timeout=60, env=cluster.env(), cwd=str(tmp_path))
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert f"Root cause: ranks 2, 3 on host {b.address} did not register within the start timeout" in output, \
        output[-3000:]
    assert elapsed < 5 + 15, f"took {elapsed:.1f} s with --start-timeout 5"
    for host in (a, b):
        _wait_for(lambda: not cluster.worker_pids(host), 10, f"the processes on {host.address} to end")


@pytest.mark.serial
def test_link_down_mid_job_fails_every_survivor_within_timeout(cluster, tmp_path):
    a, b = cluster.hosts[0], cluster.hosts[1]
    (tmp_path / "loop.py").write_text(LOOP)
    timeout = 3.0
    # A lost host is detected by the liveness timeout (issue 19), the gloo timeout bounds silent progress.
    proc = _launch(cluster, ["-np", "4", "-H", f"{a.address}:2,{b.address}:2", "--gloo-timeout-seconds",
                             str(timeout), "--liveness-timeout", str(timeout), sys.executable, "loop.py",
                             str(tmp_path)], tmp_path)
    try:
        _wait_for(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(4)) or proc.poll() is not None,
                  60, "every rank to run allreduces")
        assert proc.poll() is None, proc.communicate()
        down_at = time.time()
        cluster.set_link(b, up=False)
        out, err = _finish(proc, timeout + 30)
    finally:
        cluster.set_link(b, up=True)
        if proc.poll() is None:
            _finish(proc, 1)
    assert proc.returncode != 0
    # The survivors, on host A: the first to fail ends the job, so the launcher may stop the other before it writes.
    reports = [tmp_path / f"error.{rank}" for rank in (0, 1) if (tmp_path / f"error.{rank}").exists()]
    assert reports, f"no survivor reported an error; launcher stderr:\n{err[-3000:]}"
    for path in reports:
        rank = path.name.split(".")[1]
        when, message = path.read_text().split(" ", 1)
        assert float(when) - down_at < timeout + 3, f"rank {rank} erred {float(when) - down_at:.1f} s after link down"
        assert "HorovodInternalError" in message, message
    # Host B's workers lost everyone; they fail by the same timeout and exit by themselves.
    for host in (a, b):
        _wait_for(lambda: not cluster.worker_pids(host), timeout + 15, f"the processes on {host.address} to end")


def _launch_plain(identity_file, home, args, cwd):
    """horovodrun with no ssh options at all: a fresh HOME (so ~/.horovod/known_hosts starts empty), only -i."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(HOME=str(home), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-i", identity_file, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    out, err = _finish(proc, 120)
    return proc.returncode, out, err


SMALL_JOB = textwrap.dedent("""
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    total = hvd.allreduce(np.ones(2) * hvd.rank(), op=hvd.Sum)
    print(f"OK rank={hvd.rank()} size={hvd.size()} sum={total[0]:g}")
    hvd.shutdown()
""")


@pytest.mark.serial
def test_fresh_hosts_trust_on_first_use_and_a_changed_key_is_refused(tmp_path):
    """Unknown host keys: the first job records them (no ssh options given); a changed key is refused with a
    message saying what to do, and doing it lets the next job run."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "job.py").write_text(SMALL_JOB)
    with NetnsCluster(2) as fresh:
        a, b = fresh.hosts
        args = ["-np", "4", "-H", f"{a.address}:2,{b.address}:2", sys.executable, "job.py"]
        code, out, err = _launch_plain(fresh.identity_file, home, args, tmp_path)
        assert code == 0, err[-3000:]
        assert sorted(line.split(":", 1)[1] for line in out.splitlines() if "OK rank=" in line) == \
            [f"OK rank={r} size=4 sum=6" for r in range(4)], out
        known = home / ".horovod" / "known_hosts"
        for host in (a, b):  # recorded (ssh may hash the names: ask ssh-keygen)
            found = subprocess.run(["ssh-keygen", "-F", host.address, "-f", str(known)], capture_output=True,
                                   text=True, timeout=20)
            assert found.returncode == 0, (host.address, known.read_text())

        fresh.replace_host_key(b)
        code, out, err = _launch_plain(fresh.identity_file, home, args, tmp_path)
        assert code == 1 and "OK rank=" not in out
        assert f"{b.address}: ssh failed" in err and "REFUSED" in err, err[-3000:]
        advice = f"ssh-keygen -R {b.address} -f {known}"
        assert advice in err, err[-3000:]
        assert f"{a.address}:" not in err.split("cannot start workers")[1]  # the unchanged host is fine

        subprocess.run(advice.split(), check=True, capture_output=True, timeout=20)
        code, out, err = _launch_plain(fresh.identity_file, home, args, tmp_path)
        assert code == 0, err[-3000:]
        assert len([line for line in out.splitlines() if "OK rank=" in line]) == 4


@pytest.mark.unit
def test_clusters_alive_at_once_in_one_process_never_share_a_name():
    # A random two-hex suffix once named a second cluster of one test run after a live one's bridge ("File exists").
    tags = [NetnsCluster(1).tag for _ in range(256)]
    assert len(set(tags)) == 256 and all(len(tag) == 7 for tag in tags)
