"""The shared asynchronous policy without other processes (tier: unit): the gossip schedule, the wire casts, the
outer optimizer's rule, and local SGD's correction (no progress lost) on a single rank."""

import numpy as np
import pytest

from horovod.runtime import async_policy as ap
from horovod.runtime import gossip


def _connected(size, rounds):
    reach = {0}
    for _ in range(size):
        for chosen in rounds:
            for a, b in chosen:
                if a in reach or b in reach:
                    reach |= {a, b}
    return reach == set(range(size))


@pytest.mark.unit
@pytest.mark.parametrize("topology", ap.TOPOLOGIES)
def test_gossip_rounds_are_matchings_that_connect_every_rank(topology):
    for size in range(1, 10):
        rounds = gossip.gossip_rounds(size, topology)
        assert rounds == gossip.gossip_rounds(size, topology)            # a pure function: alike on every rank
        for chosen in rounds:
            ranks = [r for pair in chosen for r in pair]
            assert len(ranks) == len(set(ranks)), (size, chosen)        # disjoint: one peer per round
            assert all(0 <= a < b < size for a, b in chosen)
        assert size == 1 and rounds == [] or _connected(size, rounds), (size, rounds)
        values = np.random.default_rng(size).standard_normal((size, 3))
        target = values.mean(0)
        for step in range(200):
            for a, b in rounds[step % len(rounds)] if rounds else []:
                values[a] = values[b] = (values[a] + values[b]) / 2
            assert np.allclose(values.mean(0), target)                  # every exchange keeps the average
        assert np.allclose(values, target, atol=1e-9), (size, topology)


@pytest.mark.unit
def test_exponential_schedule_averages_exactly_in_log2_rounds_and_pairs_register_once():
    values = np.arange(8.0)
    for chosen in gossip.gossip_rounds(8, "exponential"):
        for a, b in chosen:
            values[a] = values[b] = (values[a] + values[b]) / 2
    assert np.all(values == 3.5)
    assert gossip.gossip_rounds(4, "ring") == [[(0, 1), (2, 3)], [(1, 2), (0, 3)]]
    pairs = gossip.gossip_pairs(4, "ring")
    assert len(pairs) == len(set(pairs)) == 4
    assert [ps.ranks for ps in gossip.gossip_process_sets(2)] == []     # the global set is the pair
    assert gossip.partner(gossip.gossip_rounds(3), 2, 0) is None and gossip.partner([], 0, 5) is None
    with pytest.raises(ValueError, match="topology"):
        gossip.gossip_rounds(4, "star")


@pytest.mark.unit
def test_wire_casts_round_like_torch():
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 100
    bits = ap.to_wire(values, "bfloat16")
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bits, expected)
    assert np.array_equal(ap.from_wire(bits, "bfloat16", np.float32),
                          torch.from_numpy(values).to(torch.bfloat16).float().numpy())
    assert ap.to_wire(values, "float16").dtype == np.float16
    assert ap.from_wire(ap.to_wire(values, None), None, np.float32) is not values
    assert [ap.wire_dtype_of(c) for c in (None, "fp16", "bf16", "none")] == [None, "float16", "bfloat16", None]
    with pytest.raises(ValueError):
        ap.wire_dtype_of("int8")


@pytest.mark.unit
def test_nesterov_outer_step_is_torch_sgd_with_nesterov():
    torch = pytest.importorskip("torch")
    x = np.linspace(-1, 1, 5).astype(np.float32)
    t = torch.tensor(x.copy(), requires_grad=True)
    reference = torch.optim.SGD([t], lr=0.7, momentum=0.9, nesterov=True)
    outer, anchor = ap.NesterovSGD(0.7, 0.9, True), [x.copy()]
    for k in range(4):
        g = np.full(5, 0.1 * (k + 1), dtype=np.float32)
        t.grad = torch.from_numpy(g.copy())
        reference.step()
        outer(anchor, [g])
    assert np.allclose(anchor[0], t.detach().numpy(), atol=1e-6)
    with pytest.raises(ValueError):
        ap.NesterovSGD(lr=0.0)


@pytest.mark.unit
def test_local_sgd_sets_progress_aside_and_loses_none_on_one_rank():
    import horovod.torch as hvd
    hvd.init()
    try:
        local = ap.LocalSGD(period=3, overlap_steps=2, name="unit.localsgd")
        params = [np.zeros(4)]
        for _ in range(10):
            local.before_step(params)
            params[0] += 1.0                    # a local step that moves every parameter by one
            local.after_step(params)
        local.flush(params)
        assert np.all(params[0] == 10.0)        # the progress made while averages were in flight came back
        assert local.state_dict() == {"step": 10}
        with pytest.raises(ValueError, match="overlap_steps"):
            ap.LocalSGD(period=2, overlap_steps=2)
        with pytest.raises(ValueError, match="period"):
            ap.LocalSGD(period=0)
    finally:
        hvd.shutdown()


@pytest.mark.unit
def test_wire_dtype_of_reads_the_compressor_itself():
    """The compressor class says its wire dtype (its dtype's own name), whatever the class is called."""
    from horovod.runtime import compression as comp
    renamed = comp.cast_compressor("Anything", np.dtype(np.float16), dtype_of=lambda a: a.dtype,
                                   is_floating=lambda d: True, cast=lambda a, d: a.astype(d))
    assert ap.wire_dtype_of(renamed) == "float16"
    assert ap.wire_dtype_of(comp.Compression.fp16) == "float16" and ap.wire_dtype_of(comp.Compression.none) is None
    torch = pytest.importorskip("torch")
    from horovod.torch.compression import Compression
    assert [ap.wire_dtype_of(c) for c in (Compression.none, Compression.fp16, Compression.bf16)] == \
        [None, "float16", "bfloat16"]
    assert comp.wire_dtype_name(torch.bfloat16) == "bfloat16"

    class FP16Compressor(comp.Compressor):      # Horovod's class name, but not a cast: refused
        pass

    with pytest.raises(ValueError):
        ap.wire_dtype_of(FP16Compressor)
