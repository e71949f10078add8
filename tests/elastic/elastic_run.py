"""An elastic job under the real horovodrun, with a discovery script whose output the test edits.

A module of its own (not the conftest) so that tests import it by a name no other directory's conftest shares.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from horovod.common import config
from horovod.runner.launch import package_pythonpath
from horovod.testing.fixtures import live_processes

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")


class ElasticRun:
    """``horovodrun`` with ``--host-discovery-script`` reading ``hosts`` in a temporary directory."""

    def __init__(self, tmp_path, hosts, flags, env=None, script=WORKER):
        self.dir = str(tmp_path)
        self.hosts_file = os.path.join(self.dir, "hosts")
        self.set_hosts(hosts)
        discover = os.path.join(self.dir, "discover.sh")
        with open(discover, "w") as handle:
            handle.write(f"#!/bin/sh\ncat '{self.hosts_file}'\n")
        os.chmod(discover, 0o755)
        full_env = {**config.environ_snapshot(), **package_pythonpath(), "ELASTIC_TEST_OUT": self.dir,
                    **(env or {})}
        self.out = open(os.path.join(self.dir, "launcher.out"), "w+")
        self.err = open(os.path.join(self.dir, "launcher.err"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "horovod.runner", "--host-discovery-script", discover, "--start-timeout", "20",
             *flags, sys.executable, script], stdout=self.out, stderr=self.err, env=full_env,
            start_new_session=True)

    def set_hosts(self, hosts):
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as handle:
            handle.write("".join(h + "\n" for h in hosts))
        os.replace(tmp, self.hosts_file)

    def markers(self, pattern):
        return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.dir, pattern)))

    def wait_for(self, pattern, count=1, timeout=30.0):
        """Wait (bounded) until ``count`` files match ``pattern``; fails early if the launcher ended."""
        deadline = time.monotonic() + timeout
        while len(self.markers(pattern)) < count:
            if self.proc.poll() is not None:
                pytest.fail(f"horovodrun ended ({self.proc.returncode}) before {count} x {pattern}:\n{self.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {count} x {pattern} within {timeout}s:\n{self.log()}")
            time.sleep(0.02)
        return self.markers(pattern)

    def release(self):
        with open(os.path.join(self.dir, "release"), "w"):
            pass

    def finish(self, timeout=60.0):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"horovodrun did not end within {timeout}s:\n{self.log()}")
        return self.proc.returncode

    def log(self):
        self.out.flush()
        self.err.flush()
        with open(self.out.name) as out, open(self.err.name) as err:
            return out.read()[-4000:] + "\n--- stderr ---\n" + err.read()[-6000:]

    def pids(self):
        return [int(name.rsplit(".", 1)[1]) for name in self.markers("pid.*")]

    def finals(self):
        results = {}
        for name in self.markers("final.*.json"):
            with open(os.path.join(self.dir, name)) as handle:
                results[name[len("final."):-len(".json")]] = json.load(handle)
        return results

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in live_processes(self.pids()):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.out.close()
        self.err.close()
