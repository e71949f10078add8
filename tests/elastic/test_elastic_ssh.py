"""An elastic job on two namespace hosts reached over ssh (tier cli; needs root, ip, sshd: see horovod.testing.netns).

The discovery script lists both hosts; the worker on one is killed by its pid (from its marker file: the namespaces
share the PID namespace) and training goes on, on the other host, to the end.
"""

import os
import signal
import time

import pytest

from horovod.testing.netns import NetnsCluster, unavailable_reason
from horovod.testing.fixtures import wait_for as _wait_for
from test_elastic_cli import check_history

pytestmark = pytest.mark.cli

_REASON = unavailable_reason()
if _REASON is not None:
    pytest.skip(f"namespace test hosts unavailable: {_REASON}", allow_module_level=True)


@pytest.mark.serial
def test_remote_worker_killed_training_goes_on_on_the_other_host(elastic_run):
    started = time.monotonic()
    with NetnsCluster(2) as cluster:
        a, b = (h.address for h in cluster.hosts)
        run = elastic_run([f"{a}:1", f"{b}:1"], ["-np", "2", "--min-np", "1", "-i", cluster.identity_file],
                          {**cluster.env(), "ELASTIC_TEST_HOLD": "1:2"})
        try:
            held = run.wait_for("hold.*", count=2)
            victim = [name for name in held if name.startswith(f"hold.{b}.0.")][0]
            os.kill(int(victim.rsplit(".", 1)[1]), signal.SIGKILL)
            run.release()
            assert run.finish() == 0, run.log()
            log, finals = run.log(), run.finals()
        finally:
            run.close()  # before the hosts go
        rank0 = check_history(finals, 4)
        assert rank0["sizes"] == {"0": 2, "1": 1, "2": 1, "3": 1}, rank0
        assert all(k.startswith(f"{a}.0.") for k in finals), finals
        # The remote worker's exit came back through its host's channel as the signal that ended it.
        assert f"worker {b}:0 ended with signal SIGKILL; host {b} is blacklisted for good" in log, log
        assert f"round 1: 2 worker(s) on {a}, {b}" in log and f"round 2: 1 worker(s) on {a}" in log, log
        for host in cluster.hosts:  # nothing left running on either host
            _wait_for(lambda: not cluster.worker_pids(host), 10, f"the processes on {host.address} to end")
    assert time.monotonic() - started < 60
