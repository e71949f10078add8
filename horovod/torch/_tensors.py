"""Tensors to the core for the torch binding: zero-copy numpy views of CPU tensors, descriptors of GPU tensors.

A contiguous CPU tensor is handed over as a numpy view of its own memory; a non-contiguous one travels as a
contiguous copy (and in-place ops copy the result back); bfloat16, which numpy lacks, travels as its raw ``uint16``
bit pattern with ``dtype="bfloat16"`` so the core widens it to reduce. A tensor on a GPU (or any other device) is
handed over as a :class:`~horovod.common.device.DeviceTensor` with an event on its producer's stream: the job's
device plane runs it, or the front door stages it through host memory with :data:`TORCH_OPS`. Under the Gloo
stand-in (``HOROVOD_DEVICE_PLANE=gloo``) CPU tensors take that same device path.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

from horovod.common.device import STANDIN_KIND, DeviceTensor
from horovod.runtime.device import takes_host_tensors
from horovod.torch.device_streams import ready_event, wait_ready

__all__ = ["check_tensor", "numpy_view", "inplace_view", "as_input", "as_input_view", "as_output",
           "to_tensor", "core_dtype", "torch_dtype", "settle", "TORCH_OPS"]


def check_tensor(tensor, what: str = "tensor") -> torch.Tensor:
    """Validate a collective's input: a dense tensor (on any device).

    Raises:
        TypeError: not a tensor. ValueError: a sparse one, or one on the meta device.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.is_meta:
        raise ValueError(f"{what} is on the meta device and holds no data; hand Horovod a tensor with data, on the "
                         f"CPU or a GPU (.cpu() or .cuda())")
    if tensor.layout != torch.strided:
        raise ValueError(f"{what} has layout {tensor.layout}; sparse tensors go through "
                         f"hvd.sparse_allreduce_async (or DistributedOptimizer(sparse_as_dense=True))")
    return tensor


def numpy_view(tensor: torch.Tensor) -> Tuple[np.ndarray, Optional[str]]:
    """A numpy array sharing the memory of a contiguous CPU tensor, and the dtype name to give the core if numpy's
    own would be wrong (``"bfloat16"``), else None."""
    t = tensor.detach() if tensor.requires_grad else tensor     # (detach costs half of numpy(); per gradient)
    dtype = t.dtype
    if dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    if dtype.is_complex and (t.is_conj() or t.is_neg()):
        t = t.resolve_conj().resolve_neg()
    return t.numpy(), None


