"""The torch binding's cache of numpy views: reused for the same live tensor, renewed when its memory, shape or dtype
changes, dropped when the tensor dies (tier unit)."""

import gc

import numpy as np
import pytest
import torch

from horovod.torch import _tensors

pytestmark = pytest.mark.unit


def test_same_tensor_same_view_and_shared_memory():
    t = torch.ones(4)
    v1, _ = _tensors.as_input(t)
    v2, _ = _tensors.as_input(t)
    assert v1 is v2
    v1[0] = 7.0
    assert t[0].item() == 7.0


def test_new_storage_shape_or_dtype_renews_the_view():
    t = torch.ones(4)
    _tensors.as_input(t)
    t.data = torch.zeros(8)
    v, _ = _tensors.as_input(t)
    assert v.shape == (8,) and not v.any()
    t.resize_(2)
    assert _tensors.as_input(t)[0].shape == (2,)
    t.data = torch.zeros(2, dtype=torch.bfloat16)
    v, dtype = _tensors.as_input(t)
    assert dtype == "bfloat16" and v.dtype == np.uint16


def test_non_contiguous_is_copied_and_not_cached():
    t = torch.arange(12.0).reshape(3, 4).t()
    v, _ = _tensors.as_input(t)
    assert v.flags.c_contiguous and np.array_equal(v, t.numpy())
    assert id(t) not in _tensors._views


def test_entry_goes_with_the_tensor():
    t = torch.ones(3)
    _tensors.as_input(t)
    key = id(t)
    assert key in _tensors._views
    del t
    gc.collect()
    assert key not in _tensors._views
