"""Workers started by ``torchrun`` (torch.distributed.elastic): meet through the agent's store.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and, since torch 2.x,
``TORCHELASTIC_USE_AGENT_STORE=True``: the agent itself then serves a ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``,
so that port is taken. Rank 0 serves this job's rendezvous on a free port of its host, with a fresh secret, and
writes where and the secret into the agent's store; the other ranks read them from there. Everything the agent's
store holds is reachable by whoever can reach it: the secret is as well kept as torch's own rendezvous.

``torch`` is imported only here, and only for such workers (``torchrun`` implies it is installed).
"""

from __future__ import annotations

import datetime
from typing import Callable, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.common.rendezvous_client import make_secret, secret_from_hex, secret_to_hex
from horovod.common.starters import TORCHRUN

__all__ = ["STARTER", "uses_agent_store", "meet"]

STARTER = TORCHRUN


def uses_agent_store(env) -> bool:
    """Whether torchrun's agent serves the store at ``MASTER_ADDR:MASTER_PORT`` (so nobody else may bind it)."""
    return str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() in ("1", "true")


def meet(rank: int, size: int, job_id: str, master: Tuple[str, int], timeout: float,
         serve: Callable[[bytes], Tuple[str, int]]) -> Tuple[str, int, bytes]:
    """Agree on this job's rendezvous through the agent's store at ``master``.

    Rank 0 calls ``serve(secret)`` (which starts the rendezvous and returns ``(addr, port)``) and publishes the
    result; the others wait for it up to ``timeout`` seconds.

    Returns:
        ``(addr, port, secret)`` of the job's rendezvous.

    Raises:
        HorovodInternalError: the agent's store is unreachable or rank 0 did not publish in time.
    """
    import torch.distributed as dist  # only under torchrun, which implies torch

    key = f"horovod/rendezvous/{job_id}"
    try:
        store = dist.TCPStore(master[0], master[1], size, is_master=False,
                              timeout=datetime.timedelta(seconds=max(1.0, timeout)))
        if rank == 0:
            secret = make_secret()
            addr, port = serve(secret)
            store.set(key, f"{addr} {port} {secret_to_hex(secret)}")
            return addr, port, secret
        addr, port, secret_hex = store.get(key).decode().split()
        return addr, int(port), secret_from_hex(secret_hex)
    except (RuntimeError, ValueError) as exc:  # torch reports store failures as RuntimeError (DistStoreError)
        raise HorovodInternalError(f"rank {rank} of {size} (torchrun): could not agree on the rendezvous through "
                                   f"the agent's store at {master[0]}:{master[1]} within {timeout:g} s: {exc}") \
            from None
