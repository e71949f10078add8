"""Every asynchronous mode under elastic training, side by side, through a worker's death.

    horovodrun -np 3 --min-np 1 -H 127.0.0.1:1,127.0.0.2:1,127.0.0.3:1 \\
        python examples/pytorch_async_elastic.py --crash-host 127.0.0.3

One step loop trains four small models on digits, one per mode (LocalSGDOptimizer, OuterOptimizer,
DistributedOptimizer(staleness=1), GossipOptimizer), all in one ``TorchState``. The state is committed every
``--commit-every`` steps, which is a multiple of the periods, so local SGD and the outer optimizer commit right after
their averaging; a killed worker makes the survivors restore that commit and take rank 0's state, after which every
rank holds the same parameters for every mode (printed as checksums right after the reset and at the end).
"""

import argparse
import os
import signal

import numpy as np
import torch
import torch.nn.functional as F
try:  # the data set and its split come from scikit-learn, the 'examples' extra
    from sklearn.datasets import load_digits
except ImportError as missing:
    raise SystemExit(f"{os.path.basename(__file__)}: {missing}; this example needs scikit-learn: pip install "
                     f"scikit-learn, or in a checkout horovod-py's extras: pip install -e '.[examples]'") from None

import horovod.torch as hvd

MODES = ("localsgd", "outer", "stale", "gossip")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--commit-every", type=int, default=4)
    parser.add_argument("--crash-host", help="the worker on this host kills itself once, at --crash-step")
    parser.add_argument("--crash-step", type=int, default=26)
    return parser.parse_args(argv)


def optimizers(models):
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5)  # noqa: E731
    return {"localsgd": hvd.LocalSGDOptimizer(sgd(models["localsgd"]), period=4, overlap_steps=0),
            "outer": hvd.OuterOptimizer(sgd(models["outer"]), period=4, outer_momentum=0.5),
            "stale": hvd.DistributedOptimizer(sgd(models["stale"]), staleness=1),
            "gossip": hvd.GossipOptimizer(sgd(models["gossip"]), topology="ring")}


def checksums(models):
    """Every rank's checksum per mode (gathered: the same row on every rank when they agree)."""
    sums = torch.tensor([float(sum(p.detach().double().sum() for p in models[m].parameters())) for m in MODES])
    return hvd.allgather(sums.unsqueeze(0)).numpy()


def main(args):
    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)
    digits = load_digits()
    x, y = torch.from_numpy((digits.data / 16.0).astype(np.float32)), torch.from_numpy(digits.target).long()
    torch.manual_seed(0)
    models = {m: torch.nn.Linear(64, 10) for m in MODES}
    opts = optimizers(models)
    state = hvd.elastic.TorchState(**{f"model_{m}": models[m] for m in MODES},
                                   **{f"optimizer_{m}": opts[m] for m in MODES}, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        crash = args.crash_host == os.environ.get("HOROVOD_HOSTNAME")
        if resets:
            rows = checksums(models)
            agree = all(np.array_equal(rows[0], r) for r in rows)
            if hvd.rank() == 0:
                print(f"after reset {len(resets)}: {hvd.size()} worker(s) at step {state.step}; parameters "
                      f"{'identical' if agree else 'DIFFER'} on every rank for every mode", flush=True)
        while state.step < args.steps:
            if crash and state.step == args.crash_step:
                os.kill(os.getpid(), signal.SIGKILL)
            rng = np.random.default_rng(1000 * state.step + hvd.rank())
            idx = torch.from_numpy(rng.integers(0, len(x), args.batch_size))
            for m in MODES:
                opts[m].zero_grad()
                F.cross_entropy(models[m](x[idx]), y[idx]).backward()
                opts[m].step()
            state.step += 1
            if state.step % args.commit_every == 0:
                state.commit()

    train(state)
    for m in ("localsgd", "outer", "gossip"):
        opts[m].synchronize()
    rows = checksums(models)
    accuracy = {m: float((models[m](x).argmax(1) == y).float().mean()) for m in MODES}
    print(f"rank {hvd.rank()} of {hvd.size()}: final accuracy "
          + " ".join(f"{m} {100 * accuracy[m]:.1f}%" for m in MODES)
          + f"; checksums {' '.join(f'{c:.8f}' for c in rows[hvd.rank()])}"
          + f"; ranks agree: {all(np.array_equal(rows[0], r) for r in rows)}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(parse_args())
