"""scripts/try_multihost.py (tier cli): one command makes namespace hosts with sshd, runs a job on them over real
ssh and removes everything after."""

import os
import re
import subprocess
import sys

import pytest

from horovod.testing.netns import unavailable_reason

pytestmark = pytest.mark.cli

_REASON = unavailable_reason()
if _REASON is not None:
    pytest.skip(f"namespace test hosts unavailable: {_REASON}", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_command_runs_a_job_on_two_namespace_hosts_and_removes_them():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "try_multihost.py"), "--",
                           "python", os.path.join(ROOT, "examples", "numpy_allreduce.py")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[0]<stdout>:rank 0 of 2" in proc.stdout and "[1]<stdout>:rank 1 of 2" in proc.stdout, proc.stdout
    hosts = re.search(r"-H (10\.99\.\d+)\.2:1,\1\.3:1 ", proc.stdout)
    session = re.search(r"-i (/\S+)/client_key", proc.stdout)
    assert hosts and session, proc.stdout
    assert hosts.group(1) + "." not in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True,
                                                      text=True, timeout=20).stdout     # the bridge is gone
    assert not os.path.exists(session.group(1))                                        # and the session's keys
