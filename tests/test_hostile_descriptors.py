"""Another local user against the launcher's open-file limit (issue 48, item 1).

The launcher runs at the usual soft limit of 1,024 open files while a second local user (the ``stranger`` fixture
of ``tests/test_hostile_user.py``: root only, skipped otherwise) holds idle connections on its rendezvous store,
reopened as soon as they are closed. Before the fix 1,100 of them pinned the launcher at its limit and a CPU: its
listener, readable for ever, spun a loop whose ``accept`` failed, nothing was dropped, and a 2-rank job started
3.5 s late; 15,000 made jobs fail blaming the workers. Now the store raises its limit, keeps a reserve and drops
the oldest stranger, so the start is within 1 s of the unattacked one measured by the same launcher (measured
with 2-core margins: both starts in one process, one after the other), and no crowd makes a job fail for a
reason other than the descriptors it names.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from test_hostile_user import CROWD_ATTACKER, stranger  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.ranks, pytest.mark.serial]

# The launcher: its own process at soft limit 1,024 (and hard limit 1,024 when it may not raise it), driven by
# lines on its input: "serve" starts a store, "full N" answers once the store holds N connections (or its budget),
# "launch" starts a 2-rank job on the latest store and says how long it took and how it ended.
LAUNCHER = textwrap.dedent(r'''
    import io, resource, sys, time, threading
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024 if sys.argv[2] == "fixed" else hard))
    from horovod.runner.hosts import HostInfo, get_host_assignments
    from horovod.runner.launch import LaunchConfig, launch_local, package_pythonpath
    from horovod.runner.rendezvous import rendezvous_service
    launch = LaunchConfig((sys.executable, sys.argv[1]), tuple(get_host_assignments([HostInfo("localhost", 2)], 2)),
                          extra_env=package_pythonpath())
    service = None
    for line in sys.stdin:
        word, *rest = line.split()
        if word == "serve":
            if service is not None:
                service.__exit__(None, None, None)
            service = rendezvous_service()
            server, info = service.__enter__()
            print("store", info.addr, info.port, server._loop.budget, flush=True)
        elif word == "full":
            want = min(int(rest[0]), server._loop.budget - 16)
            deadline = time.monotonic() + 60
            while len(server._loop.selector.get_map()) < want and time.monotonic() < deadline:
                time.sleep(0.01)
            print("full", len(server._loop.selector.get_map()), flush=True)
        elif word == "launch":
            out, err = io.StringIO(), io.StringIO()
            begun = time.monotonic()
            result = launch_local(launch, info, out, err, timeout=60)
            took = time.monotonic() - begun
            said = " ".join(err.getvalue().split())[-400:] or "-"
            print("launched", int(result.ok), f"{took:.3f}", out.getvalue().count("STARTED"), said, flush=True)
            print("exhausted", server.exhausted or "-", flush=True)
    if service is not None:
        service.__exit__(None, None, None)
''')

QUICK = textwrap.dedent("""
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    total = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum)
    assert total.tolist() == [3.0, 3.0, 3.0], total
    print("STARTED", hvd.rank(), flush=True)
    hvd.shutdown()
""")


class Launcher:
    """The launcher process: one command at a time, its answer line back."""

    def __init__(self, script, hard):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(script), hard], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip().split(" ", 4) if not line.startswith("serve") else \
            self.proc.stdout.readline().split()
        assert answer and answer != [""], f"the launcher ended: {self.proc.poll()}"
        return answer

    def launch(self):
        _, ok, took, started, said = self.ask("launch")
        exhausted = self.proc.stdout.readline().split(" ", 1)[1].strip()
        return ok == "1" and started == "2", float(took), said.strip(), exhausted

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _crowded_start(stranger, tmp_path, crowd, hard):  # noqa: F811
    script = tmp_path / "quick.py"
    script.write_text(QUICK)
    launcher = Launcher(script, hard)
    attack = None
    try:
        launcher.ask("serve")
        launcher.launch()                       # warm: the first start reads the package from disk
        launcher.ask("serve")                   # a fresh store for each job (the last one's addresses are stale)
        quiet = launcher.launch()
        _, addr, port, budget = launcher.ask("serve")
        attack = stranger.start(CROWD_ATTACKER, str(crowd))
        attack.tell(f"tcp {addr} {port}")
        attack.wait_for(lambda words: words[:3] == ["held", f"tcp:{addr}:{port}", "64"], 60)
        full = launcher.ask(f"full {crowd}")
        crowded = launcher.launch()
    finally:
        lines = attack.stop() if attack is not None else []
        launcher.close()
    stats = [words for words in lines if words[0] == "stats"]
    print(f"{crowd} idle connections, launcher soft limit 1024 ({hard} hard limit, store budget {budget}, "
          f"{full[1]} held when launched): start {quiet[1]:.2f} s unattacked, {crowded[1]:.2f} s attacked; "
          f"attacker dials/cuts/most held {stats}; exhausted: {crowded[3]}")
    return quiet, crowded


@pytest.mark.parametrize("hard", ["raised", "fixed"])
def test_a_thousand_connections_at_the_usual_limit_do_not_delay_the_start(stranger, tmp_path, hard):  # noqa: F811
    quiet, crowded = _crowded_start(stranger, tmp_path, 1100, hard)
    assert quiet[0], quiet[2]
    assert crowded[0], crowded[2]
    assert crowded[1] <= quiet[1] + 1.0, f"the job started in {crowded[1]:.2f} s under 1,100 idle connections " \
                                         f"on a launcher at 1,024 open files, {quiet[1]:.2f} s without"


@pytest.mark.slow
def test_fifteen_thousand_connections_never_fail_a_job_for_a_misnamed_reason(stranger, tmp_path):  # noqa: F811
    _, crowded = _crowded_start(stranger, tmp_path, 15000, "fixed")
    assert crowded[0] or "file descriptors" in crowded[2], crowded[2]
