"""Where Ray put the workers, turned into Horovod's slots: pure functions over plain data, no Ray calls.

A Ray node is a host for Horovod: workers on one node share memory and number their ``local_rank`` there; workers
on different nodes (even several nodes on one machine, as Ray's multi-node test cluster makes them) meet over TCP.
A node is named ``<node ip>-<first 8 hex digits of its node id>``, stable for the node's life and unique when
several nodes share an address; the name is the worker's ``HOROVOD_HOSTNAME`` and an elastic slot key's host part.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from horovod.runner.hosts import HostInfo, SlotInfo, get_host_assignments

__all__ = ["node_hostname", "group_by_node", "static_slots", "slots_in_rank_order"]


def node_hostname(node_ip: str, node_id: str) -> str:
    """The host name Horovod uses for the Ray node ``node_id`` at ``node_ip``."""
    return f"{node_ip}-{node_id[:8]}"


def group_by_node(hostnames: Sequence[str]) -> List[int]:
    """A rank order for workers that landed on ``hostnames`` (by creation index): each node's workers contiguous,
    nodes in order of their first worker, workers of a node in creation order.

    Returns:
        ``order`` with ``order[rank]`` the creation index of the worker that gets ``rank``.
    """
    first: Dict[str, int] = {}
    for index, host in enumerate(hostnames):
        first.setdefault(host, index)
    return sorted(range(len(hostnames)), key=lambda i: (first[hostnames[i]], i))


def static_slots(hostnames: Sequence[str]) -> Tuple[List[int], List[SlotInfo]]:
    """Ranks and slots of a static job whose workers landed on ``hostnames`` (by creation index).

    The slots come from :func:`horovod.runner.hosts.get_host_assignments` over the nodes in order of their first
    worker, exactly as ``horovodrun -H node1:n1,node2:n2`` would assign them.

    Returns:
        ``(order, slots)``: ``order[rank]`` is the creation index of the worker of ``slots[rank]``.
    """
    order = group_by_node(hostnames)
    counts: Dict[str, int] = {}
    for index in order:
        counts[hostnames[index]] = counts.get(hostnames[index], 0) + 1
    hosts = [HostInfo(name, count) for name, count in counts.items()]
    return order, get_host_assignments(hosts, len(hostnames))


def slots_in_rank_order(hostnames: Sequence[str]) -> List[SlotInfo]:
    """Slots of workers whose ranks are fixed already (``hostnames[rank]``, as Ray Train numbers its workers).

    Local ranks number a node's workers in rank order; the cross rank is the node's index among the nodes that
    have a worker with the same local rank, nodes ordered by their lowest rank (as ``horovodrun`` assigns them).
    """
    size = len(hostnames)
    first: Dict[str, int] = {}
    local: List[int] = []
    per_node: Dict[str, int] = {}
    for host in hostnames:
        first.setdefault(host, len(local))
        local.append(per_node.get(host, 0))
        per_node[host] = local[-1] + 1
    slots = []
    for rank, host in enumerate(hostnames):
        peers = sorted((h for h, n in per_node.items() if n > local[rank]), key=first.__getitem__)
        slots.append(SlotInfo(host, rank, local[rank], peers.index(host), size, per_node[host], len(peers)))
    return slots
