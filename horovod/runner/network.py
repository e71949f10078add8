"""Which of the launcher's addresses its remote hosts can reach.

Without ``--network-interface``, the rendezvous is served on the address this machine's routing table uses toward
each remote host (interface names play no part, so they may differ from host to host); each remote host then
proves it can reach that address before any worker starts (:mod:`horovod.runner.ssh`). With
``--network-interface``, the named interfaces' addresses are used instead. Workers pick their own data-plane address
the same way, toward the rendezvous (``horovod.core.bootstrap``).
"""

from __future__ import annotations

import socket
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

from horovod.common.netaddr import first_interface_address, interface_address, interface_names, source_address



class NetworkError(ValueError):
    """No usable address: a host does not resolve or route, or no named interface has an IPv4 address here."""


def parse_nics(named: Union[None, str, Iterable[str]] = None, listed: Union[None, str, Iterable[str]] = None
               ) -> List[str]:
    """The interfaces of ``--network-interface`` (repeatable) then ``--network-interfaces`` (comma-separated).

    Each argument may be one name, a comma-separated string or a list of either; blanks and repeats are dropped.
    ``horovodrun`` and ``horovod.run`` both read their interface options with this.
    """
    nics: List[str] = []
    for given in (named, listed):
        for part in ([given] if isinstance(given, str) else list(given or ())):
            for name in str(part).split(","):
                if name.strip() and name.strip() not in nics:
                    nics.append(name.strip())
    return nics


def resolve_host(host: str) -> str:
    """The IPv4 address of ``host``.

    Raises:
        NetworkError: the name does not resolve.
    """
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise NetworkError(f"host {host!r} does not resolve: {exc.strerror or exc}") from None


def route_source(host: str) -> str:
    """The local address that the routing table uses to reach ``host`` (no packet is sent).

    Raises:
        NetworkError: the host does not resolve or there is no route to it.
    """
    target = resolve_host(host)
    try:
        return source_address(target)
    except OSError as exc:
        raise NetworkError(f"no route from this machine to host {host!r} ({target}): {exc.strerror or exc}") from None


def interface_of(address: str) -> Optional[str]:
    """The name of this machine's interface that holds IPv4 ``address``, or None."""
    return next((name for name in interface_names() if interface_address(name) == address), None)


def launcher_addresses(remote_hosts: Sequence[str], nics: Sequence[str] = ()) -> Dict[str, str]:
    """For each remote host, the launcher's address that host should use to reach the rendezvous.

    Args:
        remote_hosts: the hosts that are not this machine.
        nics: interfaces named by ``--network-interface(s)``; the first with an address here is used for all hosts.

    Raises:
        NetworkError: a host does not route, or none of ``nics`` has an IPv4 address on this machine.
    """
    if nics:
        address = first_interface_address(nics)
        if address is not None:
            return {host: address for host in remote_hosts}
        raise NetworkError(f"none of the network interfaces {', '.join(nics)} has an IPv4 address on this machine "
                           f"({socket.gethostname()}); interfaces here: {', '.join(interface_names())}")
    return {host: route_source(host) for host in remote_hosts}


def bind_addresses(by_host: Mapping[str, str]) -> List[str]:
    """The distinct addresses to serve the rendezvous on, in first-use order."""
    seen: List[str] = []
    for address in by_host.values():
        if address not in seen:
            seen.append(address)
    return seen


__all__ = ["NetworkError", "parse_nics", "resolve_host", "route_source", "interface_address", "interface_of",
           "launcher_addresses", "bind_addresses"]
