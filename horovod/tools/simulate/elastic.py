"""An elastic reset, modelled around two simulated parts: how long after a rank dies the job trains again.

The reset's phases, in the order an elastic job goes through them (docs/elastic.md):

1. detection (simulated): the rank dies mid-step; the survivors fail, each naming it, when their connections break
   and the failure spreads (the lost-rank scenario of :mod:`~horovod.tools.simulate.report`);
2. the driver's round (modelled): every survivor tells the driver it is ready and waits; the driver answers once
   every live worker waits (:mod:`horovod.runtime.elastic_worker`): two requests per survivor and an answer each,
   served one after another by the driver's store, as :class:`~horovod.tools.simulate.startup.Rendezvous` serves
   (the store's change wakes the driver: no poll interval is waited);
3. the new mesh and its first result (simulated): each survivor starts its engine again (``reinit``: its threads,
   listener and transport, one run on a core of its host), registers its record and gets everyone's (by the tree
   past 16 ranks), then negotiates its first allreduce with new names (the response cache starts empty);
4. the state's broadcast from rank 0 (modelled, when ``state_bytes`` is given): a pipelined broadcast, the link's
   bandwidth plus a latency per level of a binary tree.

No rank boots again (the survivors' processes live on) and the killed rank's host is not replaced (a new host
would add its start-up: :func:`~horovod.tools.simulate.calibration.startup_seconds`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

from horovod.tools.simulate.job import Workload, scenario, victim_of
from horovod.tools.simulate.startup import StartupModel
from horovod.tools.simulate.world import CpuModel, Faults, LinkModel

__all__ = ["reset_seconds"]


def reset_seconds(size: int, slots: int = 8, cores: int = 8, cpu: CpuModel = CpuModel(),
                  link: LinkModel = LinkModel(), startup: StartupModel = StartupModel(),
                  state_bytes: int = 0, seed: int = 1, detect: Optional[float] = None,
                  reinit: Optional[float] = None) -> Dict[str, float]:
    """The reset's phases (seconds) and their sum, ``reset_s``, for a job of ``size`` ranks losing one (``detect``:
    phase 1's time where the caller simulated it already; ``reinit``: a survivor's CPU to start its engine again,
    else ``startup.reinit``)."""
    if detect is None:
        workload = Workload(steps=6, tensors=20, exits=False)    # the survivors catch the error and reset
        whole = scenario(size, seed, slots, cores, workload, cpu=cpu, link=link)
        middle = whole.step_submitted[3] + (whole.step_done[3] - whole.step_submitted[3]) / 2
        detect = scenario(size, seed, slots, cores, workload, Faults(kill=[(middle, victim_of(size))]), cpu=cpu,
                          link=link).detection_seconds()
    survivors = size - 1
    # Every survivor asks at about once; the driver answers when the last one asked.
    remote = link.remote_latency if survivors > slots else link.local_latency
    round_s = survivors * 3 * startup.request + 2 * remote
    mesh = scenario(survivors, seed, slots, cores, Workload(steps=1, tensors=20, compute=0.0, jitter=0.0),
                    cpu=cpu, link=link,
                    startup=dataclasses.replace(startup, launch=0.0, spawn=0.0, remote=0.0,
                                                boot=startup.reinit if reinit is None else reinit))
    first = mesh.step_done[0]
    bandwidth = link.remote_bandwidth if survivors > slots else link.local_bandwidth
    broadcast = state_bytes / bandwidth + math.ceil(math.log2(max(survivors, 2))) * remote if state_bytes else 0.0
    return {"detect_s": detect, "round_s": round_s, "mesh_first_s": first, "broadcast_s": broadcast,
            "reset_s": detect + round_s + first + broadcast}
