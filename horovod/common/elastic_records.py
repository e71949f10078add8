"""What the elastic driver and its workers say to each other through the rendezvous store.

The driver (``horovod.runner.elastic``) and the workers (``horovod.elastic``) never import each other; they share
these key names and record formats, and nothing else.

Keys (scope/key):
    ``elastic.ready/<host>:<slot>``   worker → driver: "I am waiting for a round after round N" (value ``N``).
    ``elastic.assign/<host>:<slot>``  driver → worker: the worker's place in the new round (an :class:`Assignment`),
                                      or ``removed``/``ended``. A worker deletes its own key before it says ready,
                                      so a blocking read of it only ever returns an answer to the current request.
    ``elastic/hosts_updated``         driver → rank 0: ``<version>,<flags>`` after the discovered hosts changed.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Tuple, Union

READY_SCOPE = "elastic.ready"
ASSIGN_SCOPE = "elastic.assign"
NOTIFY_SCOPE = "elastic"
HOSTS_UPDATED_KEY = "hosts_updated"
BROKEN_ROUND_KEY = "broken_round"     # the last round a worker of which failed (its mesh will never form)
REMOVED = b"removed"
ENDED = b"ended"


class HostUpdateResult(enum.IntFlag):
    """What changed in the job's hosts (Horovod's values)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = 3


def slot_key(hostname: str, local_rank: int) -> str:
    """The identity of a worker slot in the store: ``host:local_rank``."""
    return f"{hostname}:{local_rank}"


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One worker's place in one round of an elastic job.

    ``round`` numbers the driver's assignments (1, 2, ...); every worker of a round builds its mesh in the same
    round-numbered scope. ``version`` is the last host update this round already accounts for.
    """

    # The same six numbers as types.Topology, on purpose: this is their wire record (a fixed comma-separated form,
    # read by a worker that then builds its Topology from it); Topology adds what is not the driver's to say.
    round: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    version: int = 0

    def encode(self) -> bytes:
        """The record as the driver stores it: its numbers, comma-separated."""
        return ",".join(str(v) for v in dataclasses.astuple(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Assignment":
        """The record from :meth:`encode`'s bytes.

        Raises:
            ValueError: not eight integers, or a round or rank out of range.
        """
        fields = data.decode("ascii").split(",")
        if len(fields) != 8:
            raise ValueError(f"malformed elastic assignment {data[:100]!r}")
        values = [int(f) for f in fields]
        record = cls(*values)
        if record.round < 1 or not 0 <= record.rank < record.size:
            raise ValueError(f"invalid elastic assignment {record}")
        return record


def decode_answer(data: bytes) -> Union[Assignment, bytes]:
    """An :class:`Assignment`, or :data:`REMOVED`/:data:`ENDED`."""
    return data if data in (REMOVED, ENDED) else Assignment.decode(data)


def encode_update(version: int, flags: int) -> bytes:
    """A host update as the driver posts it: its version and flags (what changed), comma-separated."""
    return f"{int(version)},{int(flags)}".encode()


def decode_update(data: bytes) -> Tuple[int, int]:
    """``(version, flags)`` from :func:`encode_update`'s bytes (ValueError when they are not two integers)."""
    version, _, flags = data.decode("ascii").partition(",")
    return int(version), int(flags)


__all__ = ["READY_SCOPE", "ASSIGN_SCOPE", "NOTIFY_SCOPE", "HOSTS_UPDATED_KEY", "BROKEN_ROUND_KEY", "REMOVED", "ENDED",
           "HostUpdateResult", "Assignment", "slot_key", "decode_answer", "encode_update", "decode_update"]
