"""The device plane's communicators bootstrap through the job's own rendezvous: a ``torch.distributed.Store``
over :class:`~horovod.common.rendezvous_client.RendezvousClient`.

Every request is signed with the job's secret (the rendezvous refuses any other), so NCCL's unique id and Gloo's
addresses are never served by an open store such as ``TCPStore``. Keys the rendezvous would not take as names are
hex-encoded. ``add`` is built from puts (one key per call) so that it needs nothing the rendezvous lacks.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Callable, List, Optional

import torch.distributed as dist

from horovod.common.rendezvous_client import NAME_PATTERN, RendezvousClient, RendezvousError

__all__ = ["RendezvousStore", "store_factory"]

_ADD_MARK = ".add."
_SLICE_SECONDS = 0.5     # a wait for a key checks the peers' liveness this often


def _name(key: str) -> str:
    return key if NAME_PATTERN.match(key) and _ADD_MARK not in key else "x" + key.encode().hex()


class RendezvousStore(dist.Store):
    """A store of one scope of the job's rendezvous (one per communicator). A wait for a key checks the
    communicator's ranks every :data:`_SLICE_SECONDS` (``alive``), so a rank that dies while the others make a
    communicator fails them within the liveness bound, not at the store's timeout."""

    def __init__(self, client: RendezvousClient, scope: str, timeout: float, alive: Callable[[], None]):
        super().__init__()
        self._client, self._scope, self._wait, self._alive = client, scope, timeout, alive

    def _get(self, name: str, seconds: float) -> bytes:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            try:
                return self._client.get(self._scope, name, timeout=max(0.0, min(_SLICE_SECONDS, left)))
            except RendezvousError:
                if left <= _SLICE_SECONDS:
                    raise
                self._alive()

    def set(self, key: str, value) -> None:
        """Store ``value`` (bytes or text) under ``key``."""
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._client.put(self._scope, _name(key), data)

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting for it up to the store's timeout."""
        return self._get(_name(key), self._wait)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key``; its new total."""
        prefix = _name(key) + _ADD_MARK
        self._client.put(self._scope, f"{prefix}{os.getpid()}.{time.monotonic_ns()}", str(int(amount)).encode())
        return sum(int(self._get(k, self._wait))
                   for k in self._client.keys(self._scope) if k.startswith(prefix))

    def check(self, keys: List[str]) -> bool:
        """Whether every key is set."""
        return all(self._client.try_get(self._scope, _name(k)) is not None for k in keys)

    def wait(self, keys: List[str], timeout: Optional[datetime.timedelta] = None) -> None:
        """Return once every key is set (raises after the timeout)."""
        seconds = self._wait if timeout is None else timeout.total_seconds()
        for key in keys:
            self._get(_name(key), seconds)

    def delete_key(self, key: str) -> bool:
        """Remove ``key``."""
        self._client.delete(self._scope, _name(key))
        return True

    def num_keys(self) -> int:
        """How many keys the scope holds."""
        return len(self._client.keys(self._scope))

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Wait up to ``timeout`` in ``get`` and ``wait``."""
        self._wait = timeout.total_seconds()


def store_factory(topo, scope: str, timeout: float) -> Callable[[str, Callable[[], None]], dist.Store]:
    """A function from a communicator's name and its liveness check to its store: the rendezvous's when the job
    has one, else (one process, nothing to meet) a store in this process."""
    if topo.size == 1 or topo.rendezvous_addr is None or topo.secret is None:
        return lambda _name, _alive: dist.HashStore()
    client = RendezvousClient(topo.rendezvous_addr, topo.rendezvous_port, topo.secret, timeout=timeout)
    return lambda name, alive: RendezvousStore(client, f"{scope}.{name}", timeout, alive)
