"""Tensor <-> numpy conversion for the torch binding: zero-copy views of CPU tensors, bfloat16 as 16-bit words.

The core works on numpy arrays only. A contiguous CPU tensor is handed over as a view of its own memory; a
non-contiguous one travels as a contiguous copy (and in-place ops copy the result back); bfloat16, which numpy lacks,
travels as its raw ``uint16`` bit pattern with ``dtype="bfloat16"`` so the core widens it to reduce.
"""

from __future__ import annotations

import weakref
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

__all__ = ["check_tensor", "numpy_view", "as_input", "as_input_view", "as_output", "to_tensor"]

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


# Views of contiguous tensors, by tensor object: a training loop hands over the same gradient tensors every step, and
# ``Tensor.numpy()`` costs several microseconds per call, which is most of the binding's cost per tensor. An entry is
# used only while its tensor lives (weak reference; the entry goes when the tensor does) and still has the same data
# pointer, shape and dtype and is contiguous, so ``t.data = ...``, ``set_`` or ``resize_`` make a new view.
_views: Dict[int, tuple] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _views.get(key)
    if entry is not None and entry[0] is ref:
        del _views[key]


def as_input(tensor: torch.Tensor, what: str = "tensor") -> Tuple[np.ndarray, Optional[str]]:
    """The numpy array to submit for ``tensor``: a view when contiguous, else a view of a contiguous copy."""
    view, dtype, _own = as_input_view(tensor, what)
    return view, dtype


def as_input_view(tensor: torch.Tensor, what: str = "tensor") -> Tuple[np.ndarray, Optional[str], bool]:
    """:func:`as_input`, and whether the array is ``tensor``'s own memory (contiguous), so an in-place result
    written there needs no copy back. Each torch call here costs a gradient a few hundred ns while the engine
    thread runs, so the cached path asks torch four questions and no more."""
    key = id(tensor)
    entry = _views.get(key)
    if (entry is not None and entry[0]() is tensor and entry[1] == tensor.data_ptr() and entry[2] == tensor.shape
            and entry[3] == tensor.dtype and tensor.is_contiguous()):
        return entry[4], entry[5], True
    check_tensor(tensor, what)
    if not tensor.is_contiguous():
        view, dtype = numpy_view(tensor.contiguous())
        return view, dtype, False
    view, dtype = numpy_view(tensor)
    ref = weakref.ref(tensor, lambda r, k=key: _forget(k, r))
    _views[key] = (ref, tensor.data_ptr(), tensor.shape, tensor.dtype, view, dtype)
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
