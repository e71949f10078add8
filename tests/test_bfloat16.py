"""The one bfloat16 codec against references (ml_dtypes bit for bit, torch), and every caller through it: the
asynchronous-training wire (``runtime.async_policy``) and the engine's 2-byte reductions (``algorithms.reduction``)."""

import numpy as np
import pytest

from horovod.algorithms import reduction
from horovod.common.bfloat16 import from_bfloat16, to_bfloat16
from horovod.runtime import async_policy

pytestmark = pytest.mark.unit

# Low halves that matter to rounding: exact, just above, below, at and above the tie, the largest.
_LOW_HALVES = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)


def _every_rounding_case() -> np.ndarray:
    """float32 values: every bfloat16 high half (both signs, zeros, subnormals, the largest finite, ±Inf, every NaN
    payload) with each low half above, plus random bits."""
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    bits = (high[:, None] | _LOW_HALVES[None, :]).ravel()
    randoms = np.random.default_rng(0).integers(0, 1 << 32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits, randoms]).view(np.float32)


# -- the codec against references -----------------------------------------------------------------------------------

def test_narrowing_matches_ml_dtypes_bit_for_bit():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = _every_rounding_case()
    with np.errstate(invalid="ignore"):
        expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(to_bfloat16(values), expected)


def test_narrowing_matches_torch_and_nan_stays_nan():
    torch = pytest.importorskip("torch")
    values = _every_rounding_case()
    words = to_bfloat16(values)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(values)
    assert np.array_equal(words[~nan], expected[~nan])    # torch makes every NaN 0xFFFF (sign lost): NaN-ness only
    assert np.isnan(from_bfloat16(words[nan])).all()


def test_special_values():
    bits = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
                     0x00000000, 0x80000000, 0x3F808000, 0x3F818000, 0x00008000, 0x00018000], dtype=np.uint32)
    words = to_bfloat16(bits.view(np.float32))
    assert [hex(w) for w in words] == [
        "0x7fc0", "0xffc0", "0x7fc0", "0xffc0",     # NaN: quiet NaN with its sign, never Inf
        "0x7f80", "0xff80",                          # ±Inf stay Inf
        "0x7f80", "0xff80",                          # the largest float32 rounds up to Inf, as it must
        "0x0", "0x8000",                             # ±0
        "0x3f80", "0x3f82",                          # ties round to even
        "0x0", "0x2"]                                # subnormal ties too


def test_widening_is_exact_for_every_word():
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = from_bfloat16(words)
    assert values.dtype == np.float32
    assert np.array_equal(values.view(np.uint32), words.astype(np.uint32) << 16)
    finite_or_inf = ~np.isnan(values)
    assert np.array_equal(to_bfloat16(values)[finite_or_inf], words[finite_or_inf])    # a round trip is exact
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert np.array_equal(words.view(ml_dtypes.bfloat16).astype(np.float32)[finite_or_inf], values[finite_or_inf])


def test_out_shapes_and_strides():
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2] * 1.01
    out = np.empty((2, 2, 4), dtype=np.uint16)
    assert to_bfloat16(values, out=out) is out and np.array_equal(out, to_bfloat16(values.copy()))
    back = np.empty((2, 2, 4), dtype=np.float32)
    assert from_bfloat16(out, out=back) is back and np.allclose(back, values, rtol=1e-2)
    assert to_bfloat16(np.float32(np.nan)).shape == () and to_bfloat16(np.float32(np.nan)) == 0x7FC0
    assert np.array_equal(to_bfloat16(np.array([1.0, 2.5])), to_bfloat16(np.array([1.0, 2.5], np.float32)))


# -- every caller uses the codec ------------------------------------------------------------------------------------

def _through_async_wire(values: np.ndarray) -> np.ndarray:
    words = async_policy.to_wire(values, "bfloat16")
    assert words.dtype == np.uint16
    return words


def _through_reduction(values: np.ndarray) -> np.ndarray:
    words = np.empty(values.shape, dtype=np.uint16)
    reduction.from_float32(values, "bfloat16", words)
    return words


@pytest.mark.parametrize("narrow", [_through_async_wire, _through_reduction], ids=["async_wire", "reduction"])
def test_callers_narrow_like_the_codec(narrow):
    values = _every_rounding_case()
    words = narrow(values)
    assert np.array_equal(words, to_bfloat16(values))
    nan_payload = np.array([0x7F800001, 0xFF800001], dtype=np.uint32).view(np.float32)
    assert [hex(w) for w in narrow(nan_payload)] == ["0x7fc0", "0xffc0"]       # not 0x7f80, +Inf


def test_callers_widen_like_the_codec():
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    expected = from_bfloat16(words).view(np.uint32)
    assert np.array_equal(async_policy.from_wire(words, "bfloat16", np.float32).view(np.uint32), expected)
    out = np.empty(words.shape, dtype=np.float32)
    reduction.to_float32(words, "bfloat16", out)
    assert np.array_equal(out.view(np.uint32), expected)
