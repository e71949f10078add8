"""Failures told right (issue 31): one fault per job, and everything printed about it must agree (tier cli).

Each cell runs a 3-rank training loop (``failure_matrix_worker.py``) in which one rank, rank 0 or another, meets one
fault; then:

* ``horovodrun``'s summary names that rank, its host and the cause (``Root cause: rank F on HOST ...``);
* no survivor's error names another rank as the one lost or stuck (a messenger may be named as such);
* no line of the launcher's output names another rank as the first failure (``Process name:``, ``failure of``).

Faults on one host (ranks tier): SIGKILL, SIGSTOP inside a collective, a GIL-holding call overlapping its own
collective, an exception in user code, an exception on the engine thread, a failure before ``hvd.init()``, exit 0
before the others. On namespace hosts (one rank each) the same, plus a cut link and a host down; and SIGKILL and a
cut link at 16 ranks (4 hosts x 4). Stuck-but-alive cells set the busy-peer bound short (5 s).
``HVD_SOAK_TRIALS=3`` (``make soak``) runs three trials per cell.
"""

import os
import re
import signal
import sys

import pytest

from horovod.testing.fixtures import end_horovodrun, start_horovodrun
from horovod.testing.netns import NetnsCluster, unavailable_reason
from horovod.testing.fixtures import wait_for as _wait_for

pytestmark = pytest.mark.cli

TRIALS = int(os.environ.get("HVD_SOAK_TRIALS", "1"))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failure_matrix_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELF_FAULTS = ["sigkill", "sigstop", "gil", "user_exception", "engine_exception", "before_init", "exit_0"]
HOST_FAULTS = ["cut_link", "host_down"]
STUCK = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "2", "HOROVOD_BUSY_PEER_TIMEOUT_SECONDS": "5"}
# What the summary says of each fault (after "Root cause: rank F on HOST").
CAUSE = {
    "sigkill": r"(ended with signal SIGKILL|was lost)",
    "sigstop": r"was alive but stuck, as rank \d+ reported first: it made no progress",
    "gil": r"was alive but stuck, as rank \d+ reported first: it made no progress",
    "user_exception": r"raised ValueError: the user's code failed at step 8",
    "engine_exception": r"raised .*background loop failed on rank \d+: RuntimeError\('a bug on the engine thread'\)",
    "before_init": r"ended with exit code 1: ModuleNotFoundError: No module named 'horovod_no_such_module'",
    "exit_0": r"finished \(exited with code 0\)",
    "cut_link": r"was lost, as rank \d+ reported first: its connection showed no sign of life",
    "host_down": r"was lost, as rank \d+ reported first: its connection showed no sign of life",
}
# How a survivor's error may mention a rank without blaming it.
_NOT_BLAME = re.compile(r"Horovod failed on rank \d+:|\(passed on by rank \d+\)|\(rank \d+ waits on it through rank \d+\)|"
                        r"as rank \d+ reported|background loop failed on rank \d+")


def _launch(tmp_path, args, fault, env=None):
    return start_horovodrun(args, str(tmp_path), {**(STUCK if fault in ("sigstop", "gil") else {}), **(env or {})})


_end = end_horovodrun


def _check(err, tmp_path, fault, blamed, hosts, size):
    """The summary names one of ``blamed`` (the faulty rank, or a cut host's ranks) on its host with the cause;
    nothing else printed blames another rank."""
    names = "|".join(str(r) for r in blamed)
    pattern = rf"Root cause: rank ({names}) on ({'|'.join(re.escape(hosts[r]) for r in blamed)}) {CAUSE[fault]}"
    assert re.search(pattern, err), f"{fault}: the summary does not say {pattern!r}:\n{err[-4000:]}"
    for line in err.splitlines():
        for said in re.findall(r"Process name: (\d+)|failure of Process (\d+)", line):
            named = int(said[0] or said[1])
            assert named in blamed, f"{fault}: a launcher line names rank {named}, not {blamed}: {line}"
    for rank in range(size):
        path = tmp_path / f"error.{rank}"
        if rank in blamed or not path.exists():
            continue
        message = _NOT_BLAME.sub("", path.read_text().split(" ", 1)[1])
        others = {int(r) for r in re.findall(r"\brank (\d+)", message)} - set(blamed)
        assert not others, f"{fault}: rank {rank}'s error blames rank(s) {sorted(others)}, not {blamed}: {message}"


# -- one host -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
@pytest.mark.parametrize("faulty", [0, 1])
@pytest.mark.parametrize("fault", SELF_FAULTS)
def test_one_host(tmp_path, fault, faulty, trial):
    proc = _launch(tmp_path, ["-np", "3", sys.executable, WORKER, str(tmp_path), fault, str(faulty)], fault)
    out, err = _end(proc, 90)
    assert proc.returncode != 0, f"{fault}: the job did not fail:\n{err[-3000:]}"
    _check(err, tmp_path, fault, [faulty], {r: "localhost" for r in range(3)}, 3)


# -- namespace hosts ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"namespace test hosts unavailable: {reason}")
    with NetnsCluster(4) as made:
        yield made


def _across_hosts(cluster, tmp_path, fault, faulty, hosts, slots):
    size = len(hosts) * slots
    where = {r: hosts[r // slots].address for r in range(size)}
    env = {**cluster.env()}
    proc = _launch(tmp_path, ["-i", cluster.identity_file, "-np", str(size),
                              "-H", ",".join(f"{h.address}:{slots}" for h in hosts),
                              sys.executable, WORKER, str(tmp_path), fault, str(faulty)], fault, env)
    target = hosts[faulty // slots]
    blamed = [faulty] if fault in SELF_FAULTS else [r for r in range(size) if where[r] == target.address]
    try:
        if fault in HOST_FAULTS:
            _wait_for(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(size)) or proc.poll() is not None,
                      120, "every rank to run allreduces")
            assert proc.poll() is None, proc.communicate()
            cluster.set_link(target, up=False)
            if fault == "host_down":        # nothing on it answers any more: its processes are gone too
                for pid in cluster.worker_pids(target):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        out, err = _end(proc, 120)
    finally:
        cluster.set_link(target, up=True)
        if proc.poll() is None:
            _end(proc, 1)
    assert proc.returncode != 0, f"{fault}: the job did not fail:\n{err[-3000:]}"
    _check(err, tmp_path, fault, blamed, where, size)
    for host in hosts:
        _wait_for(lambda: not cluster.worker_pids(host), 15, f"the processes on {host.address} to end")


@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
@pytest.mark.parametrize("faulty", [0, 1])
@pytest.mark.parametrize("fault", SELF_FAULTS + HOST_FAULTS)
def test_namespace_hosts(cluster, tmp_path, fault, faulty, trial):
    _across_hosts(cluster, tmp_path, fault, faulty, cluster.hosts[:3], 1)


@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
@pytest.mark.parametrize("fault", ["sigkill", "cut_link"])
def test_16_ranks(cluster, tmp_path, fault, trial):
    _across_hosts(cluster, tmp_path, fault, 6, cluster.hosts, 4)
