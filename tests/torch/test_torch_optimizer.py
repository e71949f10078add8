"""DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state on spawned ranks.

The central property: data-parallel training on N ranks leaves every rank with the parameters that single-process
training on the union of the ranks' batches gives (same initial weights), for SGD with momentum and Adam, with
backward_passes_per_step 1 and 2, fused groups, compression, and synchronize()/skip_synchronize() clipping.
"""

import traceback

import pytest
import torch

from horovod.testing import spawn_ranks

STEPS, BATCH = 3, 4


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(step, micro, rank):
    g = torch.Generator().manual_seed(10000 * step + 100 * micro + rank)
    return torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 3, generator=g)


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train_reference(kind, passes, n, clip):
    """One process, the union of all ranks' batches (mean loss over ranks = mean over the union)."""
    model = make_model(0)
    opt = make_optimizer(kind, model.parameters())
    for step in range(STEPS):
        for micro in range(passes):
            losses = [torch.nn.functional.mse_loss(model(x), y) for x, y in
                      (batch(step, micro, r) for r in range(n))]
            (sum(losses) / n).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        opt.zero_grad()
    return model


def train_distributed(hvd, kind, passes, clip=False, **options):
    model = make_model(1234 + hvd.rank())          # different on every rank until the broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    reference_init = make_model(0) if hvd.rank() == 0 else None
    if reference_init is not None:                  # rank 0's weights are the reference's initial weights
        with torch.no_grad():
            for p, q in zip(model.parameters(), reference_init.parameters()):
                p.copy_(q)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(make_optimizer(kind, model.parameters()),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=passes,
                                   **options)
    # No broadcast_optimizer_state here: fresh optimizers are equal everywhere, and its state creation (one
    # zero-gradient step, as Horovod does) would advance Adam's step count past the reference's.
    for step in range(STEPS):
        for micro in range(passes):
            x, y = batch(step, micro, hvd.rank())
            torch.nn.functional.mse_loss(model(x), y).backward()
        if clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        opt.zero_grad()
    return model


CONFIGS = [
    dict(kind="sgd", passes=1), dict(kind="sgd", passes=2), dict(kind="adam", passes=1),
    dict(kind="adam", passes=2), dict(kind="sgd", passes=1, groups=2), dict(kind="adam", passes=2, groups=1),
    dict(kind="sgd", passes=1, clip=True), dict(kind="sgd", passes=1, gradient_predivide_factor=2.0),
    dict(kind="adam", passes=1, compression="fp16"),
]


def _equivalence(configs):
    import horovod.torch as hvd
    torch.set_num_threads(1)   # ranks share the machine's cores
    hvd.init()
    out = []
    try:
        for config in configs:
            options = dict(config)
            if options.get("compression"):
                options["compression"] = getattr(hvd.Compression, options["compression"])
            model = train_distributed(hvd, **options)
            ref = train_reference(config["kind"], config["passes"], hvd.size(), config.get("clip", False))
            diff = max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            spread = float((hvd.allgather(flat.unsqueeze(0)) - flat).abs().max())
            moved = max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(model.parameters(), make_model(0).parameters()))
            out.append((config, diff, spread, moved))
    finally:
        hvd.shutdown()
    return out


def _assert_equivalent(results):
    for rank, rows in enumerate(results):
        for config, diff, spread, moved in rows:
            tol = 2e-3 if config.get("compression") else 1e-5
            assert moved > 1e-3, f"rank {rank} {config}: training did not move the parameters"
            assert diff < tol, f"rank {rank} {config}: differs from single-process training by {diff}"
            assert spread == 0.0, f"rank {rank} {config}: ranks disagree by {spread}"


@pytest.mark.ranks
def test_training_equals_single_process_on_the_union_two_ranks():
    _assert_equivalent(spawn_ranks(_equivalence, 2, timeout=120, args=(CONFIGS,)))


@pytest.mark.ranks
def test_training_equals_single_process_on_the_union_three_ranks():
    _assert_equivalent(spawn_ranks(_equivalence, 3, timeout=120, args=(CONFIGS[:4],)))


# -- broadcasts, errors and the optimizer's protocol -----------------------------------------------------------------

