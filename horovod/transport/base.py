"""The Transport contract: everything the core, the algorithms and the duplex may ask of the layer that moves bytes
between ranks.

Transports know ranks and bytes, never tensors. Every call is bounded: a dead or silent peer raises
:class:`horovod.common.exceptions.HorovodInternalError`, and the transport then fails as a whole (every later call
raises too), so that the other ranks learn of the failure from closed connections. Besides moving bytes, a transport
tells the job's layout, as every rank published it through the rendezvous (the same on every rank): which ranks share
a host (shared memory, hierarchical allreduce, whether a host is oversubscribed) and the secrets that name a job's
shared-memory segments. A single-process job has no transport at all.

A transport subclasses :class:`Transport` and defines every member itself (``tests/test_transport_contract.py``
checks the socket transport and the simulation's), so that no caller has to ask whether a member is there: a
transport without patience holds :data:`NO_PATIENCE`. How a transport is made and joined to its peers (listening,
publishing, dialling) is its own class's business, not the contract's: the one that makes it knows which it made.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Protocol, Sequence, Union, runtime_checkable

from horovod.common.exceptions import HorovodInternalError
from horovod.transport.duplex import Duplex

__all__ = ["DescriptorLimitError", "Future", "NO_PATIENCE", "NoPatience", "PatienceLike", "Transport"]

Activity = Union[str, Callable[[], str]]


class DescriptorLimitError(HorovodInternalError):
    """A connection could not be opened: the process's open-file limit is reached (the message names it and the
    fix; the engine adds the collective that needed it)."""


class Future(Protocol):
    """Completion of a send started with :meth:`Transport.isend`."""

    def wait(self) -> None:
        """Return once the send completed; re-raise its error."""


class PatienceLike(Protocol):
    """What a transport's waits on busy peers are told by the engine, so that a warning or a failure names the work
    this rank was doing (:class:`horovod.transport.patience.Patience` is the socket transport's)."""

    def working_on(self, activity: Activity) -> None:
        """What this rank runs now: a text, or a function that makes it (called only when a wait is reported)."""


class NoPatience:
    """The patience of a transport that never waits on a busy peer: it has nothing to name, so it keeps nothing."""

    def working_on(self, activity: Activity) -> None:
        """Forget ``activity``: no wait will be reported."""


NO_PATIENCE = NoPatience()


@runtime_checkable
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
    patience: PatienceLike          # told what this rank runs, for the account of a wait on a busy peer

    def fileno(self, peer: int) -> int:
        """The connection to ``peer``, for waiting on several peers at once."""

    def connection(self, peer: int) -> socket.socket:
        """The connection to ``peer`` itself, for a duplex that writes and reads it without blocking."""

    def quiesce(self, peer: int) -> None:
        """Return once no send queued earlier to ``peer`` is still being written, before another writer (a duplex)
        takes the connection: two writers would interleave their bytes."""

    def waiting(self, peer: int, silent_for: float) -> None:
        """A collective has waited ``silent_for`` seconds on ``peer``, whose connection is alive (told every half
        ``timeout``); raises, failing the transport, once the wait has lasted too long."""

    def resumed(self) -> None:
        """Bytes moved again after :meth:`waiting` was called."""

    def check_open(self, peer: int) -> None:
        """Raise if ``peer`` hung up; bytes waiting on the connection stay there."""

    def fail(self, peer: int, exc: BaseException) -> HorovodInternalError:
        """The error to raise for ``peer``'s connection failing with ``exc``; the transport fails as a whole, so
        that the other ranks learn of it from their closed connections."""

    def fail_own(self, account: str) -> None:
        """This rank fails for a reason of its own (``account``: a bug on its engine thread); told before the
        transport closes, so that the ranks that lose their connections to it can name it and the reason."""

    def send(self, peer: int, data) -> None:
        """Send all of ``data`` (bytes or a memoryview) to ``peer``."""

    def isend(self, peer: int, view: memoryview) -> Future:
        """Start sending ``view``; the caller keeps the buffer unchanged until ``wait`` returns."""

    def recv_into(self, peer: int, view: memoryview) -> None:
        """Fill ``view`` with the next bytes from ``peer``."""

    def duplex(self) -> Duplex:
        """One collective's sends and receives, queued per peer and progressed together on the calling thread."""

    def send_obj(self, peer: int, message: Any) -> None:
        """Send one control message (primitives only)."""

    def recv_obj(self, peer: int) -> Any:
        """Receive one control message."""

    def close(self) -> None:
        """Close every connection; later calls raise HorovodInternalError."""
