"""Workers started by someone else: ``mpirun`` (Open MPI, or MPICH/Intel MPI through PMI), Slurm's ``srun`` or
``torchrun``.

Such a worker has no ``HOROVOD_RANK``; its rank and the job's size come from the starter's variables
(``OMPI_COMM_WORLD_*``, ``PMI_*``, ``SLURM_*``, ``RANK``/``WORLD_SIZE``, see :func:`detect`). The workers meet through
a rendezvous store, found in this order: the one ``horovodrun --mpi`` serves (``HOROVOD_GLOO_RENDEZVOUS_ADDR``/
``PORT``); one that rank 0 serves at ``HOROVOD_RENDEZVOUS_ADDR``/``PORT``; under torchrun, one whose address rank 0
leaves in torchrun's agent store (:mod:`horovod.runtime.torchrun`), or at ``MASTER_ADDR``/``MASTER_PORT`` when
there is no agent store; under ``mpirun``/``srun`` with mpi4py installed, one agreed on over MPI
(:mod:`horovod.runtime.mpi_bootstrap`). Through it every rank publishes its node, and each derives its local and
cross ranks from that table, so they hold for any placement (block, cyclic, uneven) and agree on every rank.

Where rank 0 listens: under torchrun on one address only (:func:`listen_address`: the ``HOROVOD_GLOO_IFACE``
interface, loopback for a one-host job, else the address that routes toward ``MASTER_ADDR``), which it publishes;
a configured address is bound as given; over MPI every interface, because the ranks then probe which of rank 0's
addresses they all reach. Each rank's data listener binds the address that routes to the rendezvous.

Trust: an exported ``HOROVOD_SECRET_KEY`` (the same hex on every rank) is the job's secret on every path, and is
never sent anywhere. Without it, a rendezvous agreed on over MPI gets a fresh random secret sent over MPI, and one
agreed on through torchrun's agent store a fresh secret published there (which anyone who can reach that store may
read: rank 0 warns once, :mod:`horovod.runtime.torchrun`); for a configured one,
the key is derived from the job's id and the rendezvous address: that keeps two jobs from mixing by accident but
does not keep out someone who can reach the port and guess the id; rank 0 warns once (docs/cluster.md).
"""

from __future__ import annotations

import errno
import hashlib
import socket
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from horovod.common import config as _config
from horovod.common.exceptions import HorovodConfigError, HorovodInternalError, RendezvousError
from horovod.common.netaddr import first_interface_address, local_ipv4_addresses, source_address
from horovod.common.rendezvous_client import RendezvousClient, secret_from_hex
from horovod.common.starters import MPI_STARTERS, TORCH_STYLE, ExternalSlot, detect, env_int
from horovod.common.types import Topology
from horovod.runtime import mpi_bootstrap, torchrun

_ANY = "0.0.0.0"
_LOOPBACK = "127.0.0.1"


def placement(nodes: Sequence[str], rank: int) -> Tuple[int, int, int, int]:
    """``(local_rank, local_size, cross_rank, cross_size)`` of ``rank`` given every rank's node, in rank order.

    Local ranks number a node's ranks in rank order; the cross rank is the index of the rank's node among the nodes
    that have a rank with the same local rank, nodes ordered by their lowest rank (as ``horovodrun`` assigns them).
    """
    node = nodes[rank]
    same_node = [r for r, n in enumerate(nodes) if n == node]
    local_rank = same_node.index(rank)
    first_rank: Dict[str, int] = {}
    counts: Dict[str, int] = {}
    for r, n in enumerate(nodes):
        first_rank.setdefault(n, r)
        counts[n] = counts.get(n, 0) + 1
    peers = sorted((n for n, c in counts.items() if c > local_rank), key=first_rank.__getitem__)
    return local_rank, len(same_node), peers.index(node), len(peers)


def _derived_secret(slot: ExternalSlot, addr: str, port: int) -> bytes:
    return hashlib.sha256(f"horovod-py job without secret\0{slot.job_id}\0{addr}\0{port}".encode()).digest()


