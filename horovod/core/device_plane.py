"""The device data plane's seam: what the engine asks of whatever moves accelerator tensors between ranks.

The engine negotiates a device tensor exactly as a host one (by name, with fusion, the response cache, the
timeline and autotune); only execution differs. A response whose device kind is one the job's plane carries runs on
the plane instead of the CPU algorithms (:mod:`horovod.core.execution`); everything else, host-staged device
tensors included, runs on the CPU data plane. A plane is made per job (per ``init``, so an elastic round gets a new
one for its new world) by the front door from the binding that registered it, and never imports into the core: it
sees the entries' :class:`~horovod.common.device.DeviceTensor` descriptors, not a framework's types.

Liveness stays the engine's: while a collective runs on the plane, the plane calls ``check(ranks)`` between bounded
waits, which raises :class:`~horovod.common.exceptions.HorovodInternalError` naming a lost rank; the plane then
aborts its communicators, so no thread of a survivor stays inside NCCL.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Protocol, Sequence, Tuple

from horovod.common.types import Response

__all__ = ["DevicePlane", "Liveness"]

# Raises HorovodInternalError if one of these global ranks is lost; returns otherwise at once.
Liveness = Callable[[Sequence[int]], None]


class DevicePlane(Protocol):
    """Collectives on device tensors for one job; one communicator per process set, made when first used."""

    name: str                   # what ran, for the timeline and the debug log: "nccl", "gloo"
    kinds: Tuple[str, ...]      # the device kinds whose responses it executes ("cuda"; "cpu+gloo")

    def execute(self, response: Response, entries: Dict[str, Any], set_id: int, ranks: Sequence[int],
                index: int, check: Liveness, activity: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
        """Run ``response`` (fused allreduces, or one allgather, broadcast, alltoall, reducescatter) over the
        process set ``set_id`` whose global ranks are ``ranks`` (this rank at ``index``). ``entries`` maps the
        local names to submitted entries (``.array``/``.output`` are DeviceTensors; a name this rank did not
        submit, having joined, contributes zeros). Returns each local name's result: a DeviceTensor, or for
        alltoall ``(DeviceTensor, received splits as an int32 numpy array)``.

        Raises:
            HorovodInternalError: a rank was lost, or the communicator failed.
        """

    def close(self, abort: bool = False) -> None:
        """Release the communicators; ``abort`` when the job failed (do not wait on peers that may be gone)."""
