"""The Transport protocol: what an algorithm may ask of the layer that moves bytes between ranks.

Transports know ranks and bytes, never tensors. Every call is bounded: a dead or silent peer raises
:class:`horovod.common.exceptions.HorovodInternalError`.
"""

from __future__ import annotations

from typing import Any, Protocol


class Future(Protocol):
    def wait(self) -> None: ...


class Transport(Protocol):
    rank: int
    size: int
    timeout: float      # seconds a peer may stay silent (0: forever)

    def fileno(self, peer: int) -> int:
        """The connection to ``peer``, for waiting on several peers at once."""

    def silent(self, peer: int) -> Exception:
        """The error for ``peer`` having owed a message for longer than ``timeout``; the transport fails."""

    def send(self, peer: int, data) -> None:
        """Send all of ``data`` (bytes or a memoryview) to ``peer``."""

    def isend(self, peer: int, view: memoryview) -> Future:
        """Start sending ``view``; the caller keeps the buffer unchanged until ``wait`` returns."""

    def recv_into(self, peer: int, view: memoryview) -> None:
        """Fill ``view`` with the next bytes from ``peer``."""

    def send_obj(self, peer: int, message: Any) -> None:
        """Send one control message (primitives only)."""

    def recv_obj(self, peer: int) -> Any:
        """Receive one control message."""

    def close(self) -> None: ...
