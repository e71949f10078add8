"""``horovod.runner.common.util.network``, as far as it makes sense here: address helpers over
:mod:`horovod.runner.network` and :mod:`horovod.runner.hosts`.

Horovod's module also holds its pickled-RPC services (``BasicService``/``BasicClient``); this runner has none (the
launcher and workers meet through the authenticated rendezvous store), so those names do not exist here.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Tuple, TypeVar

from horovod.common.netaddr import interface_address, interface_names
from horovod.runner.hosts import is_local_host
from horovod.runner.network import resolve_host

__all__ = ["resolve_host_address", "filter_local_addresses", "get_local_host_addresses", "get_local_intfs",
           "find_port"]

T = TypeVar("T")


def resolve_host_address(host_name: str) -> str:
    """The IPv4 address of ``host_name``.

    Raises:
        NetworkError: it does not resolve.
    """
    return resolve_host(host_name)


def filter_local_addresses(all_host_names: Iterable[str]) -> List[str]:
    """The names of ``all_host_names`` that are not this machine."""
    return [name for name in all_host_names if not is_local_host(name)]


def get_local_intfs() -> List[str]:
    """This machine's network interfaces that have an IPv4 address."""
    return [name for name in interface_names() if interface_address(name)]


def get_local_host_addresses() -> List[str]:
    """This machine's IPv4 addresses (one per interface that has one)."""
    return [address for address in (interface_address(name) for name in get_local_intfs()) if address]


def find_port(server_factory: Callable[[Tuple[str, int]], T]) -> Tuple[T, int]:
    """Create a server with ``server_factory(("", 0))`` on a free port; returns ``(server, port)``."""
    server = server_factory(("", 0))
    return server, server.server_address[1]
