"""Workers started by ``torchrun`` (torch.distributed.elastic): meet through the agent's store.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and, since torch 2.x,
``TORCHELASTIC_USE_AGENT_STORE=True``: the agent itself then serves a ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``,
so that port is taken. Rank 0 serves this job's rendezvous on a free port of one address of its host (loopback for
a one-host job: :func:`horovod.runtime.launch_env.listen_address`) and writes where into the agent's store; the
other ranks read it from there.

The agent's store has no authentication and listens on every interface: anyone who can reach it reads every key.
So the secret never crosses it when the user exported ``HOROVOD_SECRET_KEY`` (the same on every rank): only the
address does, and every rank signs with the exported key. Without one there is no private channel to share a
secret over; rank 0 then makes a fresh one, publishes it with the address (as torch's own rendezvous is exposed)
and says once what is exposed and how to close it.

``torch`` is imported only here, and only for such workers (``torchrun`` implies it is installed).
"""

from __future__ import annotations

import datetime
import sys
from typing import Callable, Optional, Tuple

from horovod.common.exceptions import HorovodInternalError
from horovod.common.rendezvous_client import make_secret, secret_from_hex, secret_to_hex
from horovod.common.starters import TORCHRUN

__all__ = ["STARTER", "EXPOSED", "uses_agent_store", "meet"]

STARTER = TORCHRUN
EXPOSED = ("horovod: HOROVOD_SECRET_KEY is not set: under torchrun the job's secret is published in torch's agent "
           "store at {master}, which has no authentication: anyone who can reach that port can read it and join "
           "the job. Export the same random HOROVOD_SECRET_KEY (hex, e.g. `openssl rand -hex 32`) to every rank to "
           "keep the secret off the store.")


def uses_agent_store(env) -> bool:
    """Whether torchrun's agent serves the store at ``MASTER_ADDR:MASTER_PORT`` (so nobody else may bind it)."""
    return str(env.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() in ("1", "true")


def meet(rank: int, size: int, job_id: str, master: Tuple[str, int], timeout: float,
         serve: Callable[[bytes], Tuple[str, int]], secret: Optional[bytes] = None) -> Tuple[str, int, bytes]:
    """Agree on this job's rendezvous through the agent's store at ``master``.

    Rank 0 calls ``serve(secret)`` (which starts the rendezvous and returns ``(addr, port)``) and publishes the
    result; the others wait for it up to ``timeout`` seconds. With ``secret`` (the exported ``HOROVOD_SECRET_KEY``,
    the same on every rank) only the address is published; without it a fresh secret is, and rank 0 warns once.

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
            chosen = secret if secret is not None else make_secret()
            addr, port = serve(chosen)
            store.set(key, f"{addr} {port}" if secret is not None else f"{addr} {port} {secret_to_hex(chosen)}")
            if secret is None:
                print(EXPOSED.format(master=f"{master[0]}:{master[1]}"), file=sys.stderr, flush=True)
            return addr, port, chosen
        addr, port, *published = store.get(key).decode().split()
        if secret is None and not published:
            raise ValueError("rank 0 published no secret (it has HOROVOD_SECRET_KEY set): export the same "
                             "HOROVOD_SECRET_KEY to every rank")
        return addr, int(port), secret if secret is not None else secret_from_hex(published[0])
    except (RuntimeError, ValueError) as exc:  # torch reports store failures as RuntimeError (DistStoreError)
        raise HorovodInternalError(f"rank {rank} of {size} (torchrun): could not agree on the rendezvous through "
                                   f"the agent's store at {master[0]}:{master[1]} within {timeout:g} s: {exc}") \
            from None
