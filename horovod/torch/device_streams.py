"""Stream order for the device plane: what differs between a GPU and the CPU stand-in, in one place.

On a GPU the plane works on a stream of its own. Before a collective reads its inputs, that stream waits on the
event each input's producer recorded when the tensor was handed over (the backward pass may still be writing it);
after the collective, the plane records an event that the consumer's stream waits on in ``synchronize``. No thread
blocks on the device. On the CPU there is nothing to order: every call here is a no-op.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Optional

import torch

__all__ = ["Streams", "ready_event", "wait_ready"]


class Streams:
    """The plane's stream on ``device`` (none on the CPU)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def ordered(self, entries: Iterable[Any]):
        """Run the body on the plane's stream, after every input's ready event."""
        if self._stream is None:
            yield
            return
        for entry in entries:
            ready = entry.array.ready if entry.array is not None else None
            if ready is not None:
                self._stream.wait_event(ready)
            for described in (entry.array, entry.output):
                # The caching allocator may hand a tensor's block out again once its owner lets go: not before
                # the plane's stream is past it.
                if described is not None and isinstance(described.data, torch.Tensor) and described.data.is_cuda:
                    described.data.record_stream(self._stream)
        with torch.cuda.stream(self._stream):
            yield

    def record(self) -> Optional[Any]:
        """An event marking everything queued on the plane's stream so far (None on the CPU)."""
        if self._stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self._stream)
        return event


def ready_event(tensor: torch.Tensor) -> Optional[Any]:
    """For a tensor handed to a collective: an event on the current stream after the work that produced it."""
    if not tensor.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event


def wait_ready(ready: Optional[Any], tensor: torch.Tensor) -> None:
    """Make the current stream wait for a result's event (no host synchronisation), and keep the result's block
    from being reused by the plane's stream while the current stream still works on it."""
    if ready is not None:
        stream = torch.cuda.current_stream(tensor.device)
        stream.wait_event(ready)
        tensor.record_stream(stream)
