"""Elastic training, framework-agnostic: states that survive resets (``state``), the reset-and-retry loop (``run``),
the elastic sampler (``sampler``), and Horovod's paths ``worker`` and ``protocol``.

Invariants:
    * Every rank commits, checks for host updates and resets at the same points: the host-update check is a
      broadcast from rank 0, so all ranks raise :class:`HostsUpdatedInterrupt` at the same commit.
    * After a failure every rank returns to its last commit, then takes rank 0's state; rank 0 of a new round is
      always a worker of the previous one (the driver keeps surviving hosts first).
    * The round number (and so the rendezvous scope of the mesh) comes from the driver, never from a process-local
      counter.

The framework bindings add their states (``horovod.torch.elastic.TorchState``) on top of :class:`State`.
"""

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.elastic_records import HostUpdateResult
from horovod.elastic.run import reset_horovod, run, run_fn
from horovod.elastic.sampler import ElasticIndexSampler
from horovod.elastic.state import ObjectState, State

__all__ = ["State", "ObjectState", "run", "run_fn", "reset_horovod", "ElasticIndexSampler", "HostUpdateResult",
           "HorovodInternalError", "HostsUpdatedInterrupt"]
