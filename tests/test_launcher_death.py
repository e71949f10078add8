"""SIGKILL of ``horovodrun`` ends every process the job started, at any depth, on every host (issue 29, item 5).

A worker started through a wrapper (``sh -c "python train.py; echo done"``, a shell script, ``timeout``, which
moves itself into a process group of its own) is not the launcher's child: the kernel's parent-death signal reaches
only the wrapper. Each case starts two ranks that record their pid and their wrapper's, kills ``horovodrun`` alone
with SIGKILL and polls ``/proc`` until every recorded process is gone, for at most 10 s. Every process a case
started is killed by pid at its end, whatever happened.

The ssh host-mode case runs on namespace hosts (:mod:`horovod.testing.netns`) and is skipped where they cannot be
made.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from horovod.testing.fixtures import process_alive

pytestmark = [pytest.mark.cli, pytest.mark.serial]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GONE_WITHIN = 10.0

# Records "pid ppid" (the ppid is the wrapper), then stays alive doing nothing a dead launcher could end.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    import horovod.numpy as hvd
    hvd.init()
    path = os.path.join(sys.argv[1], f"pid.{hvd.rank()}")
    with open(path + ".tmp", "w") as handle:
        handle.write(f"{os.getpid()} {os.getppid()}")
    os.rename(path + ".tmp", path)
    while True:
        time.sleep(0.05)
""")

WRAPPER_SCRIPT = textwrap.dedent("""\
    #!/bin/bash
    "$@"
    echo done
""")


def _wrapped(kind: str, tmp_path) -> list:
    python = [sys.executable, str(tmp_path / "script.py"), str(tmp_path)]
    if kind == "sh -c":
        return ["sh", "-c", " ".join(python) + "; echo done"]
    if kind == "bash script":
        return ["bash", str(tmp_path / "wrapper.sh"), *python]
    if kind == "timeout":            # timeout(1) puts itself and the worker in a process group of their own
        return ["sh", "-c", "timeout 600 " + " ".join(python) + "; echo done"]
    raise ValueError(kind)


def _recorded(tmp_path, ranks: int) -> list:
    pids = []
    for rank in range(ranks):
        path = tmp_path / f"pid.{rank}"
        if path.exists():
            pids.extend(int(p) for p in path.read_text().split())
    return pids


def _wait_recorded(tmp_path, ranks: int, proc, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if all((tmp_path / f"pid.{rank}").exists() for rank in range(ranks)):
            return _recorded(tmp_path, ranks)
        time.sleep(0.05)
    raise AssertionError(f"the workers did not start (horovodrun status {proc.poll()})")


def _seconds_until_gone(pids, limit: float) -> float:
    """Seconds until none of ``pids`` is alive, polled; ``limit`` plus one poll if some outlive it."""
    start = time.monotonic()
    while any(process_alive(p) for p in pids) and time.monotonic() - start < limit:
        time.sleep(0.02)
    return time.monotonic() - start


def _kill_all(pids) -> None:
    for pid in pids:
        if process_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _kill_launcher_and_measure(proc, pids) -> float:
    os.kill(proc.pid, signal.SIGKILL)          # horovodrun alone, not its process group
    proc.wait(10)
    took = _seconds_until_gone(pids, GONE_WITHIN)
    alive = [p for p in pids if process_alive(p)]
    print(f"every recorded process gone {took:.2f} s after SIGKILL of horovodrun" if not alive
          else f"still alive {took:.1f} s after SIGKILL of horovodrun: {alive}")
    return took


@pytest.mark.parametrize("wrapper", ["sh -c", "bash script", "timeout"])
def test_sigkill_of_horovodrun_ends_workers_started_through_a_wrapper(tmp_path, wrapper):
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "wrapper.sh").write_text(WRAPPER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", "2", *_wrapped(wrapper, tmp_path)],
                            cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    pids = []
    try:
        pids = _wait_recorded(tmp_path, 2, proc, 60)
        assert len(set(pids)) == 4, f"expected two workers and two wrappers, got {pids}"
        took = _kill_launcher_and_measure(proc, pids)
        alive = [p for p in pids if process_alive(p)]
        assert not alive, f"{alive} outlived a SIGKILLed horovodrun by {took:.1f} s ({wrapper})"
    finally:
        _kill_all(pids + _recorded(tmp_path, 2))
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cluster():
    from horovod.testing.netns import NetnsCluster, unavailable_reason
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"namespace test hosts unavailable: {reason}")
    with NetnsCluster(2) as made:
        yield made


def test_sigkill_of_horovodrun_ends_wrapped_workers_on_ssh_hosts(cluster, tmp_path):
    a, b = cluster.hosts
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {**os.environ, **cluster.env(), "PYTHONPATH": ROOT}
    python = f"{sys.executable} {tmp_path / 'script.py'} {tmp_path}"
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-i", cluster.identity_file, "-np", "2",
                             "-H", f"{a.address}:1,{b.address}:1", "sh", "-c", f"timeout 600 {python}; echo done"],
                            cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    pids = []
    try:
        pids = _wait_recorded(tmp_path, 2, proc, 90)
        took = _kill_launcher_and_measure(proc, pids)
        alive = [p for p in pids if process_alive(p)]
        assert not alive, f"{alive} outlived a SIGKILLed horovodrun by {took:.1f} s on the ssh hosts"
        for host in (a, b):      # nothing else of the job either: the remote bootstrap and what it started
            deadline = time.monotonic() + 5
            while cluster.worker_pids(host) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not cluster.worker_pids(host), f"processes left on {host.address}"
    finally:
        _kill_all(pids + _recorded(tmp_path, 2))
        if proc.poll() is None:
            proc.kill()
            proc.wait()
