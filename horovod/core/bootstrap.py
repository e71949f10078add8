"""Bring up this rank's transport: publish our data-plane address through the rendezvous, learn every peer's.

Connections themselves are opened when a collective first needs them (:mod:`horovod.transport.mesh`); ``init``
waits only until every rank has published. Up to :data:`DIRECT_RECORDS_MAX_RANKS` ranks, each rank reads every
record in one request; in a larger job only rank 0 does, and the records travel down the negotiation tree (rank
``r`` hands them to its children, ``3r + 1`` to ``3r + 3``, over connections the tree uses anyway), so the launcher
holds one waiting request instead of one per rank.

The address we publish is the one this host uses to reach the rendezvous server (or the interface named by
``HOROVOD_GLOO_IFACE``): an address our peers can reach, found by routing rather than guessed from interface names.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable, Dict, List, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError, RendezvousError
from horovod.common.netaddr import first_interface_address, source_address
from horovod.common.rendezvous_client import RendezvousClient
from horovod.core.negotiation.frames import Records, receive
from horovod.core.negotiation.tree_shape import children, parent
from horovod.transport.mesh import raise_descriptor_limit
from horovod.transport.tcp import TcpTransport

_log = logging.getLogger("horovod")

__all__ = ["DIRECT_RECORDS_MAX_RANKS", "rendezvous_client", "connect", "RankBoard"]

DIRECT_RECORDS_MAX_RANKS = 16


def _routable_address(rendezvous_addr: str, port: int) -> str:
    try:
        return source_address(rendezvous_addr, port)
    except OSError:
        return "127.0.0.1"


def _interface_address(ifaces: str) -> str:
    # A comma-separated list names candidates: the first one this host has is used.
    address = first_interface_address(name.strip() for name in ifaces.split(",") if name.strip())
    if address is None:
        raise HorovodInternalError(f"none of the network interfaces {ifaces!r} (HOROVOD_GLOO_IFACE) has an IPv4 "
                                   f"address on host {socket.gethostname()}")
    return address


def rendezvous_client(config, topo) -> RendezvousClient:
    """A client of the launcher's rendezvous service for this rank.

    Raises:
        HorovodInternalError: no rendezvous address, or no job secret (the job was not started by a launcher).
    """
    if not topo.rendezvous_addr or topo.rendezvous_port <= 0:
        raise HorovodInternalError(
            f"rank {topo.rank} of {topo.size}: no rendezvous server (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT unset). "
            f"Start multi-process jobs with horovodrun or horovod.run.")
    if not topo.secret:
        raise HorovodInternalError("HOROVOD_SECRET_KEY is not set; the launcher hands it to every worker")
    return RendezvousClient(topo.rendezvous_addr, topo.rendezvous_port, topo.secret, timeout=config.start_timeout)


def connect(config, topo, scope: str, abandoned: Optional[Callable[[], bool]] = None) -> TcpTransport:
    """This rank's transport, once every rank of the job has published its address, bounded by the start timeout.

    ``abandoned`` (elastic jobs) says, when asked now and then, that the round this mesh is for was given up (a
    peer died during start-up): the wait then ends at once with HorovodInternalError instead of at the timeout.
    """
    rank, size = topo.rank, topo.size
    raise_descriptor_limit()
    client = rendezvous_client(config, topo)
    transport = TcpTransport(rank, size, client.secret, config.gloo_timeout_seconds, job_token=scope,
                             liveness=config.liveness_timeout, busy_bound=config.busy_peer_timeout_seconds)
    if config.gloo_iface:
        host = _interface_address(config.gloo_iface)
    else:
        host = _routable_address(topo.rendezvous_addr, topo.rendezvous_port)
    port = transport.listen(host)  # only where peers are told to dial, not on every interface
    deadline = time.monotonic() + config.start_timeout
    by_tree = size > DIRECT_RECORDS_MAX_RANKS
    try:
        client.put(scope, str(rank), (f"{host}:{port} {topo.hostname} {_agreed_settings(config)} "
                                      f"{transport.unix_name or '-'} {os.cpu_count() or 1}").encode())
        if by_tree and rank > 0:
            texts = _records_from_parent(transport, deadline, abandoned)
        else:
            texts = _all_published(client, scope, size, deadline, abandoned)
        published = [_parse_record(text) for text in texts]
    except (RendezvousError, HorovodInternalError, ValueError) as exc:
        transport.close()
        if isinstance(exc, HorovodInternalError):
            raise
        raise HorovodInternalError(f"rank {rank}: rendezvous failed: {exc}") from None
    addresses = {peer: record[0] for peer, record in enumerate(published) if peer != rank}
    unix_names = {peer: record[3] for peer, record in enumerate(published)
                  if peer != rank and record[1] == topo.hostname and record[3] != "-"}
    transport.set_layout([hostname for _, hostname, _, _, _ in published], [cores for *_, cores in published])
    mismatch = _settings_mismatch([settings for _, _, settings, _, _ in published])
    if mismatch:
        transport.close()
        raise HorovodInternalError(mismatch)
    _log.debug("rank %d: mesh %s listens on %s:%d; %d peers known (%d on this host)", rank, scope, host, port,
               len(addresses), len(unix_names))
    transport.connect(addresses, config.start_timeout, unix_names, abandoned)
    transport.loss_board = RankBoard(client, f"{scope}.lost")
    transport.patience.board = RankBoard(client, f"{scope}.waits")
    if by_tree:
        for child in children(rank, size):
            transport.send_obj(child, Records(texts).encode())
    return transport


def _records_from_parent(transport: TcpTransport, deadline: float, abandoned: Optional[Callable[[], bool]]
                         ) -> List[str]:
    """Every rank's record, as this rank's parent in the tree hands them down (it dials us with them)."""
    up = parent(transport.rank)
    transport.await_dial(up, deadline, abandoned)
    texts = receive(transport, up, Records).texts
    if len(texts) != transport.size:
        raise HorovodInternalError(f"rank {transport.rank}: rank {up} sent {len(texts)} start-up records for a job "
                                   f"of {transport.size}")
    return texts


class RankBoard:
    """A page of the job's rendezvous store where each rank posts one text, read by all.

    Two boards per job: the loss board, where a rank whose transport failed posts its account before it hangs up
    (connections open on demand, so most ranks learn of a lost rank from a neighbour that hung up on them; reading
    the neighbour's post, they name the rank that was really lost), and the waits board, where a rank waiting on a
    live but silent peer posts whom it waits on (:mod:`horovod.transport.patience`).
    """

    TIMEOUT = 1.0       # a rendezvous that does not answer within this only loses the account

    def __init__(self, client: RendezvousClient, scope: str):
        self._client = RendezvousClient(client.addr, client.port, client.secret, timeout=self.TIMEOUT)
        self._scope = scope

    def read(self) -> Dict[int, str]:
        """Every text posted so far, by the rank that posted it."""
        items = self._client.get_all(self._scope, 0, timeout=0.0, grace=self.TIMEOUT)
        return {int(key): value.decode(errors="replace") for key, value in items.items() if key.isdigit()}

    def post(self, rank: int, account: str) -> None:
        """Post this rank's text (replacing its earlier one)."""
        self._client.put(self._scope, str(rank), account.encode()[:4096])


def _all_published(client: RendezvousClient, scope: str, size: int, deadline: float,
                   abandoned: Optional[Callable[[], bool]] = None) -> List[str]:
    """Every rank's record (see :func:`_parse_record`), once all have published; asks ``abandoned`` every second."""
    while True:
        left = max(0.1, deadline - time.monotonic())
        try:
            items = client.get_all(scope, size, timeout=left if abandoned is None else min(left, 1.0))
            break
        except RendezvousError:
            if time.monotonic() >= deadline:
                raise HorovodInternalError(_unregistered(client, scope, size)) from None
            if abandoned is None:
                raise
            if abandoned():
                raise HorovodInternalError(f"the round of {scope} was given up: a peer failed while it "
                                           f"formed") from None
    missing = [peer for peer in range(size) if str(peer) not in items]
    if missing:
        raise RendezvousError(f"rendezvous scope {scope} lacks ranks {missing[:8]}")
    return [items[str(peer)].decode() for peer in range(size)]


def _unregistered(client: RendezvousClient, scope: str, size: int) -> str:
    """Which ranks never published their address, for the start timeout's error."""
    try:
        present = {int(key) for key in client.keys(scope) if key.isdigit()}
    except RendezvousError:
        present = set()
    missing = [rank for rank in range(size) if rank not in present]
    shown = ", ".join(map(str, missing[:16])) + (f" and {len(missing) - 16} more" if len(missing) > 16 else "")
    return (f"ranks {shown} of {size} did not register within the start timeout (HOROVOD_START_TIMEOUT): their "
            f"processes did not reach hvd.init(), or their hosts cannot reach the launcher at "
            f"{client.addr}:{client.port}" if missing else
            "the rendezvous did not answer with every rank's address within the start timeout")


# Settings that choose algorithms or give cache bits their meaning: every rank must use the same values, or the
# ranks would disagree on which bytes travel where. Under peer negotiation every rank plans fusion and stall
# failures itself, so the settings those decisions read must agree too.
_AGREED = ("cache_capacity", "shm_disable", "shm_min_bytes", "hierarchical_allreduce", "negotiation", "autotune",
           "fusion_threshold", "disable_group_fusion", "stall_check_disable", "stall_check_time_seconds",
           "stall_shutdown_time_seconds")


def _agreed_settings(config) -> str:
    return ",".join(f"{name}={getattr(config, name)}" for name in _AGREED)


def _settings_mismatch(per_rank) -> str:
    for position, name in enumerate(_AGREED):
        values = [settings.split(",")[position] if settings else "" for settings in per_rank]
        if len(set(values)) > 1:
            listing = ", ".join(f"rank {r}: {v.partition('=')[2] or '?'}" for r, v in enumerate(values))
            return (f"HOROVOD_{name.upper()} differs between ranks ({listing}); every rank of a job must use the "
                    f"same value")
    return ""


def _parse_record(text: str) -> Tuple[Tuple[str, int], str, str, str, int]:
    """A peer's record: its TCP address, host identity, agreed settings, Unix socket name ("-" for none) and the
    number of cores of its host."""
    address, hostname, settings, unix_name, cores = (text.split(" ") + ["", "", "-", "1"])[:5]
    peer_host, _, peer_port = address.rpartition(":")
    return (peer_host, int(peer_port)), hostname, settings, unix_name, int(cores) if cores.isdigit() else 1
