"""This machine's IPv4 addresses, and whether an address accepts connections: the little of networking that both
the launcher and workers started without one (``mpirun``, ``srun``) need."""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Iterable, List, Optional

__all__ = ["interface_address", "first_interface_address", "interface_names", "local_ipv4_addresses", "source_address",
           "accepts"]

_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> Optional[str]:
    """The IPv4 address of the interface ``name`` on this machine, or None if it has none."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None
    finally:
        probe.close()


def first_interface_address(names: Iterable[str]) -> Optional[str]:
    """The IPv4 address of the first of the interfaces ``names`` that has one on this machine, or None: a list of
    candidates lets hosts whose NICs are named differently share one setting."""
    return next((address for address in map(interface_address, names) if address is not None), None)


def interface_names() -> List[str]:
    """The names of this machine's network interfaces (for messages that say which there are)."""
    return [name for _, name in socket.if_nameindex()]


def local_ipv4_addresses() -> List[str]:
    """This machine's IPv4 addresses, one per interface that has one, loopback ones last."""
    found = [a for a in map(interface_address, interface_names()) if a]
    unique = list(dict.fromkeys(found))
    return [a for a in unique if not a.startswith("127.")] + [a for a in unique if a.startswith("127.")]


def source_address(addr: str, port: int = 9) -> str:
    """The local address the routing table uses to reach ``addr`` (an IPv4 address; no packet is sent).

    Raises:
        OSError: there is no route to it.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((addr, max(port, 1)))
        return probe.getsockname()[0]
    finally:
        probe.close()


def accepts(addr: str, port: int, timeout: float) -> bool:
    """Whether ``addr:port`` accepts a TCP connection within ``timeout`` seconds."""
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return True
    except OSError:
        return False
