"""Tensors in accelerator memory as every layer below the bindings sees them: a framework-free descriptor.

A binding hands the core a :class:`DeviceTensor` for a tensor that lives on an accelerator (or, for the CPU stand-in
of the device plane, on the host but bound for that plane). The core reads its device, dtype, shape and size and
never looks inside ``data``: the device plane (:mod:`horovod.core.device_plane`) takes ``data`` through DLPack, and
the host-staged path copies through the binding's own :class:`DeviceOps`. So the engine, the algorithms and the
transports stay free of torch, TensorFlow and JAX types.

Device names are ``kind:index`` (``"cuda:1"``). A request's device kind decides its data plane and must agree
across ranks (the index need not: each rank drives its own GPU):

- ``cpu``: host memory, the CPU data plane (ring, shared memory);
- ``cuda``: the device plane (NCCL);
- ``cpu+gloo``: host tensors sent through the device plane with Gloo standing in for NCCL (tests, and machines
  without a GPU that want to exercise the device path);
- ``<kind>@host``: an accelerator tensor staged through pinned host memory to the CPU data plane.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Protocol, Tuple

import numpy as np

from horovod.common.types import numpy_dtype

__all__ = ["DeviceTensor", "DeviceOps", "STAGED_SUFFIX", "STANDIN_KIND", "staged", "is_staged"]

STAGED_SUFFIX = "@host"      # a device kind's mark when its tensors travel through host memory
STANDIN_KIND = "cpu+gloo"    # host tensors on the device plane, Gloo in NCCL's place


def staged(device: str) -> str:
    """The device name a host-staged copy of a tensor on ``device`` is submitted under."""
    return device + STAGED_SUFFIX


def is_staged(device: str) -> bool:
    """Whether ``device`` (a name or a kind) marks a host-staged tensor."""
    return device.endswith(STAGED_SUFFIX)


class DeviceOps(Protocol):
    """What a binding does for the host-staged path, on its own framework's tensors."""

    def to_host(self, tensor: "DeviceTensor") -> np.ndarray:
        """A host copy of ``tensor`` (pinned memory where the framework has it), complete when this returns."""

    def to_device(self, array: np.ndarray, like: "DeviceTensor",
                  out: Optional["DeviceTensor"] = None) -> "DeviceTensor":
        """``array`` copied to ``like``'s device (into ``out`` when given); the copy is ordered before any later
        work on the caller's stream."""


class DeviceTensor:
    """One tensor on a device, described without its framework.

    ``data`` exports DLPack (``__dlpack__``/``__dlpack_device__``): it is the framework's own tensor, kept alive
    while the collective runs. ``ready`` is what the producer's stream recorded when the tensor was handed over (a
    framework event, or None on the host): the device plane's stream waits on it, so a collective never reads a
    gradient the backward pass is still writing. ``ops`` is the binding's :class:`DeviceOps`.
    """

    __slots__ = ("data", "device", "dtype", "shape", "ready", "ops")

    def __init__(self, data: Any, device: str, dtype: str, shape: Tuple[int, ...], ready: Any = None,
                 ops: Optional[DeviceOps] = None):
        self.data = data
        self.device = device
        self.dtype = dtype
        self.shape = tuple(shape)
        self.ready = ready
        self.ops = ops

    @property
    def kind(self) -> str:
        """The device kind (``"cuda"`` of ``"cuda:1"``)."""
        return self.device.split(":", 1)[0]

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The tensor's bytes (the inline negotiation and autotune read it, as they read a numpy array's)."""
        return self.size * numpy_dtype(self.dtype).itemsize

    def __repr__(self) -> str:
        return f"DeviceTensor({self.dtype}{list(self.shape)} on {self.device})"
