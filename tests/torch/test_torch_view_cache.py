"""The torch binding's views for in-place collectives: made from the address, so they own no memory; served to any
tensor with the address, shape and dtype they were made for while it is contiguous; never held for a dead tensor
(tier unit)."""

import gc
import weakref

import numpy as np
import pytest
import torch

from horovod.torch import _tensors

pytestmark = pytest.mark.unit


def _view(t):
    found = _tensors.inplace_view(t)
    return None if found is None else found[2]


def test_same_tensor_same_view_sharing_its_memory():
    t = torch.ones(4)
    v1, v2 = _view(t), _view(t)
    assert v1 is v2 and v1.flags.writeable and v1.flags.c_contiguous
    v1[0] = 7.0
    assert t[0].item() == 7.0
    assert _tensors.inplace_view(t)[3] == "float32"


def test_another_tensor_at_the_same_address_gets_the_same_view():
    t = torch.ones(6)
    alias = t.detach()           # another tensor object over the same memory
    assert _view(alias) is _view(t)
    _view(alias)[5] = 3.0
    assert t[5].item() == 3.0


def test_new_address_shape_dtype_or_layout_makes_a_new_view():
    t = torch.ones(4)
    first = _view(t)
    t.data = torch.zeros(8)
    v = _view(t)
    assert v is not first and v.shape == (8,) and not v.any()
    t.resize_(2)                                             # same address, smaller
    assert _view(t).shape == (2,)
    t.data = t.view(torch.int32)                             # same address, another dtype
    assert _view(t).dtype == np.int32
    square = torch.arange(9.0).reshape(3, 3)
    assert _view(square) is not None
    square.t_()                                              # same address, shape and dtype; not contiguous
    assert _tensors.inplace_view(square) is None


def test_bfloat16_travels_as_words():
    t = torch.ones(4, dtype=torch.bfloat16)
    view, core_dtype = _tensors.inplace_view(t)[2:4]
    assert view.dtype == np.uint16 and core_dtype == "bfloat16"
    assert np.array_equal(view, t.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("make", [lambda: torch.arange(12.0).reshape(3, 4).t(), lambda: torch.ones(0),
                                  lambda: torch.ones(3, dtype=torch.complex64),
                                  lambda: torch._neg_view(torch.ones(3)), lambda: torch._neg_view(torch.ones(1))],
                         ids=["non-contiguous", "empty", "complex", "negative-bit", "negative-bit-one-element"])
def test_tensors_for_the_general_path_get_none(make):
    assert _tensors.inplace_view(make()) is None


def test_one_element_tensors_get_a_view_but_never_serve_a_negative_bit_alias():
    t = torch.ones(1)
    view = _view(t)
    assert view is not None and view.shape == (1,) and _view(t) is view
    scalar = torch.tensor(2.0)
    assert _view(scalar).shape == ()
    negated = torch._neg_view(t)        # same address, shape, dtype and contiguity: only is_neg tells it apart
    assert negated.data_ptr() == t.data_ptr() and _tensors.inplace_view(negated) is None


def test_bad_input_gets_the_general_errors():
    with pytest.raises(TypeError, match="torch.Tensor"):
        _tensors.inplace_view(np.ones(3))
    with pytest.raises(ValueError, match="CPU"):
        _tensors.inplace_view(torch.empty(3, device="meta"))
    with pytest.raises(ValueError, match="sparse"):
        _tensors.inplace_view(torch.ones(3).to_sparse())


def test_the_map_keeps_no_tensor_or_memory_alive():
    t = torch.ones(1000)
    view = _view(t)
    assert not isinstance(view.base, torch.Tensor)
    ref = weakref.ref(t)
    del t
    if ref() is not None:   # freed at once unless a cycle holds it: a full collection (about 0.4 s with the
        gc.collect()        # frameworks loaded) only then
    assert ref() is None


def test_the_map_is_bounded(monkeypatch):
    monkeypatch.setattr(_tensors, "_INPLACE_VIEWS_MAX", 4)
    _tensors._inplace_views.clear()
    keep = [torch.ones(3) for _ in range(9)]
    for t in keep:
        assert _view(t) is not None
        assert len(_tensors._inplace_views) <= 4


def test_general_path_views_own_their_memory():
    t = torch.ones(4)
    view, dtype = _tensors.as_input(t)
    assert dtype is None and np.shares_memory(view, t.numpy())
    view, _ = _tensors.as_input(torch.arange(12.0).reshape(3, 4).t())
    assert view.flags.c_contiguous and np.array_equal(view, np.arange(12.0).reshape(3, 4).T)
