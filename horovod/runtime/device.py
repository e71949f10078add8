"""Device tensors at the front door: which device plane a job gets, and the host-staged path.

A binding that can move its device tensors registers a plane factory when it is imported (``horovod.torch`` does:
NCCL, or Gloo as the CPU stand-in). ``init`` asks the factories for the job's plane as ``HOROVOD_DEVICE_PLANE``
says; the engine then runs every response of a kind the plane carries on it. A device tensor of any other kind (no
plane, a kind the plane does not carry, an op it does not run) is staged: copied to host memory by its binding,
submitted under the device name marked ``@host`` (so ranks that disagree on the path fail by name instead of
waiting on each other), run by the CPU data plane, and copied back to the device when its handle completes.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from horovod.common.device import STANDIN_KIND, DeviceTensor, staged
from horovod.common.exceptions import HorovodConfigError
from horovod.common.types import CPU_DEVICE, ReduceOp
from horovod.core.device_plane import DevicePlane
from horovod.core.handles import Handle
from horovod.runtime import context as _ctx

__all__ = ["register_plane", "make_plane", "route", "prepare", "one_row", "wrap_staged", "is_device", "takes_host_tensors", "PlaneFactory"]

log = logging.getLogger("horovod")

# (mode, topology, rendezvous scope, config) -> a plane, or None when this factory cannot serve ``mode`` here.
PlaneFactory = Callable[[str, Any, str, Any], Optional[DevicePlane]]

# Process-lifetime: a binding registers its factory once, when it is imported, before any ``init``.
_factories: List[PlaneFactory] = []


def register_plane(factory: PlaneFactory) -> None:
    """Offer ``factory`` to every later ``init`` (once per factory)."""
    if factory not in _factories:
        _factories.append(factory)


def make_plane(config, topo, scope: str) -> Optional[DevicePlane]:
    """The job's device plane as ``config.device_plane`` asks, or None (device tensors are staged).

    Raises:
        HorovodConfigError: ``nccl`` or ``gloo`` was asked for and no imported binding can provide it.
    """
    mode = config.device_plane
    if mode == "staged":
        return None
    for factory in _factories:
        plane = factory(mode, topo, scope, config)
        if plane is not None:
            log.debug("rank %d: device tensors go through the %s device plane (HOROVOD_DEVICE_PLANE=%s)",
                      topo.rank, plane.name, mode)
            return plane
    if mode in ("nccl", "gloo"):
        raise HorovodConfigError(f"HOROVOD_DEVICE_PLANE={mode} needs the device plane of horovod.torch (import it "
                                 f"before hvd.init(); for nccl, a CUDA build of torch with NCCL and a GPU per rank)")
    log.debug("rank %d: no device plane; device tensors are staged through host memory", topo.rank)
    return None


def takes_host_tensors() -> bool:
    """Whether this job's device plane is the Gloo stand-in, which host tensors of a binding go through."""
    ctx = _ctx.get()
    plane = ctx.engine.device_plane if ctx is not None else None
    return plane is not None and STANDIN_KIND in plane.kinds


def is_device(array: Any) -> bool:
    """Whether a binding handed over a device tensor."""
    return type(array) is DeviceTensor


def _plane_runs(plane: Optional[DevicePlane], tensor: DeviceTensor, reduce_op: Optional[int]) -> bool:
    """Whether the plane takes ``tensor``: a kind it carries, a tensor it can read (the plane takes tensors
    through DLPack; one whose framework exports none is staged), and an op it runs (Adasum's composition lives on
    the CPU data plane only)."""
    return (plane is not None and tensor.kind in plane.kinds and reduce_op != ReduceOp.ADASUM
            and hasattr(tensor.data, "__dlpack__"))


def route(plane: Optional[DevicePlane], tensor: DeviceTensor, output: Optional[DeviceTensor] = None,
          reduce_op: Optional[int] = None) -> Tuple[Any, Any, str, Optional[Callable[[Any], Any]]]:
    """Where a device tensor goes: ``(array, output, device, restore)``.

    On the plane: the tensor and output as they are, the tensor's device, no restore. Staged: a host copy (and a
    host output: the same array in place, else a new one), the device marked ``@host``, and ``restore`` taking the
    CPU result back to the device (into ``output`` when given).
    """
    if _plane_runs(plane, tensor, reduce_op):
        return tensor, output, tensor.device, None
    if tensor.ops is None:
        raise ValueError(f"{tensor!r} cannot be staged through host memory: its binding gave no DeviceOps")
    host = tensor.ops.to_host(tensor)
    host_out = None
    if output is not None:
        host_out = host if output is tensor else np.empty(host.shape, host.dtype)
    ops = tensor.ops

    def restore(result):
        if isinstance(result, tuple):       # alltoall: (rows, received splits)
            return ops.to_device(result[0], tensor), result[1]
        return ops.to_device(result, tensor, output)
    return host, host_out, staged(tensor.device), restore


def prepare(array, engine: Callable[[], Any], output=None) -> Tuple[Any, Any, str, Optional[Callable[[Any], Any]]]:
    """``(array, output, device, restore)`` for a collective's input: a host array made contiguous (on the CPU),
    or a device tensor routed (:func:`route`) to ``engine()``'s device plane or staged through host memory."""
    if is_device(array):
        array, output, device, restore = route(engine().device_plane, array, output)
        return (array if restore is None else _contiguous(array)), output, device, restore
    return _contiguous(np.asarray(array)), output, CPU_DEVICE, None


def one_row(array):
    """A 0-d array or device tensor as one row (allgather and reducescatter treat a scalar as shape ``(1,)``)."""
    if is_device(array):
        return DeviceTensor(array.data, array.device, array.dtype, (1,), array.ready, array.ops)
    return array.reshape(1)


def _contiguous(array: np.ndarray) -> np.ndarray:
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


class _StagedHandle(Handle):
    """A handle whose result, a host array, is copied back to the device when first read."""

    __slots__ = ("inner", "restore", "restored")

    def __init__(self, inner: Handle, restore: Callable[[Any], Any]):
        super().__init__(inner.name)
        self.inner, self.restore, self.restored = inner, restore, None

    def done(self) -> bool:
        """Whether the collective has finished."""
        return self.inner.done()

    def wait(self, timeout=None) -> bool:
        """Wait for the collective; whether it finished."""
        return self.inner.wait(timeout)

    def exception(self):
        """The collective's error, or None."""
        return self.inner.exception()

    def result(self, timeout=None):
        """The result on the device."""
        if self.restored is None:
            self.restored = (self.restore(self.inner.result(timeout)),)
        return self.restored[0]


def wrap_staged(handle: Handle, restore: Optional[Callable[[Any], Any]]) -> Handle:
    """``handle`` as it is, or one that brings a staged result back to the device."""
    return handle if restore is None else _StagedHandle(handle, restore)
