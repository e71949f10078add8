"""This machine's IPv4 addresses, and whether an address accepts connections: the little of networking that both
the launcher and workers started without one (``mpirun``, ``srun``) need."""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import List, Optional

__all__ = ["interface_address", "local_ipv4_addresses", "accepts"]

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


def local_ipv4_addresses() -> List[str]:
    """This machine's IPv4 addresses, one per interface that has one, loopback ones last."""
    found = [a for a in (interface_address(name) for _, name in socket.if_nameindex()) if a]
    unique = list(dict.fromkeys(found))
    return [a for a in unique if not a.startswith("127.")] + [a for a in unique if a.startswith("127.")]


def accepts(addr: str, port: int, timeout: float) -> bool:
    """Whether ``addr:port`` accepts a TCP connection within ``timeout`` seconds."""
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return True
    except OSError:
        return False
