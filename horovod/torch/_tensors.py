"""Tensor <-> numpy conversion for the torch binding: zero-copy views of CPU tensors, bfloat16 as 16-bit words.

The core works on numpy arrays only. A contiguous CPU tensor is handed over as a view of its own memory; a
non-contiguous one travels as a contiguous copy (and in-place ops copy the result back); bfloat16, which numpy lacks,
travels as its raw ``uint16`` bit pattern with ``dtype="bfloat16"`` so the core widens it to reduce.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

__all__ = ["check_tensor", "numpy_view", "inplace_view", "as_input", "as_input_view", "as_output",
           "to_tensor"]

_GPU_MESSAGE = ("horovod-py supports only CPU tensors for now, but got a tensor on {device}. Move it to the CPU "
                "with tensor.cpu() before the collective (and the result back with .to(device)) until GPU support "
                "exists.")


def check_tensor(tensor, what: str = "tensor") -> torch.Tensor:
    """Validate a collective's input: a dense CPU tensor.

    Raises:
        TypeError: not a tensor. ValueError: a GPU (or other non-CPU) tensor, or a sparse one.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(tensor).__name__}")
    if not tensor.is_cpu:      # (``is_cpu`` costs a sixth of ``device.type``: this runs per gradient)
        raise ValueError(_GPU_MESSAGE.format(device=tensor.device))
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


def as_input(tensor: torch.Tensor, what: str = "tensor") -> Tuple[np.ndarray, Optional[str]]:
    """The numpy array to submit for ``tensor``: a view when contiguous, else a view of a contiguous copy. The
    array keeps the memory it shows alive, so the caller need not keep ``tensor``."""
    check_tensor(tensor, what)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return numpy_view(tensor)


# Views for in-place collectives, by data pointer. A training step hands over its gradients every step, and making a
# numpy view (``Tensor.numpy()``, about 1.5 us) would be most of the binding's cost per gradient. These views do not
# own their memory: they are made from the address, so an entry holds no dead tensor's memory, needs no weak reference
# to be dropped (a weak reference's callback costs more than the view), and serves the next tensor at the same address
# (``zero_grad()`` frees the gradients, and the next backward pass gets the same blocks back from the allocator). An
# entry serves a tensor only if the tensor's shape and dtype are the ones the view was made for and it is contiguous:
# then the view is exactly the tensor's memory, whichever tensor made the entry. (Entries are made only for tensors of
# two or more elements without a negative bit; a negative-bit view of that size is strided, so it never matches.) The
# caller keeps the tensor alive until its collective completes (the torch handle holds it).
#   data pointer -> (shape, torch dtype, numpy view, core dtype name)
_inplace_views: Dict[int, tuple] = {}
_INPLACE_VIEWS_MAX = 1 << 15       # distinct addresses kept; past this the map starts again (a few MB at most)

# torch dtype -> (numpy dtype of the view, the core's dtype name): the dtypes the core reduces.
_CORE_DTYPES = {torch.uint8: (np.dtype(np.uint8), "uint8"), torch.int8: (np.dtype(np.int8), "int8"),
                torch.int16: (np.dtype(np.int16), "int16"), torch.int32: (np.dtype(np.int32), "int32"),
                torch.int64: (np.dtype(np.int64), "int64"), torch.float16: (np.dtype(np.float16), "float16"),
                torch.bfloat16: (np.dtype(np.uint16), "bfloat16"), torch.float32: (np.dtype(np.float32), "float32"),
                torch.float64: (np.dtype(np.float64), "float64"), torch.bool: (np.dtype(np.bool_), "bool")}


def inplace_view(tensor: torch.Tensor) -> Optional[tuple]:
    """For an in-place collective on ``tensor``: ``(shape, dtype, view, core dtype name)``, with ``view`` a numpy
    array over the tensor's own memory, or None when the tensor needs the general path (non-contiguous, fewer than
    two elements, a negative bit, or a dtype the core does not reduce; the general path copies or raises). Runs once
    per gradient per step: a hit asks torch four questions, none of which releases the GIL. The caller keeps ``tensor`` alive while the view is in use.

    Raises:
        TypeError, ValueError: as :func:`check_tensor`.
    """
    try:
        entry = _inplace_views.get(tensor.data_ptr())
    except (AttributeError, RuntimeError):     # not a tensor, or one without a data pointer (sparse)
        check_tensor(tensor)
        raise
    if entry is not None and entry[0] == tensor.shape and entry[1] == tensor.dtype and tensor.is_contiguous():
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
    if core is None or address == 0 or tensor.numel() < 2 or not tensor.is_contiguous() or tensor.is_neg():
        return None
    shape = tuple(tensor.shape)
    view = np.asarray(_Memory(address, shape, core[0]))
    if len(_inplace_views) >= _INPLACE_VIEWS_MAX:
        _inplace_views.clear()
    entry = _inplace_views[address] = (tensor.shape, tensor.dtype, view, core[1])
    return entry


def as_input_view(tensor: torch.Tensor, what: str = "tensor") -> Tuple[np.ndarray, Optional[str], bool]:
    """:func:`as_input`, and whether the array is ``tensor``'s own memory (contiguous), so an in-place result
    written there needs no copy back."""
    check_tensor(tensor, what)
    if not tensor.is_contiguous():
        view, dtype = numpy_view(tensor.contiguous())
        return view, dtype, False
    view, dtype = numpy_view(tensor)
    return view, dtype, True


def as_output(tensor: torch.Tensor) -> Tuple[np.ndarray, Callable[[object], torch.Tensor]]:
    """A contiguous numpy buffer for the core to write into, and a finisher returning ``tensor`` holding the result.

    A contiguous tensor is written in place; a non-contiguous one gets a contiguous scratch buffer that the
    finisher copies back.
    """
    if tensor.is_contiguous():
        view, _ = numpy_view(tensor)
        return view, lambda _result: tensor
    scratch = torch.empty(tensor.shape, dtype=tensor.dtype)
    view, _ = numpy_view(scratch)

    def finish(_result) -> torch.Tensor:
        with torch.no_grad():
            tensor.copy_(scratch)
        return tensor
    return view, finish


def to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``dtype`` over a result array from the core (no copy unless the array is read-only)."""
    if not array.flags.writeable:
        array = array.copy()
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
