"""Hosts and slots: parse ``-H``/``--hostfile``, decide which rank runs where, tell local hosts from remote ones.

Everything here except :func:`is_local_host` is a pure function over plain data. Ranks fill hosts in the order they
are given, each host's slots before the next host's, as Horovod assigns them.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from typing import Dict, Iterable, List, Optional, Sequence

_HOST_SLOTS = re.compile(r"^([\w.\-]+):([0-9]+)$")
_HOSTNAME = re.compile(r"^[\w.\-]+$")
_SLOTS_FIELD = re.compile(r"^slots=([0-9]+)$")


@dataclasses.dataclass(frozen=True)
class HostInfo:
    """One host and how many workers it may run."""

    hostname: str
    slots: int


@dataclasses.dataclass(frozen=True)
class SlotInfo:
    """Where one rank runs and its place in the job's topology (Horovod's rank/local/cross triple)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def _checked_slots(text: str, where: str) -> int:
    slots = int(text)
    if slots < 1:
        raise ValueError(f"{where}: a host needs at least 1 slot, got {slots}")
    return slots


def parse_hosts(text: str) -> List[HostInfo]:
    """Parse ``-H``/``--hosts``: ``host1:2,host2:4``.

    Args:
        text: comma-separated ``hostname:slots`` entries.

    Returns:
        The hosts, in the given order.

    Raises:
        ValueError: an entry is not ``hostname:slots``, a slot count is below 1, or a host is listed twice.
    """
    if not text or not text.strip():
        raise ValueError("-H/--hosts is empty; expected host1:slots,host2:slots")
    hosts = []
    for entry in text.split(","):
        match = _HOST_SLOTS.match(entry.strip())
        if not match:
            raise ValueError(f"invalid host entry {entry.strip()!r} in -H/--hosts {text!r}; "
                             f"expected hostname:slots, e.g. localhost:4")
        hosts.append(HostInfo(match.group(1), _checked_slots(match.group(2), f"host {entry.strip()!r}")))
    return _no_duplicates(hosts, "-H/--hosts")


def parse_hostfile_text(text: str, source: str = "hostfile") -> List[HostInfo]:
    """Parse a hostfile: one ``hostname slots=N`` per line; ``#`` comments and blank lines are ignored.

    A line with a host name alone means one slot, as in Horovod (and Open MPI's hostfiles).

    Args:
        text: the file's contents.
        source: name used in error messages.

    Returns:
        The hosts, in file order.

    Raises:
        ValueError: a line is malformed (the message gives its number), or the file names no host.
    """
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source} line {number} ({raw.strip()!r})"
        if not _HOSTNAME.match(fields[0]) or len(fields) > 2:
            raise ValueError(f"{where}: expected 'hostname slots=N'")
        slots = 1
        if len(fields) == 2:
            match = _SLOTS_FIELD.match(fields[1])
            if not match:
                raise ValueError(f"{where}: expected 'slots=N' after the host name, got {fields[1]!r}")
            slots = _checked_slots(match.group(1), where)
        hosts.append(HostInfo(fields[0], slots))
    if not hosts:
        raise ValueError(f"{source} names no host")
    return _no_duplicates(hosts, source)


def parse_hostfile(path: str) -> List[HostInfo]:
    """Read and parse a hostfile (see :func:`parse_hostfile_text`).

    Raises:
        ValueError: the file cannot be read or is malformed.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ValueError(f"cannot read hostfile {path!r}: {exc.strerror}") from None
    return parse_hostfile_text(text, source=f"hostfile {path!r}")


def _no_duplicates(hosts: List[HostInfo], source: str) -> List[HostInfo]:
    seen = set()
    for host in hosts:
        if host.hostname in seen:
            raise ValueError(f"host {host.hostname!r} is listed twice in {source}; give it once with all its slots")
        seen.add(host.hostname)
    return hosts


def get_host_assignments(hosts: Sequence[HostInfo], num_proc: int) -> List[SlotInfo]:
    """Assign ``num_proc`` ranks to the hosts' slots.

    Ranks fill the first host's slots, then the next host's. A host's local size is the number of its slots in use;
    the cross rank of a worker is the index of its host among the hosts that have a worker with the same local rank.

    Args:
        hosts: hosts in order of preference.
        num_proc: number of workers.

    Returns:
        One :class:`SlotInfo` per rank, ordered by rank.

    Raises:
        ValueError: ``num_proc`` is below 1 or exceeds the total number of slots.
    """
    if num_proc < 1:
        raise ValueError(f"the number of processes must be at least 1, got {num_proc}")
    available = sum(h.slots for h in hosts)
    if num_proc > available:
        raise ValueError(f"requested more processes ({num_proc}) than there are available slots ({available}) "
                         f"on hosts {', '.join(f'{h.hostname}:{h.slots}' for h in hosts)}")
    placed = []  # (hostname, local_rank) per rank
    for host in hosts:
        for local_rank in range(host.slots):
            if len(placed) == num_proc:
                break
            placed.append((host.hostname, local_rank))
    local_size: Dict[str, int] = {}
    for hostname, _ in placed:
        local_size[hostname] = local_size.get(hostname, 0) + 1
    hosts_by_local_rank: Dict[int, List[str]] = {}
    for hostname, local_rank in placed:
        hosts_by_local_rank.setdefault(local_rank, []).append(hostname)
    return [SlotInfo(hostname=hostname, rank=rank, local_rank=local_rank,
                     cross_rank=hosts_by_local_rank[local_rank].index(hostname), size=num_proc,
                     local_size=local_size[hostname], cross_size=len(hosts_by_local_rank[local_rank]))
            for rank, (hostname, local_rank) in enumerate(placed)]


def resolve_hosts(num_proc: int, hosts: Optional[str] = None, hostfile: Optional[str] = None) -> List[HostInfo]:
    """The hosts of a job: ``-H``, else ``--hostfile``, else ``localhost:<num_proc>``.

    Raises:
        ValueError: both ``hosts`` and ``hostfile`` are given, or either is malformed.
    """
    if hosts and hostfile:
        raise ValueError("give either -H/--hosts or --hostfile, not both")
    if hosts:
        return parse_hosts(hosts)
    if hostfile:
        return parse_hostfile(hostfile)
    return [HostInfo("localhost", num_proc)]


def _local_names() -> Iterable[str]:
    yield "localhost"
    name = socket.gethostname()
    yield name
    yield name.split(".")[0]
    try:
        # /etc/hosts answers this without the network on sane machines; a failure only makes a host look remote.
        _, aliases, addresses = socket.gethostbyname_ex(name)
        yield from aliases
        yield from addresses
    except OSError:
        pass


def is_local_host(hostname: str) -> bool:
    """Whether ``hostname`` names this machine: ``localhost``, a 127.x address, or this machine's name or address."""
    if hostname == "localhost" or hostname.startswith("127.") or hostname in ("::1", "0.0.0.0"):
        return True
    return hostname in set(_local_names())


__all__ = ["HostInfo", "SlotInfo", "parse_hosts", "parse_hostfile", "parse_hostfile_text", "get_host_assignments",
           "resolve_hosts", "is_local_host"]
