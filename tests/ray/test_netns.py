"""Horovod on a Ray cluster whose nodes are network-namespace hosts (tier cli).

``ray start --head`` runs in host A's namespace, ``ray start --address`` in host B's; the driver runs inside A (a
Ray driver must run on a node of its cluster). A 2-node x 2-worker job checks its placement and collectives, and
each worker lists its own established TCP connections: the workers on A hold connections to B's address that are
not the rendezvous's, so the data went directly between the nodes. Every process in the namespaces is killed by pid
when the module ends (:meth:`horovod.testing.netns.NetnsCluster.close`).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from horovod.testing.netns import NetnsCluster, unavailable_reason
from ray_clusters import EXAMPLES, HERE, ROOT, TOKEN

pytest.importorskip("ray")
pytestmark = [pytest.mark.cli, pytest.mark.serial]

_REASON = unavailable_reason()
if _REASON is not None:
    pytest.skip(f"namespace test hosts unavailable: {_REASON}", allow_module_level=True)

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
PORT = 6379

DRIVER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import ray
    from horovod.ray import RayExecutor

    def my_tcp_peers():
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        peers = []
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):   # IPv4 and IPv4-mapped IPv6 sockets
            with open(table) as handle:
                for line in handle.readlines()[1:]:
                    fields = line.split()
                    if fields[9] in inodes and fields[3] == "01":      # ESTABLISHED
                        host, port = fields[2].split(":")
                        host = host[-8:]                               # the IPv4 address, little-endian words
                        addr = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
                        peers.append((addr, int(port, 16)))
        return peers

    def job():
        import horovod.numpy as hvd
        hvd.init()
        r, s = hvd.rank(), hvd.size()
        total = hvd.allreduce(np.arange(1 << 16, dtype=np.float32) * (r + 1), op=hvd.Sum)
        gathered = hvd.allgather(np.array([r]))
        ok = bool(np.allclose(total, np.arange(1 << 16) * sum(range(1, s + 1))))
        return dict(rank=r, local=(hvd.local_rank(), hvd.local_size()), cross=(hvd.cross_rank(), hvd.cross_size()),
                    ok=ok, gathered=gathered.tolist(), peers=my_tcp_peers(), node=os.environ["HOROVOD_HOSTNAME"].split("-")[0],
                    rendezvous=int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                    rendezvous_addr=os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"])

    ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], configure_logging=False)
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60), num_hosts=2,
                     num_workers_per_host=2)
    ex.start()
    try:
        print("RESULT " + json.dumps(ex.run(job)), flush=True)
    finally:
        ex.shutdown()
        ray.shutdown()
""")


def _in(host, *argv, **kwargs):
    return ["ip", "netns", "exec", host.netns, *argv]


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, ROOT, EXAMPLES]), "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}


def _ray_start(host, temp_dir, *args):
    log = open(os.path.join(temp_dir, f"ray-start-{host.netns}.log"), "w")
    with log:
        return subprocess.Popen(_in(host, RAY, "start", "--block", f"--node-ip-address={host.address}",
                                    "--num-cpus=2", "--disable-usage-stats", *args),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(),
                                start_new_session=True)


def _await_started(proc, log, timeout=120.0):
    """Wait for ``ray start --block`` to say the node runs (its log is the only readiness signal it gives)."""
    deadline = time.monotonic() + timeout
    while "This command will now block forever" not in open(log).read():
        assert proc.poll() is None, f"ray start exited with {proc.returncode}: {open(log).read()[-3000:]}"
        assert time.monotonic() < deadline, f"ray start not up after {timeout} s: {open(log).read()[-3000:]}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_nodes():
    temp_dir = tempfile.mkdtemp(prefix="hvd-ray-netns-")
    try:
        with NetnsCluster(2, sshd_on=[False, False]) as cluster:
            yield from _ray_on(cluster, temp_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray_on(cluster, temp_dir):
    """A Ray head in host A and a Ray node in host B for the duration of the generator."""
    a, b = cluster.hosts
    started = []
    try:
        started.append(_ray_start(a, temp_dir, "--head", f"--port={PORT}", "--include-dashboard=false",
                                  f"--temp-dir={temp_dir}"))
        _await_started(started[-1], os.path.join(temp_dir, f"ray-start-{a.netns}.log"))
        started.append(_ray_start(b, temp_dir, f"--address={a.address}:{PORT}"))
        _await_started(started[-1], os.path.join(temp_dir, f"ray-start-{b.netns}.log"))
        yield cluster, temp_dir
    finally:
        for proc in reversed(started):      # by pid; NetnsCluster.close then kills whatever is left inside
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait(timeout=30)


def test_two_netns_nodes_two_workers_each_talk_directly(ray_nodes):
    cluster, temp_dir = ray_nodes
    a, b = cluster.hosts
    driver = os.path.join(temp_dir, "driver.py")
    with open(driver, "w") as handle:
        handle.write(DRIVER)
    deadline = time.monotonic() + 90   # the worker node joins in the background
    while True:
        proc = subprocess.run(_in(a, sys.executable, driver, f"{a.address}:{PORT}", a.address), env=_env(),
                              capture_output=True, text=True, timeout=240)
        if proc.returncode == 0 or time.monotonic() > deadline or "could not place" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert [r["local"] for r in results] == [[0, 2], [1, 2]] * 2
    assert [r["cross"] for r in results] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert all(r["ok"] and r["gathered"] == [0, 1, 2, 3] for r in results)
    assert results[0]["node"] == results[1]["node"] != results[2]["node"] == results[3]["node"]
    assert results[0]["rendezvous_addr"] == a.address
    for r in results:
        assert r["node"] in (a.address, b.address)
        other_node = b.address if r["node"] == a.address else a.address
        rendezvous = (r["rendezvous_addr"], r["rendezvous"])
        direct = [p for p in r["peers"] if p[0] == other_node and tuple(p) != rendezvous]
        # A data connection straight to the other node's address: nothing relays the tensors (not Ray, not the
        # driver, whose rendezvous is the only other connection a worker may hold).
        assert direct, (r["rank"], r["node"], r["peers"])
