"""JAX arrays <-> the buffers the engine works on, and pytrees <-> flat lists of leaves.

A CPU ``jax.Array`` is read through ``np.asarray`` (zero-copy where JAX allows; the engine only reads its inputs).
bfloat16, which numpy lacks, travels as its raw ``uint16`` words with ``dtype="bfloat16"``, as in the torch binding.
An array on a GPU goes to the engine as a :class:`~horovod.common.device.DeviceTensor`: the job's device plane takes
it through DLPack where it carries CUDA (``horovod.torch``'s NCCL plane, when the script imported it), else the
front door stages it through host memory with :data:`JAX_OPS` and puts the result back on the array's device.
(Inside ``jax.jit`` JAX itself hands the host callbacks host arrays: those are host tensors to the engine.)
Results come back as jax arrays of the input's dtype.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from horovod.common.device import DeviceTensor
from horovod.common.types import dtype_name

_BF16 = np.dtype(jnp.bfloat16)


def core_dtype(dtype) -> Optional[str]:
    """The dtype name to hand the engine for arrays of ``dtype``: ``"bfloat16"``, or None when numpy's own name is
    right.

    Raises:
        ValueError: a dtype the engine cannot reduce or move (complex, uint32, 8-bit floats...).
    """
    dtype = np.dtype(dtype)
    if dtype == _BF16:
        return "bfloat16"
    dtype_name(np.empty(0, dtype))   # raises ValueError naming the supported types
    return None


def _accelerator(array):
    """The device of a jax array that lives on an accelerator, else None (host arrays, numpy, tracers)."""
    if not isinstance(array, jax.Array) or is_tracer(array):
        return None
    devices = array.devices()
    device = next(iter(devices)) if len(devices) == 1 else None
    return device if device is not None and device.platform != "cpu" else None


def to_core(array) -> Tuple[Any, Optional[str]]:
    """What the engine takes for ``array`` (a jax or numpy array), and the dtype name to give with it: a host
    array, or a :class:`DeviceTensor` for an array on an accelerator."""
    device = _accelerator(array)
    if device is not None:
        name = core_dtype(array.dtype) or dtype_name(np.empty(0, array.dtype))
        kind = "cuda" if device.platform == "gpu" else device.platform
        return DeviceTensor(array, f"{kind}:{device.id}", name, tuple(array.shape), None, JAX_OPS), name
    host = np.asarray(array)
    if host.dtype == _BF16:
        return host.view(np.uint16), "bfloat16"
    return host, core_dtype(host.dtype)


def from_core(array, dtype):
    """The engine's result viewed in ``dtype`` again (bfloat16 from its words); a device result as a jax array on
    its device (from the plane's own tensor through DLPack, once the plane's stream is past it)."""
    if type(array) is DeviceTensor:
        data = array.data
        if isinstance(data, jax.Array):
            return data
        if array.ready is not None:
            array.ready.synchronize()      # (this caller's thread waits, never the engine's)
        return jax.dlpack.from_dlpack(data)
    dtype = np.dtype(dtype)
    if dtype == _BF16:
        return np.asarray(array).view(_BF16)
    return np.asarray(array, dtype=dtype)


def to_jax(array: np.ndarray, dtype) -> jax.Array:
    """A jax array holding the engine's result, in ``dtype``."""
    return jnp.asarray(from_core(array, dtype))


def flatten(tree) -> Tuple[List[Any], Any]:
    """``(leaves, treedef)`` of a pytree (None leaves are dropped, as ``jax.tree`` does)."""
    return jax.tree_util.tree_flatten(tree)


def unflatten(treedef, leaves) -> Any:
    """The pytree ``treedef`` with ``leaves``."""
    return jax.tree_util.tree_unflatten(treedef, list(leaves))


def is_tracer(x) -> bool:
    """Whether ``x`` is an abstract value of a JAX transformation (jit, grad, vmap)."""
    return isinstance(x, jax.core.Tracer)


class _JaxOps:
    """The host-staged path for jax arrays (:class:`horovod.common.device.DeviceOps`)."""

    def to_host(self, tensor: DeviceTensor) -> np.ndarray:
        """A host copy (complete on return: ``np.asarray`` waits for the array)."""
        host = np.asarray(tensor.data)
        return host.view(np.uint16) if host.dtype == _BF16 else host

    def to_device(self, array: np.ndarray, like: DeviceTensor, out: Optional[DeviceTensor] = None) -> DeviceTensor:
        """``array`` put on ``like``'s device (jax arrays are immutable: ``out`` is never written)."""
        placed = jax.device_put(from_core(array, like.data.dtype), next(iter(like.data.devices())))
        return DeviceTensor(placed, like.device, like.dtype, tuple(placed.shape), None, self)


JAX_OPS = _JaxOps()


__all__ = ["JAX_OPS", "core_dtype", "to_core", "from_core", "to_jax", "flatten", "unflatten", "is_tracer"]
