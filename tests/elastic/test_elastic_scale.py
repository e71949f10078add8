"""Elastic training at 64 ranks over 8 namespace hosts reached over ssh (tier cli, slow; needs root, ip, sshd).

One host (8 workers) is removed mid-training and added back: training completes, every epoch committed once and in
order, every sample seen in every epoch. ``HVD_ELASTIC_SCALE_HOSTS=32`` runs the same job at 256 ranks (32 hosts x 8).
"""

import os
import time

import pytest

from horovod.testing.netns import NetnsCluster, unavailable_reason
from test_elastic_cli import check_history

pytestmark = [pytest.mark.cli, pytest.mark.slow, pytest.mark.serial]

_REASON = unavailable_reason()
if _REASON is not None:
    pytest.skip(f"namespace test hosts unavailable: {_REASON}", allow_module_level=True)

HOSTS, SLOTS = int(os.environ.get("HVD_ELASTIC_SCALE_HOSTS", "8")), 8
N = max(256, 4 * HOSTS * SLOTS)     # samples: every rank gets some in every epoch, whatever the size


def test_64_ranks_one_host_removed_and_added_back_no_epoch_lost_or_repeated(elastic_run):
    # The name keeps the default size; HVD_ELASTIC_SCALE_HOSTS changes it (the start timeout grows with it).
    with NetnsCluster(HOSTS) as cluster:
        everyone = [f"{h.address}:{SLOTS}" for h in cluster.hosts]
        total = HOSTS * SLOTS
        run = elastic_run(everyone, ["-np", str(total), "--min-np", str(SLOTS), "--max-np", str(total),
                                     "--start-timeout", str(max(120, HOSTS * 15)), "-i", cluster.identity_file],
                          {**cluster.env(), "ELASTIC_TEST_N": str(N), "ELASTIC_TEST_EPOCHS": "4",
                           "ELASTIC_TEST_WAIT": f"{total - SLOTS}@1,{total}@2"})
        try:
            started = time.monotonic()
            run.wait_for(f"waiting.{total - SLOTS}.*", timeout=max(240, HOSTS * 20))
            run.set_hosts(everyone[:-1])
            run.wait_for(f"waiting.{total}.*", timeout=max(240, HOSTS * 20))
            run.set_hosts(everyone)
            assert run.finish(timeout=max(300, HOSTS * 20)) == 0, run.log()
            finals = run.finals()
        finally:
            run.close()     # before the hosts go
        rank0 = check_history(finals, 4, n=N, workers=total)
        assert rank0["sizes"] == {"0": total, "1": total - SLOTS, "2": total, "3": total}, rank0
        print(f"{total}-rank elastic job: {time.monotonic() - started:.0f} s")