_served: Dict[Tuple[str, int], object] = {}  # rank 0's rendezvous servers, kept across shutdown()/init()


def _serve(addr: str, port: int, secret: bytes) -> int:
    """Serve the job's rendezvous on ``addr:port`` (``0.0.0.0``/0: every interface, a free port); returns the port."""
    if (addr, port) in _served:
        return _served[(addr, port)].port
    try:
        bind = socket.gethostbyname(addr)
    except OSError as exc:
        raise HorovodConfigError(f"HOROVOD_RENDEZVOUS_ADDR={addr!r} does not resolve: {exc}") from None
    from horovod.common.rendezvous_server import RendezvousServer     # (rank 0 under torchrun only)
    server = RendezvousServer(secret, host=bind, port=port)
    try:
        server.start()
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise HorovodConfigError(f"HOROVOD_RENDEZVOUS_ADDR={addr!r} ({bind}) is not an address of rank 0's host "
                                     f"{socket.gethostname()}; set it to the host that runs rank 0") from None
        raise HorovodConfigError(f"rank 0 cannot serve the rendezvous on {bind}:{port} "
                                 f"(HOROVOD_RENDEZVOUS_PORT): {exc.strerror or exc}") from None
    _served[(addr, port) if port else (addr, server.port)] = server
    return server.port


def _serve_fresh(secret: bytes) -> int:
    """A rendezvous on every interface and a free port (rank 0 of a job that meets through MPI, which then probes
    which of rank 0's addresses every rank reaches)."""
    return _serve(_ANY, 0, secret)


def one_host(env: Mapping[str, str]) -> bool:
    """Whether every rank of a ``torchrun`` job runs on this host: one agent (``GROUP_WORLD_SIZE``), as many local
    ranks as ranks, or a loopback ``MASTER_ADDR`` (only this host can reach it). A name that merely resolves to a
    loopback address here (``/etc/hosts`` maps the host's own name to 127.0.1.1 on Debian) does not count."""
    if env.get("GROUP_WORLD_SIZE", "").strip() == "1":
        return True
    local, world = env.get("LOCAL_WORLD_SIZE", "").strip(), env.get("WORLD_SIZE", "").strip()
    if local and local == world:
        return True
    master = env.get("MASTER_ADDR", "").strip().lower()
    return master == "localhost" or master.startswith("127.") or master in ("::1", "[::1]")


def listen_address(env: Mapping[str, str], ifaces: str = "",
                   route: Callable[[str], str] = source_address,
                   addresses: Callable[[], List[str]] = local_ipv4_addresses) -> str:
    """The one address rank 0 of a ``torchrun`` job serves the rendezvous on (and publishes), never every interface.

    In order: the first of the interfaces ``ifaces`` (``HOROVOD_GLOO_IFACE``) this host has; 127.0.0.1 for a job on
    one host (:func:`one_host`); else the local address the routing table uses toward ``MASTER_ADDR`` (a UDP
    ``connect``, no packet sent), or, when that is loopback (``MASTER_ADDR`` is this host's own name), this host's
    first address that is not. The ranks' data listeners follow: each binds the address that routes to the
    rendezvous (:mod:`horovod.core.bootstrap`), so on one host every listener of the job is on loopback.

    Raises:
        HorovodConfigError: none of ``ifaces`` has an IPv4 address here, or a multi-host job's rank 0 has no
            address but loopback.
    """
    if ifaces:
        chosen = first_interface_address(name.strip() for name in ifaces.split(",") if name.strip())
        if chosen is None:
            raise HorovodConfigError(f"none of the network interfaces {ifaces!r} (HOROVOD_GLOO_IFACE) has an IPv4 "
                                     f"address on host {socket.gethostname()}")
        return chosen
    if one_host(env):
        return _LOOPBACK
    try:
        chosen = route(socket.gethostbyname(env.get("MASTER_ADDR", "").strip()))
    except (OSError, UnicodeError):
        chosen = ""
    if chosen and not chosen.startswith("127."):
        return chosen
    routable = [a for a in addresses() if not a.startswith("127.")]
    if not routable:
        raise HorovodConfigError(f"rank 0's host {socket.gethostname()} has no address but loopback, and the job "
                                 f"spans hosts (WORLD_SIZE={env.get('WORLD_SIZE')}, LOCAL_WORLD_SIZE="
                                 f"{env.get('LOCAL_WORLD_SIZE')}); name the interface with HOROVOD_GLOO_IFACE")
    return routable[0]