def check_broadcast_parameters(hvd):
    model = make_model(77 + hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    want = make_model(78)
    for p, q in zip(model.state_dict().values(), want.state_dict().values()):
        assert torch.equal(p, q)
    tensors = [torch.full((2,), float(hvd.rank())), torch.full((3,), float(hvd.rank()) + 5)]
    hvd.broadcast_parameters(tensors, root_rank=0)
    assert tensors[0].tolist() == [0.0, 0.0] and tensors[1].tolist() == [5.0] * 3
    bn = torch.nn.BatchNorm1d(3)
    bn.running_mean.fill_(hvd.rank())
    bn.num_batches_tracked.fill_(hvd.rank() + 3)
    hvd.broadcast_parameters(bn.state_dict(), root_rank=0)
    assert bn.running_mean.tolist() == [0.0] * 3 and int(bn.num_batches_tracked) == 3


def check_broadcast_optimizer_state(hvd):
    model = make_model(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (hvd.rank() + 1), betas=(0.9, 0.99 - 0.01 * hvd.rank()))
    x, y = batch(0, 0, hvd.rank())
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    root = hvd.broadcast_object(state, root_rank=0)
    assert state["param_groups"] == root["param_groups"] and state["param_groups"][0]["lr"] == 0.01
    for key, value in root["state"].items():
        for name, tensor in value.items():
            assert torch.equal(state["state"][key][name], tensor), (key, name)

    fresh_model = make_model(5 + hvd.rank())
    before = [p.detach().clone() for p in fresh_model.parameters()]
    fresh = hvd.DistributedOptimizer(torch.optim.SGD(fresh_model.parameters(), lr=0.5, momentum=0.9,
                                                     weight_decay=0.1),
                                     named_parameters=fresh_model.named_parameters())
    hvd.broadcast_optimizer_state(fresh, root_rank=0)
    assert len(fresh.state_dict()["state"]) == len(before), "state was created for every parameter"
    for p, q in zip(fresh_model.parameters(), before):
        assert torch.equal(p, q), "creating the state must not move parameters"
        assert p.grad is not None and not p.grad.any(), "Horovod leaves a zero gradient on every parameter"
    with pytest.raises(ValueError):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


def check_constructor_errors(hvd):
    model = make_model(0)
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    with pytest.raises(ValueError, match="op != Average"):
        hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd(), named_parameters=[p for p in model.parameters()])
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd(), named_parameters=[named[0], (named[0][0], named[1][1])] + named[2:])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(sgd(), named_parameters=named[:-1])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(), groups=[[named[0][1]], [named[0][1]]])
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd(), groups=-1)
    opt = hvd.DistributedOptimizer(sgd(), named_parameters=named)
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"


def check_protocol_errors(hvd):
    model = make_model(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = batch(0, 0, hvd.rank())
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    opt.zero_grad()
    # Missing gradients are zero-filled: a parameter unused on this rank still gets the others' average.
    torch.nn.functional.mse_loss(model(x), y).backward() if hvd.rank() == 0 else \
        (model[2](torch.tanh(model[0](x).detach())) - y).pow(2).mean().backward()
    opt.synchronize()
    assert model[0].weight.grad is not None
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2


def check_sparse_gradients(hvd):
    for as_dense in (True, False):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                       named_parameters=emb.named_parameters(), sparse_as_dense=as_dense)
        emb(torch.tensor([hvd.rank(), 4])).sum().backward()
        opt.synchronize()
        want = torch.zeros(6, 2)
        for r in range(hvd.size()):
            want[r] += 1.0 / hvd.size()
            want[4] += 1.0 / hvd.size()
        assert torch.allclose(emb.weight.grad.to_dense(), want), (as_dense, emb.weight.grad)
        with opt.skip_synchronize():
            opt.step()


CHECKS = {name: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}


def _run_checks():
    import horovod.torch as hvd
    torch.set_num_threads(1)   # ranks share the machine's cores
    hvd.init()
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn(hvd)
            results[name] = None
        except Exception:  # reported per check below
            results[name] = traceback.format_exc()
    hvd.shutdown()
    return results


@pytest.fixture(scope="module")
def results():
    return spawn_ranks(_run_checks, 2, timeout=90)


@pytest.mark.ranks
@pytest.mark.parametrize("check", list(CHECKS))
def test_optimizer_and_broadcasts(results, check):
    failures = [f"rank {rank}:\n{r[check]}" for rank, r in enumerate(results) if r[check] is not None]
    assert not failures, "\n".join(failures)


@pytest.mark.unit
def test_errors_raised_before_init():
    import horovod.torch as hvd
    model = make_model(0)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=-1)
