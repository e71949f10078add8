"""Workers started by ``mpirun`` or ``srun`` with nothing else set: meet over MPI (mpi4py), as the Kubernetes MPI
operator's ``mpirun -np N python train.py`` expects.

MPI only carries the meeting: rank 0 of the communicator serves this job's rendezvous on a free port of every
interface, with a fresh secret, and broadcasts its addresses, the port and the secret. Every rank then tries the
addresses, the ranks agree (an allgather) on the first one all of them reach, and from there on everything goes
through the rendezvous and the TCP/shared-memory transport as under ``horovodrun``. The secret never leaves the
job's MPI processes.

Also here: what makes an object an mpi4py communicator, and the world ranks of one, for ``hvd.init(comm=...)`` and
``ProcessSet(comm)``. ``mpi4py`` is imported only when it is used (importing it initialises MPI).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, List, Optional, Sequence, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.common.netaddr import accepts, local_ipv4_addresses
from horovod.common.rendezvous_client import make_secret, secret_from_hex, secret_to_hex

__all__ = ["available", "is_communicator", "world_communicator", "world_ranks", "choose_address", "meet"]

_PROBE_SECONDS = 2.0


def available() -> bool:
    """Whether mpi4py is installed (found without importing it)."""
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


def is_communicator(obj: Any) -> bool:
    """Whether ``obj`` looks like an mpi4py communicator (``Get_rank``, ``Get_size``, ``Get_group``, ``bcast``)."""
    return all(callable(getattr(obj, name, None)) for name in ("Get_rank", "Get_size", "Get_group", "bcast",
                                                             "allgather"))


def world_communicator():
    """``MPI.COMM_WORLD`` (imports mpi4py, which initialises MPI)."""
    from mpi4py import MPI  # only for workers meeting over MPI; importing it initialises MPI
    return MPI.COMM_WORLD


def world_ranks(comm) -> List[int]:
    """The ``COMM_WORLD`` ranks of ``comm``'s members, in ``comm``'s rank order."""
    from mpi4py import MPI
    ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), MPI.COMM_WORLD.Get_group())
    return [int(r) for r in ranks]


def choose_address(candidates: Sequence[str], reachable_by_rank: Sequence[Sequence[bool]]) -> Optional[str]:
    """The first candidate every rank reached (``reachable_by_rank[r][i]``: rank ``r`` reached candidate ``i``)."""
    for index, address in enumerate(candidates):
        if all(row[index] for row in reachable_by_rank):
            return address
    return None


def meet(comm, serve: Callable[[bytes], int], timeout: float = _PROBE_SECONDS,
         secret: Optional[bytes] = None) -> Tuple[str, int, bytes]:
    """Agree on the job's rendezvous over ``comm``; every rank of ``comm`` must call this.

    Args:
        comm: the mpi4py communicator whose ranks form the job.
        serve: called on rank 0 with the fresh secret; starts the rendezvous on all interfaces, returns its port.
        timeout: seconds each address probe may take.
        secret: the exported ``HOROVOD_SECRET_KEY`` (the same on every rank): used, and never sent over MPI.

    Returns:
        ``(addr, port, secret)``.

    Raises:
        HorovodInternalError: no address of rank 0 is reachable from every rank.
    """
    offer = None
    if comm.Get_rank() == 0:
        chosen = secret if secret is not None else make_secret()
        offer = (local_ipv4_addresses(), serve(chosen), None if secret is not None else secret_to_hex(chosen))
    candidates, port, secret_hex = comm.bcast(offer, root=0)
    reached = comm.allgather([accepts(a, port, timeout) for a in candidates])
    address = choose_address(candidates, reached)
    if address is None:
        raise HorovodInternalError(f"rank {comm.Get_rank()} of {comm.Get_size()} (mpi4py): no address of rank 0 "
                                   f"({', '.join(candidates)}, port {port}) is reachable from every rank; set "
                                   f"HOROVOD_RENDEZVOUS_ADDR/PORT, or open the port")
    return address, port, secret if secret is not None else secret_from_hex(secret_hex)
