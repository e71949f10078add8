"""``horovod.runner.common.util.hosts`` as Horovod has it, over :mod:`horovod.runner.hosts` (one implementation of
parsing and slot assignment)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from horovod.runner.hosts import HostInfo, SlotInfo, parse_hostfile, parse_hosts
from horovod.runner.hosts import get_host_assignments as _assign

__all__ = ["HostInfo", "SlotInfo", "INVALID_SLOT_INFO", "parse_hosts", "parse_host_files", "parse_hosts_and_slots",
           "get_host_assignments", "slot_response_string"]

# What the elastic rendezvous answers a worker that has no slot any more.
INVALID_SLOT_INFO = SlotInfo(hostname="", rank=-1, local_rank=-1, cross_rank=-1, size=-1, local_size=-1,
                             cross_size=-1)


def parse_host_files(filename: str) -> str:
    """A hostfile (``host slots=N`` lines) as a ``-H`` string: ``host1:2,host2:4``."""
    return ",".join(f"{h.hostname}:{h.slots}" for h in parse_hostfile(filename))


def parse_hosts_and_slots(hosts: str) -> Tuple[List[str], Dict[str, int]]:
    """``-H`` text as (host names in order, slots by host name).

    Raises:
        ValueError: an entry is not ``hostname:slots``.
    """
    parsed = parse_hosts(hosts)
    return [h.hostname for h in parsed], {h.hostname: h.slots for h in parsed}


def get_host_assignments(hosts: Sequence[HostInfo], min_np: int, max_np: Optional[int] = None) -> List[SlotInfo]:
    """Horovod's signature: as many ranks as there are slots (at most ``max_np``), at least ``min_np``.

    Raises:
        ValueError: fewer slots than ``min_np``.
    """
    slots = sum(h.slots for h in hosts)
    return _assign(hosts, max(min_np, slots if max_np is None else min(slots, max_np)))


def slot_response_string(slot: SlotInfo) -> str:
    """``rank,size,local_rank,local_size,cross_rank,cross_size`` (Horovod's ``SlotInfo.to_response_string``)."""
    return ",".join(str(v) for v in (slot.rank, slot.size, slot.local_rank, slot.local_size, slot.cross_rank,
                                     slot.cross_size))
