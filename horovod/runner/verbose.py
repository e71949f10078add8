"""What ``horovodrun --verbose`` prints before the workers start: the hosts and their slots, which are remote, the
interface and address each host's workers reach the rendezvous on, and the command of every rank.

Horovod's verbose launcher prints the same facts (its host filtering, ssh check and interface discovery lines); the
lines that have a counterpart there keep its wording. :func:`describe_job` is a pure function of the plan.
"""

from __future__ import annotations

import shlex
from typing import Callable, List, Mapping, Optional, Sequence, Union

from horovod.runner.backends.base import WorkerLaunch
from horovod.runner.hosts import is_local_host
from horovod.runner.network import interface_of
from horovod.runner.rendezvous import RendezvousInfo

__all__ = ["describe_job"]


def _hosts(launches: Sequence[WorkerLaunch]) -> List[str]:
    hosts: List[str] = []
    for launch in launches:
        if launch.hostname not in hosts:
            hosts.append(launch.hostname)
    return hosts


def describe_job(launches: Sequence[WorkerLaunch], rendezvous: Union[RendezvousInfo, Mapping[str, RendezvousInfo]],
                 backend: str, is_local: Callable[[str], bool] = is_local_host,
                 interface: Callable[[str], Optional[str]] = interface_of) -> List[str]:
    """The verbose report of a planned job, one line per entry.

    Args:
        launches: the planned workers (:func:`horovod.runner.pipeline.plan_launches`).
        rendezvous: the job's rendezvous, or one per host.
        backend: the name of the backend that starts them.
        is_local, interface: tell local hosts and an address's interface (parameters for tests).
    """
    hosts = _hosts(launches)
    remote = [h for h in hosts if not is_local(h)]
    slots = {h: sum(1 for w in launches if w.hostname == h) for h in hosts}
    lines = ["Filtering local host names."]
    if remote:
        lines.append("Remote host found: " + " ".join(remote))
    else:
        lines.append("All hosts are local, finding the interfaces with address 127.0.0.1")
    lines.append(f"Hosts and slots used: {', '.join(f'{h}:{slots[h]}' for h in hosts)} ({len(launches)} "
                 f"process(es), started by the {backend} backend)")
    for host in hosts:
        info = rendezvous[host] if isinstance(rendezvous, Mapping) else rendezvous
        nic = interface(info.addr) or "unknown interface"
        lines.append(f"Local interface found {nic}: workers on {host} reach the rendezvous at {info.addr}:{info.port}")
    for launch in sorted(launches, key=lambda w: w.rank):
        slot = launch.slot
        lines.append(f"Rank {slot.rank} on {slot.hostname} (local rank {slot.local_rank}/{slot.local_size}, cross "
                     f"rank {slot.cross_rank}/{slot.cross_size}): {' '.join(shlex.quote(a) for a in launch.command)}")
    return lines
