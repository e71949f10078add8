"""Small allreduces: recursive doubling equals the sum with the same bits on every rank at any rank count, and the
choice between it, the exchange and the ring follows size and rank count alike on every rank (tier unit)."""

import logging

import numpy as np
import pytest

from horovod.algorithms import allreduce, latency
from horovod.algorithms.buffers import Buffers
from horovod.algorithms.group import Group
from horovod.common.types import ReduceOp
from horovod.testing.memory_transport import run_threads

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("ufunc", [np.add, np.maximum])
def test_recursive_doubling_reduces_with_equal_bits_everywhere(n, ufunc):
    rng = np.random.default_rng(n)
    inputs = [rng.standard_normal(1001).astype(np.float32) for _ in range(n)]

    def run(group):
        buf = inputs[group.index].copy()
        latency.recursive_doubling_allreduce(group, buf, ufunc, np.empty_like(buf))
        return buf
    results, sent = run_threads(n, run)
    expected = ufunc.reduce(np.stack(inputs).astype(np.float64), axis=0)
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-5)
    assert all(r.tobytes() == results[0].tobytes() for r in results)
    p2 = 1 << (n.bit_length() - 1)
    hops = p2.bit_length() - 1
    assert max(sent) == (hops + (1 if p2 != n else 0)) * 1001 * 4   # one buffer per hop, plus the result sent back


def test_choice_by_size_and_rank_count():
    group = lambda n: Group(tuple(range(n)), 0, None)   # noqa: E731
    assert allreduce.choose(group(2), 4) == allreduce.EXCHANGE
    assert allreduce.choose(group(3), 4) == allreduce.EXCHANGE
    assert allreduce.choose(group(4), 64 << 10) == allreduce.RECURSIVE_DOUBLING
    assert allreduce.choose(group(64), 4) == allreduce.RECURSIVE_DOUBLING
    assert allreduce.choose(group(64), (64 << 10) + 4) == allreduce.RING
    for n in range(3, 130):
        for nbytes in (4, 1 << 10, 16 << 10, 64 << 10):
            exchange = latency.HOP_SECONDS + (n - 1) * (latency.MESSAGE_SECONDS + nbytes * latency.BYTE_SECONDS)
            assert latency.prefer_recursive_doubling(n, nbytes) == (latency._hops(n) * (
                latency.HOP_SECONDS + latency.MESSAGE_SECONDS + nbytes * latency.BYTE_SECONDS) < exchange)


def test_choice_is_in_the_debug_log_and_activity(caplog):
    seen = []

    def run(group):
        buf = np.full(8192, float(group.index + 1))
        allreduce.allreduce(group, buf, ReduceOp.SUM, 1.0, 1.0, [8192], Buffers(),
                            activity=seen.append if group.index == 0 else None)
        return buf
    with caplog.at_level(logging.DEBUG, logger="horovod.algorithms"):
        results, _ = run_threads(8, run)
    assert all(np.array_equal(r, np.full(8192, 36.0)) for r in results)
    assert seen == [allreduce.RECURSIVE_DOUBLING]
    assert "allreduce of 65536 bytes over 8 ranks" in caplog.text and allreduce.RECURSIVE_DOUBLING in caplog.text
