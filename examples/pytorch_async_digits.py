"""Asynchronous training on scikit-learn's 8x8 digits (or a larger synthetic task) with each mode of docs/async.md.

    horovodrun -np 2 python examples/pytorch_async_digits.py --mode localsgd
    horovodrun -np 2 python examples/pytorch_async_digits.py --mode all        # every mode, one after the other
    horovodrun -np 3 python examples/pytorch_async_digits.py --mode gossip --delay-rank 2 --delay-ms 20

Modes: ``sync`` (DistributedOptimizer), ``localsgd`` (LocalSGDOptimizer), ``outer`` (OuterOptimizer, DiLoCo),
``stale`` (DistributedOptimizer(staleness=1)), ``gossip`` (GossipOptimizer). ``--delay-rank`` makes one rank a
straggler (a random sleep, exponential with mean ``--delay-ms``, before each step). Rank 0 evaluates its own
parameters after every epoch (that time is not counted) and prints, per mode, the final test accuracy after the
optimizer's ``synchronize()``; ``--record`` writes the accuracy-against-time curve as JSON (bench/async_training.py).
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
try:  # the data set and its split come from scikit-learn, the 'examples' extra
    from sklearn.datasets import load_digits, make_classification
    from sklearn.model_selection import train_test_split
except ImportError as missing:
    raise SystemExit(f"{os.path.basename(__file__)}: {missing}; this example needs scikit-learn: pip install "
                     f"scikit-learn, or in a checkout horovod-py's extras: pip install -e '.[examples]'") from None

import horovod.torch as hvd

MODES = ("sync", "localsgd", "outer", "stale", "gossip")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mode", default="localsgd", choices=MODES + ("all",))
    parser.add_argument("--model", default="digits", choices=("digits", "synthetic"))
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.02, help="per worker; scaled by the number of workers")
    parser.add_argument("--period", type=int, default=8, help="local SGD / outer steps period")
    parser.add_argument("--topology", default="ring", choices=("ring", "exponential"))
    parser.add_argument("--delay-rank", type=int, default=-1, help="this rank sleeps before each step")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="mean of the straggler's random sleep")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--record", help="rank 0 writes {mode: {curve, final, seconds}} as JSON here")
    return parser.parse_args(argv)


class DigitsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def synthetic_net():
    """About 1.3 M parameters (5 MB of float32 per allreduce): where the link, not the CPU, sets the pace."""
    return nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def datasets(model, seed):
    if model == "digits":
        digits = load_digits()
        x, y = (digits.images / 16.0).astype(np.float32)[:, None], digits.target
    else:
        x, y = make_classification(4000, 128, n_informative=48, n_classes=10, n_clusters_per_class=1,
                                   class_sep=2.0, random_state=seed)
        x = x.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    as_tensors = lambda a, b: (torch.from_numpy(a), torch.from_numpy(b).long())  # noqa: E731
    return as_tensors(x_train, y_train), as_tensors(x_test, y_test)


def accuracy(model, test):
    model.eval()
    with torch.no_grad():
        return float((model(test[0]).argmax(1) == test[1]).float().mean())


def make_optimizer(mode, model, args):
    named = model.named_parameters()
    lr = args.lr * hvd.size() if mode == "sync" else args.lr * 2
    momentum = 0.9
    if mode == "stale":     # a one-step-old gradient under momentum 0.9 oscillates (73 % at 2 ranks): plain SGD
        lr, momentum = args.lr * 10, 0.0    # (asynchrony acts as momentum itself), not scaled (0.3 diverged at 3)
    inner = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    if mode == "sync":
        return hvd.DistributedOptimizer(inner, named_parameters=named)
    if mode == "stale":
        return hvd.DistributedOptimizer(inner, named_parameters=named, staleness=1)
    if mode == "localsgd":
        return hvd.LocalSGDOptimizer(inner, named_parameters=named, period=args.period, warmup_steps=20)
    if mode == "outer":
        return hvd.OuterOptimizer(inner, named_parameters=named, period=args.period, outer_lr=0.7,
                                  outer_momentum=0.5)
    return hvd.GossipOptimizer(inner, named_parameters=named, topology=args.topology)


def train(mode, args, train_set, test_set):
    """Train one mode; returns {curve: [[seconds, accuracy]...], final, seconds, target_seconds}."""
    torch.manual_seed(args.seed)
    model = DigitsNet() if args.model == "digits" else synthetic_net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = make_optimizer(mode, model, args)
    rng = np.random.default_rng(args.seed + hvd.rank())
    x, y = train_set
    shard = np.arange(hvd.rank(), len(x), hvd.size())
    steps = len(shard) // args.batch_size
    curve, clock, target_seconds = [], 0.0, None
    for epoch in range(args.epochs):
        order = np.random.default_rng(args.seed + epoch).permutation(shard)
        if epoch == (3 * args.epochs) // 4:       # the last quarter at a tenth of the learning rate
            for group in optimizer.param_groups:
                group["lr"] *= 0.1
        model.train()
        started = time.perf_counter()
        for step in range(steps):
            if hvd.rank() == args.delay_rank and args.delay_ms > 0:
                time.sleep(rng.exponential(args.delay_ms / 1000.0))
            idx = torch.from_numpy(order[step * args.batch_size:(step + 1) * args.batch_size])
            optimizer.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
        clock += time.perf_counter() - started
        acc = accuracy(model, test_set)
        curve.append([round(clock, 3), acc])
        if target_seconds is None and acc >= args.target:
            target_seconds = clock
    if mode not in ("sync", "stale"):      # their ranks always agree
        optimizer.synchronize()
    final = float(hvd.allreduce(torch.tensor(accuracy(model, test_set)), name=f"final.{mode}"))
    return {"curve": curve, "final": final, "seconds": clock, "target_seconds": target_seconds}


def main(args):
    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)
    train_set, test_set = datasets(args.model, args.seed)
    results = {}
    for mode in (MODES if args.mode == "all" else (args.mode,)):
        results[mode] = train(mode, args, train_set, test_set)
        if hvd.rank() == 0:
            r = results[mode]
            reached = "never" if r["target_seconds"] is None else f"{r['target_seconds']:.1f}s"
            print(f"{mode}: final test accuracy {100 * r['final']:.2f}% on {hvd.size()} worker(s); "
                  f"{r['seconds']:.1f}s training; {100 * args.target:.0f}% reached at {reached}", flush=True)
    if hvd.rank() == 0 and args.record:
        with open(args.record, "w") as handle:
            json.dump(results, handle)
    hvd.shutdown()
    return results


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(parse_args())
