"""``broadcast_optimizer_state`` on a fresh optimizer leaves a zero gradient on every parameter, as Horovod's dummy
step does (issue 30 item 1), at 2 and 3 spawned ranks (tier ranks).

Code written for Horovod reads or broadcasts ``p.grad`` right after it; with ``.grad`` put back to None that failed
with ``TypeError: tensor must be a torch.Tensor, not NoneType``.
"""

import pytest
import torch

from horovod.testing import spawn_ranks


def _fresh_optimizers_leave_zero_grads():
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    frozen = torch.nn.Linear(2, 2)
    frozen.requires_grad_(False)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in model.parameters()]
    plain = torch.optim.Adam(model.parameters(), lr=0.01)
    hvd.broadcast_optimizer_state(plain, root_rank=0)
    plain_grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD(list(model.parameters()) + list(frozen.parameters()),
                                                       lr=0.1, momentum=0.9),
                                       named_parameters=list(model.named_parameters())
                                       + [(f"frozen.{n}", p) for n, p in frozen.named_parameters()])
    hvd.broadcast_optimizer_state(wrapped, root_rank=0)
    # What Horovod users do next: the gradients are tensors to broadcast, reduce and read.
    hvd.broadcast_parameters([(f"grad.{i}", p.grad) for i, p in enumerate(model.parameters())], root_rank=0)
    total = hvd.allreduce(model[0].weight.grad, name="grad.sum", op=hvd.Sum)
    out = dict(plain=[g is not None and g.shape == p.shape and not g.any()
                      for g, p in zip(plain_grads, model.parameters())],
               wrapped=[p.grad is not None and p.grad.shape == p.shape and not p.grad.any()
                        for p in model.parameters()],
               frozen=[p.grad is None for p in frozen.parameters()],
               unmoved=all(torch.equal(p, q) for p, q in zip(model.parameters(), before)),
               total=float(total.abs().sum()))
    hvd.shutdown()
    return out


@pytest.mark.ranks
@pytest.mark.parametrize("world", [2, 3])
def test_fresh_optimizer_state_leaves_zero_gradients(world):
    for rank, out in enumerate(spawn_ranks(_fresh_optimizers_leave_zero_grads, world, timeout=90)):
        assert all(out["plain"]) and len(out["plain"]) == 4, (rank, out)
        assert all(out["wrapped"]) and len(out["wrapped"]) == 4, (rank, out)
        assert all(out["frozen"]), (rank, "a parameter without requires_grad gets no gradient", out)
        assert out["unmoved"] and out["total"] == 0.0, (rank, out)
