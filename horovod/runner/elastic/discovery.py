"""Where an elastic job's hosts come from: a discovery script polled about once a second, or a fixed list."""

from __future__ import annotations

import subprocess
from typing import List, Optional, Sequence

from horovod.runner.hosts import HostInfo

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
_SCRIPT_TIMEOUT_SECS = 30.0


class HostDiscoveryError(RuntimeError):
    """The discovery script failed or printed something that is not ``host`` or ``host:slots``."""


def parse_discovery_output(text: str, default_slots: int) -> List[HostInfo]:
    """Hosts from the script's output: one ``host`` or ``host:slots`` per line; blank lines are ignored.

    Raises:
        HostDiscoveryError: a malformed line or a slot count below 1.
    """
    hosts, seen = [], set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, slots_text = line.partition(":")
        try:
            slots = int(slots_text) if sep else default_slots
        except ValueError:
            raise HostDiscoveryError(f"host discovery printed {line!r}; expected 'host' or 'host:slots'") from None
        if not name or slots < 1:
            raise HostDiscoveryError(f"host discovery printed {line!r}; expected 'host' or 'host:slots' with "
                                     f"slots >= 1")
        if name not in seen:
            seen.add(name)
            hosts.append(HostInfo(name, slots))
    return hosts


class HostDiscovery:
    """Horovod's base class of host discovery: ``find_available_hosts_and_slots()`` says which hosts can run
    workers now and with how many slots each (Ray's elastic executor and user subclasses override it)."""

    def find_available_hosts_and_slots(self):
        """The hosts available now: a list of :class:`~horovod.runner.hosts.HostInfo` here, a ``{hostname: slots}``
        dict in Horovod's subclasses."""
        raise NotImplementedError()


class HostDiscoveryScript(HostDiscovery):
    """Runs ``script`` (through the shell) and parses its output; ``slots`` is used for lines without a count."""

    def __init__(self, script: str, slots: Optional[int] = None, timeout: float = _SCRIPT_TIMEOUT_SECS):
        self.script = script
        self.default_slots = slots or 1
        self.timeout = timeout

    def find_available_hosts_and_slots(self) -> List[HostInfo]:
        """The hosts the script prints now.

        Raises:
            HostDiscoveryError: the script exited non-zero, timed out or printed a malformed line.
        """
        try:
            proc = subprocess.run(self.script, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostDiscoveryError(f"host discovery script {self.script!r} ran over {self.timeout:.0f}s") from None
        if proc.returncode != 0:
            raise HostDiscoveryError(f"host discovery script {self.script!r} exited with status {proc.returncode}: "
                                     f"{proc.stderr.strip()[-500:]}")
        return parse_discovery_output(proc.stdout, self.default_slots)


def hosts_of(found) -> List[HostInfo]:
    """What a discovery's ``find_available_hosts_and_slots()`` returned, as hosts: ours return
    :class:`~horovod.runner.hosts.HostInfo` lists, Horovod's (and the subclasses its users write) a
    ``{hostname: slots}`` dict, kept in its order.

    Raises:
        HostDiscoveryError: neither, or a slot count that is not a positive integer.
    """
    if isinstance(found, dict):
        hosts = []
        for name, slots in found.items():
            if not isinstance(name, str) or not name or isinstance(slots, bool) or not isinstance(slots, int) \
                    or slots < 1:
                raise HostDiscoveryError(f"host discovery returned {name!r}: {slots!r}; expected a hostname and a "
                                         f"slot count of at least 1")
            hosts.append(HostInfo(name, slots))
        return hosts
    hosts = list(found) if isinstance(found, (list, tuple)) else None
    if hosts is None or any(not isinstance(h, HostInfo) for h in hosts):
        raise HostDiscoveryError(f"host discovery returned {found!r:.200}; expected a {{hostname: slots}} dict or "
                                 f"a list of HostInfo")
    return hosts


class FixedHosts(HostDiscovery):
    """The hosts of ``-H``/``--hostfile`` for an elastic job: always the same."""

    def __init__(self, hosts: Sequence[HostInfo]):
        self.hosts = list(hosts)

    def find_available_hosts_and_slots(self) -> List[HostInfo]:
        """The fixed hosts."""
        return list(self.hosts)


__all__ = ["HostDiscovery", "HostDiscoveryScript", "FixedHosts", "HostDiscoveryError", "parse_discovery_output",
           "hosts_of", "DISCOVER_HOSTS_FREQUENCY_SECS"]