def _put_until(client: RendezvousClient, scope: str, key: str, value: bytes, deadline: float) -> None:
    # Rank 0 may still be starting its server: keep trying until the start timeout.
    while True:
        try:
            client.put(scope, key, value)
            return
        except RendezvousError:
            if time.monotonic() >= deadline:
                raise


def _exchange_nodes(client: RendezvousClient, scope: str, slot: ExternalSlot, node: str, deadline: float
                    ) -> List[str]:
    _put_until(client, scope, str(slot.rank), node.encode(), deadline)
    if slot.rank == 0:
        nodes = [node] + [client.get(scope, str(r), timeout=max(0.1, deadline - time.monotonic())).decode()
                          for r in range(1, slot.size)]
        client.put(scope, "table", "\n".join(nodes).encode())
        return nodes
    nodes = client.get(scope, "table", timeout=max(0.1, deadline - time.monotonic())).decode().split("\n")
    if len(nodes) != slot.size or nodes[slot.rank] != node:
        raise HorovodInternalError(f"rank {slot.rank}: the rendezvous at {client.addr}:{client.port} holds another "
                                   f"job's node table ({len(nodes)} ranks, expected {slot.size})")
    return nodes


def _configured(cfg, slot: ExternalSlot, addr: str, port: int) -> Tuple[str, int, bytes]:
    """A rendezvous address given by variables: rank 0 serves it (unless the launcher does)."""
    if cfg.secret_key:
        secret = secret_from_hex(cfg.secret_key)
    else:
        secret = _derived_secret(slot, addr, port)
        if slot.rank == 0:
            print(f"horovod: HOROVOD_SECRET_KEY is not set: the rendezvous at {addr}:{port} is keyed by the job id "
                  f"only, and anyone who can reach it could join. Export the same random HOROVOD_SECRET_KEY "
                  f"(hex, e.g. `openssl rand -hex 32`) to every rank to close the job.", file=sys.stderr, flush=True)
    if slot.rank == 0:
        _serve(addr, port, secret)
    return addr, port, secret


def _rendezvous(cfg, env: Mapping[str, str], slot: ExternalSlot) -> Tuple[str, int, bytes]:
    """Where the job's ranks meet, and its secret: the launcher's, the configured one, or one agreed on through
    torchrun's agent store or over MPI."""
    if cfg.gloo_rendezvous_addr and cfg.gloo_rendezvous_port > 0:  # horovodrun --mpi serves it
        secret = secret_from_hex(cfg.secret_key) if cfg.secret_key else \
            _derived_secret(slot, cfg.gloo_rendezvous_addr, cfg.gloo_rendezvous_port)
        return cfg.gloo_rendezvous_addr, cfg.gloo_rendezvous_port, secret
    if cfg.rendezvous_addr and cfg.rendezvous_port > 0:
        return _configured(cfg, slot, cfg.rendezvous_addr, cfg.rendezvous_port)
    if slot.starter == torchrun.STARTER and torchrun.uses_agent_store(env):
        master = (env["MASTER_ADDR"], env_int(env, "MASTER_PORT"))

        def serve(secret: bytes) -> Tuple[str, int]:   # rank 0 only: the one address it listens on, published
            address = listen_address(env, cfg.gloo_iface)
            return address, _serve(address, 0, secret)

        return torchrun.meet(slot.rank, slot.size, slot.job_id, master, cfg.start_timeout, serve,
                             secret_from_hex(cfg.secret_key) if cfg.secret_key else None)
    if "MASTER_ADDR" in env and "MASTER_PORT" in env and slot.starter in (torchrun.STARTER, TORCH_STYLE):
        return _configured(cfg, slot, env["MASTER_ADDR"], env_int(env, "MASTER_PORT"))
    if slot.starter in MPI_STARTERS and mpi_bootstrap.available():
        return mpi_bootstrap.meet(mpi_bootstrap.world_communicator(), _serve_fresh,
                                  secret=secret_from_hex(cfg.secret_key) if cfg.secret_key else None)
    raise HorovodConfigError(
        f"rank {slot.rank} of {slot.size} was started by {slot.starter} without horovodrun; install mpi4py (the "
        f"ranks then meet over MPI), or set HOROVOD_RENDEZVOUS_ADDR (the host of rank 0) and HOROVOD_RENDEZVOUS_PORT "
        f"(a free port) on every rank, or start the job with horovodrun --mpi")


