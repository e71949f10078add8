"""The asynchronous torch optimizers on 2 and 3 spawned ranks (one job per size runs every check).

* LocalSGD (warm-up, period, asynchronous averaging with its correction, optimizer buffers averaged too): after
  every averaging every rank holds the same bits; between averagings the ranks really step on their own.
* OuterOptimizer (Nesterov outer SGD, deltas as fp16 and bf16, a torch outer optimizer): same bits after each
  outer step; with one rank's worth of data it equals the outer rule computed by hand.
* DistributedOptimizer(staleness=1) equals a single-process reference that applies the previous step's average of
  every rank's gradients (1e-6).
* Gossip: the schedule is the same on every rank, partners hold the same bits after an exchange, repeated rounds
  take every rank to the global average, and gossip SGD on a quadratic finds the global minimum; a pair completes
  its exchanges while a third rank is blocked outside Horovod (no wait for non-partners).
"""

import os
import tempfile

import numpy as np
import pytest
import torch

from horovod.testing import spawn_ranks

STEPS = 10


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gathered(hvd, model):
    """Every rank's parameters (a row per rank), bit for bit."""
    return hvd.allgather(flat(model).unsqueeze(0)).numpy()


def identical(rows):
    return all(np.array_equal(rows[0].view(np.uint32), r.view(np.uint32)) for r in rows[1:])


def train_steps(hvd, model, opt, steps=STEPS):
    """Local steps; per step whether the optimizer averaged and whether all ranks then held the same bits."""
    out = []
    for step in range(steps):
        x, y = batch(step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out.append((opt.averaged, identical(gathered(hvd, model))))
    return out


def check_local_sgd(hvd, _fifo=None):
    model = make_model()
    opt = hvd.LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                named_parameters=model.named_parameters(), period=3, warmup_steps=2,
                                average_state=True)
    rows = train_steps(hvd, model, opt)
    # warm-up steps 1-2 average gradients; then submissions after steps 5 and 8, applied after steps 6 and 9.
    assert [a for a, _ in rows] == [False] * 5 + [True, False, False, True, False], rows
    assert all(same for a, same in rows[:2]) and all(same for a, same in rows if a), rows
    assert not rows[2][1] and not rows[9][1], "local steps should differ between ranks"
    momenta = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    opt.synchronize()
    assert identical(gathered(hvd, model))
    assert identical(hvd.allgather(torch.cat([m.reshape(-1) for m in momenta]).unsqueeze(0)).numpy())
    sync = hvd.LocalSGDOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), period=2, overlap_steps=0)
    assert sync.state_dict()["hvd_async"] == {"step": 0}


def check_outer(hvd, _fifo=None):
    for compression in (hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.bf16):
        model = make_model()
        opt = hvd.OuterOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), period=4, compression=compression)
        rows = train_steps(hvd, model, opt, 8)
        assert [a for a, _ in rows] == [False, False, False, True] * 2 and all(s for a, s in rows if a), rows
        assert not rows[0][1]
    # A torch outer optimizer (plain SGD, lr 1) makes the anchor the average of the ranks' parameters.
    model = make_model()
    before = flat(model)
    opt = hvd.OuterOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), period=2,
                             outer_optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=1.0))
    local = []
    for step in range(2):
        x, y = batch(step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 1:
            with torch.no_grad():
                expected = flat(model) - 0.05 * torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            local = hvd.allreduce(expected, op=hvd.Average)
        opt.step()
    assert torch.allclose(flat(model), local, atol=1e-6) and not torch.equal(flat(model), before)


def check_stale(hvd, _fifo=None):
    n = hvd.size()
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), staleness=1)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    previous = None
    for step in range(6):
        x, y = batch(step, hvd.rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        grads = []
        for r in range(n):                      # the reference: every rank's gradient at the same parameters
            ref.zero_grad()
            torch.nn.functional.mse_loss(ref(batch(step, r)[0]), batch(step, r)[1]).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        average = [sum(gs) / n for gs in zip(*grads)]
        if previous is not None:
            for p, g in zip(ref.parameters(), previous):
                p.grad = g
            ref_opt.step()
        previous = average
    diff = float((flat(model) - flat(ref)).abs().max())
    assert diff < 1e-6, diff
    assert float((flat(model) - flat(make_model())).abs().max()) > 1e-3
    with pytest.raises(ValueError, match="staleness does not support"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), staleness=1, groups=2)


