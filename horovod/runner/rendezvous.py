"""The job's rendezvous as the launcher serves it: one store, one fresh secret, on the addresses workers can reach.

Every backend uses these the same way: decide where each host's workers reach the launcher
(:func:`plan_rendezvous`), serve the store there (:class:`RendezvousPool`, or :func:`rendezvous_service` for a job
on this machine only), and hand each worker the :class:`RendezvousInfo` of its host through its environment
(:func:`horovod.runner.pipeline.worker_env`). The server itself lives in :mod:`horovod.common.rendezvous_server`
because rank 0 of a job started by ``mpirun`` or ``srun`` serves it too, and workers never import the runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from horovod.common.rendezvous_client import make_secret
from horovod.common.rendezvous_server import KVStore, RendezvousServer
from horovod.runner import network
from horovod.runner.hosts import is_local_host

__all__ = ["KVStore", "RendezvousServer", "RendezvousInfo", "RendezvousPool", "rendezvous_service",
           "multihost_rendezvous", "plan_rendezvous", "remote_hosts", "LOOPBACK"]

LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class RendezvousInfo:
    """Where workers find the rendezvous service, and the job secret they sign requests with."""

    addr: str
    port: int
    secret: bytes
    scope: Optional[str] = None


def remote_hosts(hostnames: Sequence[str]) -> List[str]:
    """The hosts of ``hostnames`` that are not this machine, in order, each once."""
    remote: List[str] = []
    for host in hostnames:
        if host not in remote and not is_local_host(host):
            remote.append(host)
    return remote


def plan_rendezvous(hostnames: Sequence[str], nics: Sequence[str] = ()) -> Dict[str, str]:
    """For every host of the job, the launcher address its workers use for the rendezvous.

    Remote hosts get the address that routes to them (or the named interface's); local hosts get the first of those
    addresses, never loopback, so that what their workers publish is reachable from the other hosts. A job on this
    machine only gets loopback.

    Raises:
        NetworkError: a host does not resolve or route, or no named interface exists here.
    """
    by_host = network.launcher_addresses(remote_hosts(hostnames), nics)
    first = network.bind_addresses(by_host)[0] if by_host else LOOPBACK
    return {h: by_host.get(h, first) for h in hostnames}


class RendezvousPool:
    """One store and one fresh secret, served on each address asked for (an elastic job meets hosts as it goes).

    :meth:`serve` starts a server on an address the first time it is asked for; :meth:`close` stops them all.
    """

    def __init__(self, scope: Optional[str] = None):
        self.secret = make_secret()
        self.store = KVStore()
        self.scope = scope
        self._servers: Dict[str, RendezvousServer] = {}

    def serve(self, address: str) -> RendezvousInfo:
        """Where workers find the store on ``address`` (a server there is started once)."""
        server = self._servers.get(address)
        if server is None:
            server = RendezvousServer(self.secret, host=address, port=0)
            server.store = self.store  # every address serves the same job
            server.start()
            self._servers[address] = server
        return RendezvousInfo(address, server.port, self.secret, self.scope)

    def serve_for(self, host: str, nics: Sequence[str] = (), local_address: str = LOOPBACK) -> RendezvousInfo:
        """Where ``host``'s workers find the store: ``local_address`` for this machine, else the address that routes
        to ``host`` (or ``nics``'), served from now on.

        Raises:
            NetworkError: the host does not resolve or route, or no named interface exists here.
        """
        if is_local_host(host):
            return self.serve(local_address)
        return self.serve(network.launcher_addresses([host], nics)[host])

    @property
    def exhausted(self) -> Optional[str]:
        """Why one of the pool's servers could not take a connection for want of descriptors (the first such
        server's words: the limits and the fix), or None while none ran out."""
        return next((s.exhausted for s in self._servers.values() if s.exhausted), None)

    def close(self) -> None:
        """Stop every server of the pool."""
        for server in self._servers.values():
            server.stop()
        self._servers = {}

    def __enter__(self) -> "RendezvousPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def multihost_rendezvous(addresses: Mapping[str, str], scope: Optional[str] = None
                         ) -> Iterator[Tuple[RendezvousPool, Dict[str, RendezvousInfo]]]:
    """Serve one store, with one fresh secret, on each distinct address of ``addresses`` (host → address).

    Yields:
        The pool (its ``store`` shared by every address, its ``exhausted`` saying whether a server ran out of
        descriptors) and, per host, the :class:`RendezvousInfo` its workers get.
    """
    with RendezvousPool(scope) as pool:
        served = {a: pool.serve(a) for a in network.bind_addresses(addresses)}
        yield pool, {h: served[a] for h, a in addresses.items()}


@contextlib.contextmanager
def rendezvous_service(host: str = LOOPBACK, scope: Optional[str] = None
                       ) -> Iterator[Tuple[RendezvousServer, RendezvousInfo]]:
    """Serve a fresh rendezvous store with a fresh job secret on ``host`` for the duration of the block."""
    secret = make_secret()
    server = RendezvousServer(secret, host=host, port=0)
    port = server.start()
    try:
        yield server, RendezvousInfo(host, port, secret, scope)
    finally:
        server.stop()
