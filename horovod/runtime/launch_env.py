"""Workers started by someone else: ``mpirun`` (Open MPI, or MPICH/Intel MPI through PMI) or Slurm's ``srun``.

Such a worker has no ``HOROVOD_RANK``; its rank and the job's size come from the starter's variables
(``OMPI_COMM_WORLD_*``, ``PMI_*``, ``SLURM_*``, see :func:`detect`). The workers meet through a rendezvous store:
the one ``horovodrun --mpi`` serves (``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``), or else one that rank 0 serves at
``HOROVOD_RENDEZVOUS_ADDR``/``PORT``. Through it every rank publishes its node, and each derives its local and cross
ranks from that table, so they hold for any placement (block, cyclic, uneven) and agree on every rank.

Trust: with ``HOROVOD_SECRET_KEY`` set (the same hex on every rank) the job is closed to anyone without it. Without
it, the key is derived from the job's id and the rendezvous address: that keeps two jobs from mixing by accident but
does not keep out someone who can reach the port and guess the id; rank 0 warns once (docs/cluster.md).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import socket
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from horovod.common import config as _config
from horovod.common.exceptions import HorovodConfigError, HorovodInternalError, RendezvousError
from horovod.common.rendezvous_client import RendezvousClient, secret_from_hex
from horovod.common.rendezvous_server import RendezvousServer
from horovod.common.types import Topology

# Slurm's batch step (the sbatch script itself) and its other pseudo-steps have ids at the top of the 32-bit range;
# only a task step (srun) starts the job's workers.
_SLURM_PSEUDO_STEPS = 0xFFFFFFF0


@dataclasses.dataclass(frozen=True)
class ExternalSlot:
    """What the starter tells a worker: who started it, its rank, the job's size, its node and the job's id."""

    starter: str
    rank: int
    size: int
    node: Optional[str] = None
    job_id: str = ""


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name].strip())
    except ValueError:
        raise HorovodConfigError(f"{name}={env[name]!r} is not an integer") from None


def detect(env: Mapping[str, str]) -> Optional[ExternalSlot]:
    """The slot given by ``mpirun`` or ``srun`` variables in ``env``, or None if neither started this process.

    Open MPI's ``OMPI_COMM_WORLD_RANK``/``SIZE`` win over PMI's ``PMI_RANK``/``PMI_SIZE``, which win over Slurm's
    ``SLURM_PROCID`` and ``SLURM_STEP_NUM_TASKS`` (or ``SLURM_NTASKS``), so ``mpirun`` inside a Slurm allocation is
    seen as ``mpirun``. Slurm counts only inside a task step (``SLURM_STEP_ID`` set and not the batch script).

    Raises:
        HorovodConfigError: a variable does not parse, or the rank is outside the size.
    """
    slot = None
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        slot = ExternalSlot("mpirun (Open MPI)", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                            job_id=env.get("OMPI_MCA_ess_base_jobid", env.get("OMPI_MCA_orte_hnp_uri", "")))
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        slot = ExternalSlot("mpirun (PMI)", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                            job_id=env.get("PMI_KVSNAME", env.get("PMI_ID", "")))
    elif "SLURM_PROCID" in env and _slurm_task_step(env):
        tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        if tasks not in env:
            raise HorovodConfigError("SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is")
        node = env.get("SLURMD_NODENAME") or (f"slurm-node-{env['SLURM_NODEID']}" if "SLURM_NODEID" in env else None)
        slot = ExternalSlot("srun (Slurm)", _int(env, "SLURM_PROCID"), _int(env, tasks), node,
                            job_id=f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}")
    if slot is not None and not 0 <= slot.rank < slot.size:
        raise HorovodConfigError(f"{slot.starter} gave rank {slot.rank} outside 0..{slot.size - 1}")
    return slot


def _slurm_task_step(env: Mapping[str, str]) -> bool:
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if step is None:
        return False
    try:
        return int(step) < _SLURM_PSEUDO_STEPS
    except ValueError:
        return False  # "batch", "extern", "interactive"


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


def _serve(addr: str, port: int, secret: bytes) -> None:
    if (addr, port) in _served:
        return
    try:
        bind = socket.gethostbyname(addr)
    except OSError as exc:
        raise HorovodConfigError(f"HOROVOD_RENDEZVOUS_ADDR={addr!r} does not resolve: {exc}") from None
    server = RendezvousServer(secret, host=bind, port=port)
    try:
        server.start()
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise HorovodConfigError(f"HOROVOD_RENDEZVOUS_ADDR={addr!r} ({bind}) is not an address of rank 0's host "
                                     f"{socket.gethostname()}; set it to the host that runs rank 0") from None
        raise HorovodConfigError(f"rank 0 cannot serve the rendezvous on {bind}:{port} "
                                 f"(HOROVOD_RENDEZVOUS_PORT): {exc.strerror or exc}") from None
    _served[(addr, port)] = server


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


def resolve_external(cfg, environ: Optional[Mapping[str, str]] = None):
    """The :class:`~horovod.runtime.topology.Topology` of a worker started by ``mpirun``/``srun``, else None.

    None also when ``horovodrun`` (or ``horovod.run``/``spawn_ranks``) set ``HOROVOD_RANK``, or for elastic
    workers: their launcher decided.

    Raises:
        HorovodConfigError: no rendezvous address is configured, or rank 0 cannot serve it.
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
    served_by_launcher = bool(cfg.gloo_rendezvous_addr) and cfg.gloo_rendezvous_port > 0
    addr, port = ((cfg.gloo_rendezvous_addr, cfg.gloo_rendezvous_port) if served_by_launcher
                  else (cfg.rendezvous_addr, cfg.rendezvous_port))
    if not addr or port <= 0:
        raise HorovodConfigError(
            f"rank {slot.rank} of {slot.size} was started by {slot.starter} without horovodrun; set "
            f"HOROVOD_RENDEZVOUS_ADDR (the host of rank 0) and HOROVOD_RENDEZVOUS_PORT (a free port) on every rank, "
            f"or start the job with horovodrun --mpi")
    if cfg.secret_key:
        secret = secret_from_hex(cfg.secret_key)
    else:
        secret = _derived_secret(slot, addr, port)
        if slot.rank == 0:
            print(f"horovod: HOROVOD_SECRET_KEY is not set: the rendezvous at {addr}:{port} is keyed by the job id "
                  f"only, and anyone who can reach it could join. Export the same random HOROVOD_SECRET_KEY "
                  f"(hex, e.g. `openssl rand -hex 32`) to every rank to close the job.", file=sys.stderr, flush=True)
    if slot.rank == 0 and not served_by_launcher:
        _serve(addr, port, secret)
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


__all__ = ["ExternalSlot", "detect", "placement", "resolve_external"]