def _on_device_path(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` goes to the core as a DeviceTensor: it is not on the CPU, or the Gloo stand-in takes
    CPU tensors."""
    return not tensor.is_cpu or takes_host_tensors()


def core_dtype(dtype: torch.dtype) -> str:
    """The core's name of a torch dtype.

    Raises:
        ValueError: a dtype the core does not reduce.
    """
    found = _CORE_DTYPES.get(dtype)
    if found is None:
        raise ValueError(f"unsupported data type {dtype}; supported: {', '.join(n for _, n in _CORE_DTYPES.values())}")
    return found[1]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a core dtype name (:func:`core_dtype`'s inverse)."""
    return _TORCH_DTYPES[name]


def as_device(tensor: torch.Tensor) -> DeviceTensor:
    """The descriptor of a contiguous (copied where it is not) ``tensor``, with an event on its producer stream."""
    t = tensor.detach() if tensor.requires_grad else tensor
    if not t.is_contiguous():
        t = t.contiguous()
    device = t.device
    name = f"{STANDIN_KIND}:0" if t.is_cpu else f"{device.type}:{device.index or 0}"
    return DeviceTensor(t, name, core_dtype(t.dtype), tuple(t.shape), ready_event(t), TORCH_OPS)


def as_input(tensor: torch.Tensor, what: str = "tensor") -> Tuple[np.ndarray, Optional[str]]:
    """The numpy array to submit for ``tensor``: a view when contiguous, else a view of a contiguous copy. The
    array keeps the memory it shows alive, so the caller need not keep ``tensor``. A tensor on the device path
    gives its :class:`DeviceTensor`."""
    check_tensor(tensor, what)
    if _on_device_path(tensor):
        described = as_device(tensor)
        return described, described.dtype
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return numpy_view(tensor)


# Views for in-place collectives, by data pointer. A training step hands over its gradients every step, and making a
# numpy view (``Tensor.numpy()``, about 1.5 us) would be most of the binding's cost per gradient. These views do not
# own their memory: they are made from the address, so an entry holds no dead tensor's memory, needs no weak reference
# to be dropped (a weak reference's callback costs more than the view), and serves the next tensor at the same address
# (``zero_grad()`` frees the gradients, and the next backward pass gets the same blocks back from the allocator). An
# entry serves a tensor only if the tensor's shape and dtype are the ones the view was made for and it is contiguous:
# then the view is exactly the tensor's memory, whichever tensor made the entry. (Entries are made only for
# tensors without a negative bit; a negative-bit view of two or more elements is strided, so it never matches, and
# a hit on a one-element entry, which contiguity cannot tell apart, asks ``is_neg``: a one-element allreduce is the
# latency benchmark's case, and the general path cost it about a tenth of its time.) The
# caller keeps the tensor alive until its collective completes (the torch handle holds it).
#   data pointer -> (shape, torch dtype, numpy view, core dtype name, whether contiguity rules out a negative bit)
# Process-lifetime (docs/architecture.md, "What outlives a job"): the views belong to the memory, not to a job.
_inplace_views: Dict[int, tuple] = {}
_INPLACE_VIEWS_MAX = 1 << 15       # distinct addresses kept; past this the map starts again (a few MB at most)

# torch dtype -> (numpy dtype of the view, the core's dtype name): the dtypes the core reduces.
_CORE_DTYPES = {torch.uint8: (np.dtype(np.uint8), "uint8"), torch.int8: (np.dtype(np.int8), "int8"),
                torch.int16: (np.dtype(np.int16), "int16"), torch.int32: (np.dtype(np.int32), "int32"),
                torch.int64: (np.dtype(np.int64), "int64"), torch.float16: (np.dtype(np.float16), "float16"),
                torch.bfloat16: (np.dtype(np.uint16), "bfloat16"), torch.float32: (np.dtype(np.float32), "float32"),
                torch.float64: (np.dtype(np.float64), "float64"), torch.bool: (np.dtype(np.bool_), "bool")}
_TORCH_DTYPES = {name: dtype for dtype, (_, name) in _CORE_DTYPES.items()}


def inplace_view(tensor: torch.Tensor) -> Optional[tuple]:
    """For an in-place collective on ``tensor``: ``(shape, dtype, view, core dtype name, ...)``, with ``view`` a
    numpy array over the tensor's own memory, or None when the tensor needs the general path (non-contiguous, a
    negative bit, or a dtype the core does not reduce; the general path copies or raises). Runs once per gradient
    per step: a hit asks torch four questions (five for one element), none of which releases the GIL. The caller
    keeps ``tensor`` alive while the view is in use.

    Raises:
        TypeError, ValueError: as :func:`check_tensor`.
    """
    try:
        if not tensor.is_cpu or takes_host_tensors():   # the device path: no view of host memory
            check_tensor(tensor)
            return None
        entry = _inplace_views.get(tensor.data_ptr())
    except (AttributeError, RuntimeError):     # not a tensor, or one without a data pointer (sparse)
        check_tensor(tensor)
        raise
    if entry is not None and entry[0] == tensor.shape and entry[1] == tensor.dtype and tensor.is_contiguous() \
            and (entry[4] or not tensor.is_neg()):
        return entry
    return _new_inplace_view(check_tensor(tensor))


class _Memory:
    """An address, shape and dtype in numpy's array interface: what a view of memory numpy does not own is made of."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, shape: Tuple[int, ...], dtype: np.dtype):
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": dtype.str, "version": 3}


def _new_inplace_view(tensor: torch.Tensor) -> Optional[tuple]:
    core = _CORE_DTYPES.get(tensor.dtype)
    address = tensor.data_ptr()
    if core is None or address == 0 or not tensor.is_contiguous() or tensor.is_neg():
        return None
    shape = tuple(tensor.shape)
    view = np.asarray(_Memory(address, shape, core[0]))
    if len(_inplace_views) >= _INPLACE_VIEWS_MAX:
        _inplace_views.clear()
    entry = _inplace_views[address] = (tensor.shape, tensor.dtype, view, core[1], tensor.numel() >= 2)
    return entry


def as_input_view(tensor: torch.Tensor, what: str = "tensor") -> Tuple[np.ndarray, Optional[str], bool]:
    """:func:`as_input`, and whether the array is ``tensor``'s own memory (contiguous), so an in-place result
    written there needs no copy back."""
    check_tensor(tensor, what)
    if _on_device_path(tensor):
        described = as_device(tensor)
        return described, described.dtype, tensor.is_contiguous()
    if not tensor.is_contiguous():
        view, dtype = numpy_view(tensor.contiguous())
        return view, dtype, False
    view, dtype = numpy_view(tensor)
    return view, dtype, True


def as_output(tensor: torch.Tensor) -> Tuple[np.ndarray, Callable[[object], torch.Tensor]]:
    """A contiguous numpy buffer for the core to write into, and a finisher returning ``tensor`` holding the result.

    A contiguous tensor is written in place; a non-contiguous one gets a contiguous scratch buffer that the
    finisher copies back. On the device path the buffer is a :class:`DeviceTensor` over the (scratch) tensor.
    """
    if _on_device_path(tensor):
        target = tensor if tensor.is_contiguous() else torch.empty(tensor.shape, dtype=tensor.dtype,
                                                                    device=tensor.device)

        def finish_device(result) -> torch.Tensor:
            """The output tensor once the device result is in it (copied back from the scratch tensor if one was used)."""
            settle(result)
            if target is not tensor:
                with torch.no_grad():
                    tensor.copy_(target)
            return tensor
        return as_device(target), finish_device
    if tensor.is_contiguous():
        view, _ = numpy_view(tensor)
        return view, lambda _result: tensor
    scratch = torch.empty(tensor.shape, dtype=tensor.dtype)
    view, _ = numpy_view(scratch)

    def finish(_result) -> torch.Tensor:
        """The output tensor once the scratch buffer's result is copied back into it."""
        with torch.no_grad():
            tensor.copy_(scratch)
        return tensor
    return view, finish


def settle(result) -> None:
    """Order the current stream after a device result (and every device result in a list or tuple)."""
    if type(result) is DeviceTensor:
        if result.ready is not None:
            wait_ready(result.ready, result.data)
    elif isinstance(result, (list, tuple)):
        for item in result:
            settle(item)


def to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``dtype`` over a result array from the core (no copy unless the array is read-only); a device
    result's own tensor, once the current stream is ordered after it."""
    if type(array) is DeviceTensor:
        settle(array)
        return array.data
    if not array.flags.writeable:
        array = array.copy()
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class _TorchOps:
    """The host-staged path for torch tensors (:class:`horovod.common.device.DeviceOps`)."""

    def to_host(self, tensor: DeviceTensor) -> np.ndarray:
        """A host copy in pinned memory where CUDA is there (the copy is complete on return)."""
        source = tensor.data
        pinned = source.is_cuda
        host = torch.empty(source.shape, dtype=source.dtype, pin_memory=pinned)
        host.copy_(source)
        return numpy_view(host)[0]

    def to_device(self, array: np.ndarray, like: DeviceTensor, out: Optional[DeviceTensor] = None) -> DeviceTensor:
        """``array`` back on ``like``'s device, into ``out`` when given."""
        source = to_tensor(array, like.data.dtype)
        device = like.data.device
        if out is not None:
            with torch.no_grad():
                out.data.copy_(source.view(out.data.shape))
            target = out.data
        else:
            target = source.to(device)
        return DeviceTensor(target, like.device, like.dtype, tuple(target.shape), None, self)


TORCH_OPS = _TorchOps()