def check_gossip_schedule_and_pairs(hvd, _fifo=None):
    model = make_model(hvd.rank())                  # different on purpose
    opt = hvd.GossipOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), topology="ring")
    for step in range(4):
        opt.step()
        rows = gathered(hvd, model)
        schedule = opt._hvd_schedule
        pair = [p for p in schedule.rounds[step % len(schedule.rounds)] if hvd.rank() in p]
        if pair:
            assert np.array_equal(rows[pair[0][0]], rows[pair[0][1]])
    assert hvd.allgather_object(opt._hvd_schedule.rounds) == [opt._hvd_schedule.rounds] * hvd.size()


def check_gossip_average_and_quadratic(hvd, _fifo=None):
    for topology in ("ring", "exponential"):
        x = torch.nn.Parameter(torch.arange(4, dtype=torch.float64) * (hvd.rank() + 1))
        target = hvd.allreduce(x.detach(), op=hvd.Average)
        opt = hvd.GossipOptimizer(torch.optim.SGD([x], lr=0.0), topology=topology)
        for _ in range(40):
            opt.step()
        assert float((x.detach() - target).abs().max()) < 1e-9, (topology, x, target)
        # Gossip SGD on f_r(x) = |x - c_r|^2 / 2: the minimum of the sum is the mean of the c_r.
        c = torch.full((3,), float(hvd.rank() * 2), dtype=torch.float64)
        x = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        opt = hvd.GossipOptimizer(torch.optim.SGD([x], lr=0.1), topology=topology)
        for step in range(120):
            for group in opt.param_groups:
                group["lr"] = 0.4 / (1 + step / 10)
            opt.zero_grad()
            (0.5 * ((x - c) ** 2).sum()).backward()
            opt.step()
        mean_c = float(hvd.size() - 1)
        assert float((x.detach() - mean_c).abs().max()) < 0.08, (topology, x)
        assert abs(float(hvd.allreduce(x.detach(), op=hvd.Average)[0]) - mean_c) < 1e-3, (topology, x)


def check_no_wait_for_non_partners(hvd, fifo):
    """Ranks 0 and 1 run their exchanges while rank 2 is blocked opening a fifo that rank 0 opens only after."""
    if hvd.size() != 3:
        return
    from horovod.runtime.gossip import Gossip
    gossip = Gossip("ring")
    params = [np.full(1000, float(hvd.rank()), dtype=np.float32)]
    gossip.before_step(params)                      # every rank registers the pair sets
    if hvd.rank() == 2:
        with open(fifo, "rb") as reader:            # blocks until rank 0 is done
            assert reader.read() == b"done"
    elif hvd.rank() < 2:
        for _ in range(20):
            gossip.step = 0                         # round 0 pairs ranks 0 and 1 only
            gossip.after_step(params)
        assert params[0][0] == 0.5
        if hvd.rank() == 0:
            with open(fifo, "wb") as writer:
                writer.write(b"done")
    hvd.barrier()


def _run(checks, fifo):
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic")
    try:
        for check in checks:
            check(hvd, fifo)
    finally:
        hvd.shutdown()
    return True


CHECKS = [check_local_sgd, check_outer, check_stale, check_gossip_schedule_and_pairs,
          check_gossip_average_and_quadratic, check_no_wait_for_non_partners]


@pytest.mark.ranks
@pytest.mark.parametrize("size", [2, 3])
def test_async_torch(size):
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        assert spawn_ranks(_run, size, timeout=180, args=(CHECKS, fifo)) == [True] * size
