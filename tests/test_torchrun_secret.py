"""Under ``torchrun`` the job's secret stays off torch's agent store when the user exported one (issue 48, item 3).

torch's agent store has no authentication and listens on every interface: before the fix rank 0 wrote the
rendezvous address *and* the 64-hex secret there, and anyone who read the key could sign requests (200, every rank's
address record), even with ``HOROVOD_SECRET_KEY`` exported. The test runs a 2-rank job under ``torchrun`` and, while
it holds its rendezvous open, reads the agent store as an outsider would: a ``TCPStore`` client with no credentials
(the store checks none, so which local user reads it makes no difference). With the key exported, nothing it reads
signs a request the rendezvous accepts, and the exported key is not there; without it the job warns once.
"""

import os
import re
import textwrap
import time

import pytest

from horovod.common.exceptions import RendezvousError
from horovod.common.rendezvous_client import RendezvousClient, secret_from_hex
from torchrun_job import run_two_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARNING = "HOROVOD_SECRET_KEY is not set: under torchrun"

JOB = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    here = sys.argv[1]
    if hvd.rank() == 0:
        with open(os.path.join(here, "ready.tmp"), "w") as f:
            f.write(" ".join([os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ["TORCHELASTIC_RUN_ID"],
                              os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")]))
        os.rename(os.path.join(here, "ready.tmp"), os.path.join(here, "ready"))
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(here, "go")) and time.monotonic() < deadline:
            time.sleep(0.01)      # the outsider reads the agent store while the job is up
    total = hvd.allreduce(np.ones(1), op=hvd.Sum)
    sys.stdout.write(f"OK {hvd.rank()} {float(total[0])}\\n")    # one write: both ranks share one stdout
    sys.stdout.flush()
    hvd.shutdown()
""")


def _read_agent_store(here):
    """What an outsider reads in the agent store, and whether any 64-hex word in it signs an accepted request."""
    import datetime
    import torch.distributed as dist
    deadline = time.monotonic() + 120
    while not os.path.exists(here / "ready"):
        assert time.monotonic() < deadline, "the job never came up"
        time.sleep(0.02)
    addr, port, run_id, restart = (here / "ready").read_text().split()
    store = dist.TCPStore(addr, int(port), is_master=False, timeout=datetime.timedelta(seconds=20))
    value = store.get(f"horovod/rendezvous/{run_id}.{restart}").decode()
    rz_addr, rz_port, *rest = value.split()
    accepted = []
    for word in re.findall(r"\b[0-9a-f]{64}\b", value):
        try:
            RendezvousClient(rz_addr, int(rz_port), secret_from_hex(word), timeout=5).keys("job")
            accepted.append(word)
        except RendezvousError:
            pass
    return value, accepted


@pytest.mark.cli
@pytest.mark.parametrize("exported", [True, False], ids=["key-exported", "no-key"])
def test_the_agent_store_never_holds_a_usable_secret_when_one_is_exported(tmp_path, exported):
    key = os.urandom(32).hex()
    code, out, err, (value, accepted) = run_two_ranks(tmp_path, JOB, ROOT, {"HOROVOD_SECRET_KEY": key} if exported
                                                      else {}, lambda: _read_agent_store(tmp_path))
    assert code == 0, err[-3000:]
    assert sorted(re.findall(r"OK (\d) 2\.0", out)) == ["0", "1"], out     # both ranks share one stdout
    print(f"exported={exported}: the agent store's key holds {value!r}; words that sign an accepted request: "
          f"{len(accepted)}")
    assert value.split()[0] == "127.0.0.1", value      # item 4: a one-host job's store listens on loopback only
    if exported:
        assert accepted == [] and key not in value, value
        assert WARNING not in err
    else:
        assert err.count(WARNING) == 1, err[-3000:]
