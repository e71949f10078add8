"""The bindings' shared gradient policy and compression (horovod.runtime.gradient_policy, .compression): pure rules,
no processes. The bindings' own tests check the same rules end to end on spawned ranks."""

import warnings

import numpy as np
import pytest

from horovod.runtime import compression as comp
from horovod.runtime import gradient_policy as gp

pytestmark = pytest.mark.unit


def test_predivide_and_reduction_scales():
    assert gp.predivide_factors(gp.Average, 4.0) == (0.25, 4.0)
    assert gp.predivide_factors(gp.Sum, 4.0) == (1.0, 1.0)
    assert gp.reduction_scale(gp.Average, 4, 0.5, 3.0) == pytest.approx(0.375)
    assert gp.reduction_scale(gp.Sum, 4, 0.5, 3.0) == 1.5
    assert gp.aggregation_scale(4, True) == 0.25 and gp.aggregation_scale(4, False) == 1.0


def test_scale_factor_checks():
    assert gp.check_scale_factors(2, np.float32(0.5)) == (2.0, 0.5)
    with pytest.raises(TypeError, match="prescale_factor"):
        gp.check_scale_factors("2", 1.0)
    with pytest.raises(ValueError, match="postscale_factor"):
        gp.check_scale_factors(1.0, float("inf"))


def test_optimizer_argument_checks():
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        gp.check_optimizer_arguments(gp.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        gp.check_optimizer_arguments(gp.Average, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="Adasum"):
        gp.check_optimizer_arguments(gp.Adasum, average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="list of list of tf.Variable"):
        gp.check_optimizer_arguments(gp.Average, groups=-1, what="tf.Variable")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gp.check_optimizer_arguments(gp.Average, num_groups=3) == 3
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(NotImplementedError):
        gp.check_sparse_op(gp.Adasum)
    with pytest.raises(ValueError):
        gp.check_sparse_op(gp.resolve_op(None, None).__class__.MAX)
    with pytest.raises(RuntimeError, match="reducescatter"):       # Horovod's type, not a ValueError
        gp.check_reducescatter_op(gp.Adasum)
    with pytest.raises(RuntimeError, match="0-d"):
        gp.check_reducescatter_op(gp.Sum, [2, 0])
    gp.check_reducescatter_op(gp.Average, [1, 3])
    assert gp.is_power_of_two(8) and not gp.is_power_of_two(6) and not gp.is_power_of_two(0)


@pytest.mark.parametrize("n,groups,want", [
    (5, None, [[0], [1], [2], [3], [4]]), (5, 2, [[0, 1, 2], [3, 4]]), (2, 3, [[0], [1]]), (0, 2, []),
])
def test_split_groups_in_order(n, groups, want):
    assert gp.split_groups(groups, list(range(n)), key=lambda x: x) == want


def test_split_groups_explicit():
    items = ["a", "b", "c", "d"]
    assert gp.split_groups([["d", "b"], ["x"]], items, key=str) == [[3, 1], [0], [2]]
    with pytest.raises(ValueError, match="only appear once"):
        gp.split_groups([["a"], ["a"]], items, key=str)
    with pytest.raises(ValueError, match="consist of"):
        gp.split_groups([[1]], items, key=str, member_check=lambda m: isinstance(m, str))


def test_parameter_names():
    a, b = object(), object()
    assert gp.parameter_names([[a], [b]]) == {id(a): "noname.0.0", id(b): "noname.1.0"}
    assert gp.parameter_names([[a, b]], [("w", a), ("v", b)]) == {id(a): "w", id(b): "v"}
    with pytest.raises(ValueError, match="unique"):
        gp.parameter_names([[a, b]], [("w", a), ("w", b)])
    with pytest.raises(ValueError, match="not named"):
        gp.parameter_names([[a, b]], [("w", a)])
    with pytest.raises(ValueError, match="tuples"):
        gp.parameter_names([[a]], [a])


def test_pass_counter():
    counter = gp.PassCounter(["w"], 2)
    assert counter.count("w") is False and counter.count("w") is True
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        counter.count("w")
    counter.reset("w")
    assert counter.count("w") is False
    counter.set_passes(1)
    assert counter.count("w") is True
    with pytest.raises(ValueError):
        counter.set_passes(0)


def test_cast_compressor_round_trip_and_passthrough():
    x = np.linspace(0, 1, 5)
    wire, ctx = comp.Compression.fp16.compress(x)
    assert wire.dtype == np.float16 and ctx == np.float64
    assert comp.Compression.fp16.decompress(wire, ctx).dtype == np.float64
    ints = np.arange(3)
    assert comp.Compression.fp16.compress(ints) == (ints, None)
    assert comp.Compression.none.compress(x)[0] is x
    tensors, ctxs = comp.compress_all(comp.Compression.fp16, [x, ints])
    assert [t.dtype for t in comp.decompress_all(comp.Compression.fp16, tensors, ctxs)] == [x.dtype, ints.dtype]
