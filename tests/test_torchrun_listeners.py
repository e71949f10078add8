"""Under ``torchrun`` a rank listens only where the job needs it (issue 48, item 4).

Before the fix rank 0 served the rendezvous on ``0.0.0.0`` whenever the job spanned hosts, and the note in
``docs/security.md`` said the ranks' data ports were not narrowed either. Now rank 0 serves it on one address
(``launch_env.listen_address``: the ``HOROVOD_GLOO_IFACE`` interface, loopback on one host, else the address that
routes toward ``MASTER_ADDR``) and publishes that; each rank's data listener binds the address that routes to the
rendezvous. The unit tests pin the choice; the cli test runs a 2-rank ``torchrun`` job on this host and reads every
TCP listener of both ranks' processes while the job is up: all on 127.0.0.1.
"""

import os
import textwrap
import time

import pytest

from horovod.common.exceptions import HorovodConfigError
from horovod.runtime.launch_env import listen_address, one_host
from torchrun_job import run_two_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _no_route(addr):
    raise OSError(101, "Network is unreachable")


@pytest.mark.unit
@pytest.mark.parametrize("env", [
    {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},         # every rank local
    {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1"},  # one agent
    {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},        # only this host reaches it
    {"MASTER_ADDR": "localhost", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
], ids=["local-world", "one-agent", "loopback-master", "localhost-master"])
def test_a_one_host_job_listens_on_loopback(env):
    assert one_host(env)
    assert listen_address(env, route=_no_route, addresses=lambda: ["10.0.0.5", "127.0.0.1"]) == "127.0.0.1"


@pytest.mark.unit
def test_a_multi_host_job_listens_on_the_address_that_routes_to_the_master():
    env = {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}
    assert not one_host(env)
    asked = []
    chosen = listen_address(env, route=lambda addr: asked.append(addr) or "10.0.0.7",
                            addresses=lambda: ["192.168.1.2", "10.0.0.7", "127.0.0.1"])
    assert (chosen, asked) == ("10.0.0.7", ["10.0.0.1"])


@pytest.mark.unit
def test_a_master_named_after_this_host_on_loopback_falls_back_to_a_routable_address():
    # Debian's /etc/hosts maps the host's own name to 127.0.1.1: the route toward it is loopback, which the other
    # hosts cannot dial; this host's first other address is used (and published), never 0.0.0.0.
    env = {"MASTER_ADDR": "10.9.9.9", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}
    assert listen_address(env, route=lambda addr: "127.0.1.1",
                          addresses=lambda: ["172.16.0.3", "127.0.0.1"]) == "172.16.0.3"
    assert listen_address(env, route=_no_route, addresses=lambda: ["172.16.0.3"]) == "172.16.0.3"
    with pytest.raises(HorovodConfigError, match="HOROVOD_GLOO_IFACE"):
        listen_address(env, route=lambda addr: "127.0.1.1", addresses=lambda: ["127.0.0.1"])


@pytest.mark.unit
def test_the_named_interface_wins_and_an_absent_one_is_a_named_error():
    env = {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    assert listen_address(env, "no-such-nic0,lo", route=_no_route) == "127.0.0.1"   # the first this host has
    with pytest.raises(HorovodConfigError, match="no-such-nic0.*HOROVOD_GLOO_IFACE"):
        listen_address(env, "no-such-nic0", route=_no_route)


JOB = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    here = sys.argv[1]
    hvd.allreduce(np.ones(1), op=hvd.Sum)          # the data plane is up: every listener is open
    mine = os.path.join(here, f"rank{hvd.rank()}")
    with open(mine + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(mine + ".tmp", mine)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
        time.sleep(0.01)                         # the test reads our listeners now
    total = hvd.allreduce(np.ones(1), op=hvd.Sum)
    sys.stdout.write(f"OK {hvd.rank()} {float(total[0])}\\n")
    sys.stdout.flush()
    hvd.shutdown()
""")


def _listeners(pid):
    import psutil
    process = psutil.Process(pid)
    connections = process.net_connections(kind="inet") if hasattr(process, "net_connections") else \
        process.connections(kind="inet")
    return sorted((c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN)


@pytest.mark.cli
def test_every_listener_of_a_one_host_torchrun_job_is_on_loopback(tmp_path):
    pytest.importorskip("psutil")

    def listening():
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the job never came up"
            time.sleep(0.02)
        return {r: _listeners(int((tmp_path / f"rank{r}").read_text())) for r in (0, 1)}
    code, out, err, listening = run_two_ranks(tmp_path, JOB, ROOT, {"HOROVOD_SECRET_KEY": os.urandom(32).hex()},
                                              listening)
    assert code == 0, err[-3000:]
    assert sorted(out.split("\n")[:-1]) == ["OK 0 2.0", "OK 1 2.0"], out
    print(f"TCP listeners by rank: {listening}")
    assert len(listening[0]) >= 2 and len(listening[1]) >= 1, listening   # rank 0: rendezvous and data port
    assert {ip for found in listening.values() for ip, _ in found} == {"127.0.0.1"}, listening
