"""Horovod's response cache: every rank keeps the same LRU table of recently negotiated tensors.

Each cached tensor owns a bit (its slot number). A rank whose new request equals its previous request for that name
sends only the bit, and the coordinator sends a single-tensor response back as that bit: steady training loops
exchange small integers instead of full descriptions. The table stays identical on every rank because every rank
records the same responses in the same order after executing them, so bits are assigned and evicted identically.
"""

from __future__ import annotations

import collections
from typing import Dict, Iterable, List, Optional, Tuple

from horovod.common.types import OpType, Request, Response

__all__ = ["CACHEABLE", "ResponseCache", "split_hits"]

CACHEABLE = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL,
                       OpType.REDUCESCATTER})


class ResponseCache:
    """LRU map name → (bit, single-tensor response); ``capacity`` 0 disables it."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: "collections.OrderedDict[str, Tuple[int, Response]]" = collections.OrderedDict()
        self._names: Dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def bit(self, name: str) -> Optional[int]:
        """The bit of ``name`` if cached, else None."""
        entry = self._entries.get(name)
        return None if entry is None else entry[0]

    def response(self, bit: int) -> Response:
        """The cached response of ``bit``; KeyError for an unknown bit (a protocol error)."""
        return self._entries[self._names[bit]][1]

    def name(self, bit: int) -> str:
        """The name that owns ``bit``; KeyError for an unknown bit."""
        return self._names[bit]

    def cached_bit(self, response: Response) -> Optional[int]:
        """The bit of ``response`` if exactly this response is cached, else None."""
        entry = self._entries.get(response.names[0]) if len(response.names) == 1 else None
        return entry[0] if entry is not None and (entry[1] is response or entry[1] == response) else None

    def record(self, responses: Iterable[Response]) -> None:
        """Insert or refresh every cacheable single-tensor response, in order."""
        if self.capacity <= 0:
            return
        for response in responses:
            if response.op not in CACHEABLE or response.error is not None or len(response.names) != 1:
                continue
            name = response.names[0]
            entry = self._entries.get(name)
            if entry is not None:
                if entry[1] is not response:     # (a training loop's steady state records the same response)
                    self._entries[name] = (entry[0], response)
                self._entries.move_to_end(name)
                continue
            if len(self._entries) >= self.capacity:
                _, (bit, _) = self._entries.popitem(last=False)
            else:
                bit = len(self._entries)
            self._entries[name] = (bit, response)
            self._names[bit] = name


def split_hits(cache: ResponseCache, last_requests: Dict[str, Request],
               requests: List[Request]) -> Tuple[List[int], List[Request]]:
    """Requests of a cached name identical to the last one this rank sent in full travel as bits; the rest in full.

    A bit therefore means "the same request as my last full one for this name", which is exactly what the
    coordinator remembers for it, whether that request succeeded or not. ``last_requests`` is updated here.
    """
    hits: List[int] = []
    full: List[Request] = []
    for request in requests:
        bit = cache.bit(request.name)
        if bit is not None and last_requests.get(request.name) == request:
            hits.append(bit)
        else:
            full.append(request)
            last_requests[request.name] = request
    if len(last_requests) > 2 * cache.capacity + 1024:
        # Unnamed tensors get new names forever; only names still cached can ever be sent as bits.
        for name in [n for n in last_requests if cache.bit(n) is None]:
            del last_requests[name]
    return hits, full