def _place(cfg, slot: ExternalSlot, node: str, addr: str, port: int, secret: bytes) -> Topology:
    deadline = time.monotonic() + cfg.start_timeout
    client = RendezvousClient(addr, port, secret, timeout=cfg.start_timeout)
    try:
        nodes = _exchange_nodes(client, f"{cfg.rendezvous_scope}.nodes", slot, node, deadline)
    except RendezvousError as exc:
        raise HorovodInternalError(f"rank {slot.rank} of {slot.size} ({slot.starter}): could not meet the other "
                                   f"ranks at {addr}:{port} within {cfg.start_timeout:g} s: {exc}") from None
    local_rank, local_size, cross_rank, cross_size = placement(nodes, slot.rank)
    return Topology(slot.rank, slot.size, local_rank, local_size, cross_rank, cross_size, node, addr, port, secret,
                    cfg.rendezvous_scope)


def resolve_communicator(cfg, comm) -> Topology:
    """The topology of a job made of the ranks of mpi4py communicator ``comm`` (``hvd.init(comm=...)``); every rank
    of ``comm`` must call it.

    Raises:
        HorovodInternalError: the ranks could not meet.
    """
    slot = ExternalSlot("mpi4py communicator", comm.Get_rank(), comm.Get_size(), job_id="comm")
    node = socket.gethostname()
    if slot.size == 1:
        return Topology(0, 1, 0, 1, 0, 1, node, scope=cfg.rendezvous_scope)
    addr, port, secret = mpi_bootstrap.meet(comm, _serve_fresh,
                                            secret=secret_from_hex(cfg.secret_key) if cfg.secret_key else None)
    return _place(cfg, slot, node, addr, port, secret)


def resolve_external(cfg, environ: Optional[Mapping[str, str]] = None):
    """The :class:`~horovod.runtime.topology.Topology` of a worker started by ``mpirun``, ``srun`` or ``torchrun``,
    else None.

    None also when ``horovodrun`` (or ``horovod.run``/``spawn_ranks``) set ``HOROVOD_RANK``, or for elastic
    workers: their launcher decided.

    Raises:
        HorovodConfigError: no way to meet is configured or available, or rank 0 cannot serve the rendezvous.
        HorovodInternalError: the ranks did not meet within the start timeout.
    """
    env = _config.environ_snapshot() if environ is None else environ
    if "HOROVOD_RANK" in env or cfg.elastic:
        return None  # a Horovod launcher (or the elastic driver) placed this worker
    slot = detect(env)
    if slot is None:
        return None
    node = (slot.node or socket.gethostname()).replace("\n", " ")
    if slot.size == 1:
        return Topology(0, 1, 0, 1, 0, 1, node, scope=cfg.rendezvous_scope)
    return _place(cfg, slot, node, *_rendezvous(cfg, env, slot))


__all__ = ["ExternalSlot", "detect", "placement", "one_host", "listen_address", "resolve_external",
           "resolve_communicator"]
