"""The Transport contract: everything the core and the algorithms may ask of the layer that moves bytes between ranks.

Transports know ranks and bytes, never tensors. Every call is bounded: a dead or silent peer raises
:class:`horovod.common.exceptions.HorovodInternalError`, and the transport then fails as a whole (every later call
raises too), so that the other ranks learn of the failure from closed connections. Besides moving bytes, a transport
tells the job's layout, as every rank published it through the rendezvous (the same on every rank): which ranks share
a host (shared memory, hierarchical allreduce, whether a host is oversubscribed) and the secrets that name a job's
shared-memory segments. A single-process job has no transport at all.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["Future", "Transport"]


class Future(Protocol):
    """Completion of a send started with :meth:`Transport.isend`."""

    def wait(self) -> None:
        """Return once the send completed; re-raise its error."""


class Transport(Protocol):
    """Point-to-point messaging between the ranks of one job, and the job's layout."""

    rank: int
    size: int
    timeout: float                  # seconds between reports of a live peer's silence in a collective (0: never)
    liveness: float                 # seconds a peer's connection may show no sign of life before it is lost
    secret: bytes                   # the job's secret (authenticates connections; names shared-memory segments)
    job_token: str                  # names this mesh of connections among the job's meshes (one per init)
    hostnames: Sequence[str]        # every rank's host identity, by rank (empty until the mesh is up)
    cores: Sequence[int]            # the number of cores of every rank's host, by rank (empty until then)

    def fileno(self, peer: int) -> int:
        """The connection to ``peer``, for waiting on several peers at once."""

    def waiting(self, peer: int, silent_for: float) -> None:
        """A collective has waited ``silent_for`` seconds on ``peer``, whose connection is alive (told every half
        ``timeout``); raises, failing the transport, once the wait has lasted too long."""

    def resumed(self) -> None:
        """Bytes moved again after :meth:`waiting` was called."""

    def check_open(self, peer: int) -> None:
        """Raise if ``peer`` hung up; bytes waiting on the connection stay there."""

    def send(self, peer: int, data) -> None:
        """Send all of ``data`` (bytes or a memoryview) to ``peer``."""

    def isend(self, peer: int, view: memoryview) -> Future:
        """Start sending ``view``; the caller keeps the buffer unchanged until ``wait`` returns."""

    def recv_into(self, peer: int, view: memoryview) -> None:
        """Fill ``view`` with the next bytes from ``peer``."""

    def duplex(self) -> Any:
        """A :class:`horovod.transport.duplex.Duplex`: one collective's sends and receives, queued per peer and
        progressed together on the calling thread."""

    def send_obj(self, peer: int, message: Any) -> None:
        """Send one control message (primitives only)."""

    def recv_obj(self, peer: int) -> Any:
        """Receive one control message."""

    def close(self) -> None:
        """Close every connection; later calls raise HorovodInternalError."""
