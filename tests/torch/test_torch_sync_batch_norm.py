"""SyncBatchNorm on 2 spawned ranks equals BatchNorm on the concatenated batch: outputs, input and weight gradients,
running statistics, with equal and unequal per-rank batch sizes."""

import pytest
import torch

from horovod.testing import spawn_ranks


def full_batch(sizes, shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((sum(sizes),) + shape, generator=g, dtype=torch.float64) * 3 + 1


def _compare(sizes, shape, momentum):
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    try:
        me, channels = hvd.rank(), shape[0]
        x_full = full_batch(sizes, shape, seed=len(shape))
        upstream = full_batch(sizes, shape, seed=99)   # dL/dy, so L = sum(y * upstream)
        start = sum(sizes[:me])
        mine = slice(start, start + sizes[me])

        bn = torch.nn.BatchNorm1d(channels, momentum=momentum).double() if len(shape) < 3 else \
            torch.nn.BatchNorm2d(channels, momentum=momentum).double()
        with torch.no_grad():
            bn.weight.copy_(torch.linspace(0.5, 2.0, channels))
            bn.bias.copy_(torch.linspace(-1.0, 1.0, channels))
        sync = hvd.SyncBatchNorm(channels, momentum=momentum).double()
        sync.load_state_dict(bn.state_dict())

        x_ref = x_full.clone().requires_grad_()
        y_ref = bn(x_ref)
        (y_ref * upstream).sum().backward()

        x = x_full[mine].clone().requires_grad_()
        y = sync(x)
        (y * upstream[mine]).sum().backward()
        weight_grad = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
        bias_grad = hvd.allreduce(sync.bias.grad, op=hvd.Sum)

        errors = {
            "output": float((y - y_ref[mine]).abs().max()),
            "input grad": float((x.grad - x_ref.grad[mine]).abs().max()),
            "weight grad": float((weight_grad - bn.weight.grad).abs().max()),
            "bias grad": float((bias_grad - bn.bias.grad).abs().max()),
            "running mean": float((sync.running_mean - bn.running_mean).abs().max()),
            "running var": float((sync.running_var - bn.running_var).abs().max()),
        }
        sync.eval()
        bn.eval()
        errors["eval output"] = float((sync(x_full[mine]) - bn(x_full[mine])).abs().max())
        return errors
    finally:
        hvd.shutdown()


def _all_cases():
    return [(case, _compare(*case)) for case in (((3, 3), (4,), 0.1), ((2, 5), (3, 4, 4), 0.3), ((4, 1), (2, 3), None))]


@pytest.mark.ranks
def test_sync_batch_norm_equals_batch_norm_on_the_full_batch():
    for rank, cases in enumerate(spawn_ranks(_all_cases, 2, timeout=90)):
        for case, errors in cases:
            bad = {k: v for k, v in errors.items() if not v < 1e-9}
            assert not bad, f"rank {rank}, batch sizes/shape/momentum {case}: {bad}"


@pytest.mark.unit
def test_sync_batch_norm_rejects_1d_input():
    import horovod.torch as hvd
    with pytest.raises(ValueError):
        hvd.SyncBatchNorm(3)(torch.ones(3))
