"""Elastic training of a small CNN on scikit-learn's 8x8 digits: workers may die or join, training goes on.

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover.sh \\
        python examples/pytorch_elastic_digits.py
    horovodrun -np 2 --min-np 1 -H 127.0.0.1:1,127.0.0.2:1 \\
        python examples/pytorch_elastic_digits.py --crash-host 127.0.0.2 --crash-epoch 1

(``discover.sh`` prints one ``host`` or ``host:slots`` per line; addresses of this machine such as ``127.0.0.2``
act as separate hosts.) The state (model, optimizer, sampler position, epoch) is committed every few batches; a
worker that dies costs at most the batches since the last commit, a joining worker receives the state before it
trains. ``--crash-host`` kills the worker on that host mid-epoch once, to watch the job go on without it.
"""

import argparse
import os
import signal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
try:  # the data set and its split come from scikit-learn, the 'examples' extra
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ImportError as missing:
    raise SystemExit(f"{os.path.basename(__file__)}: {missing}; this example needs scikit-learn: pip install "
                     f"scikit-learn, or in a checkout horovod-py's extras: pip install -e '.[examples]'") from None
from torch.utils.data import DataLoader, TensorDataset

import horovod.torch as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.02, help="per worker; scaled by the number of workers")
    parser.add_argument("--batches-per-commit", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--crash-host", help="the worker on this host kills itself once, mid-epoch")
    parser.add_argument("--crash-epoch", type=int, default=1)
    return parser.parse_args(argv)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def datasets(seed):
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.2, random_state=seed,
                                                        stratify=digits.target)
    as_set = lambda x, y: TensorDataset(torch.from_numpy(x), torch.from_numpy(y).long())  # noqa: E731
    return as_set(x_train, y_train), as_set(x_test, y_test)


def evaluate(model, test_set):
    """Accuracy on the whole test set, computed by every worker (it is small)."""
    model.eval()
    with torch.no_grad():
        x, y = test_set.tensors
        return float((model(x).argmax(1) == y).float().mean())


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, test_set = datasets(args.seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    def on_reset():
        # A new membership: scale the learning rate with the number of workers, as when the job started.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"reset: now {hvd.size()} worker(s); resuming epoch {state.epoch + 1} at sample "
                  f"{sampler.processed_num}", flush=True)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        crash = args.crash_host == os.environ.get("HOROVOD_HOSTNAME")
        while state.epoch < args.epochs:
            model.train()
            loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
            for x, y in loader:
                if crash and state.epoch == args.crash_epoch and state.batch == 3:
                    os.kill(os.getpid(), signal.SIGKILL)  # a worker dies mid-epoch
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                sampler.record_batch(state.batch, args.batch_size)
                state.batch += 1
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            accuracy = evaluate(model, test_set)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1}/{args.epochs} on {hvd.size()} worker(s): "
                      f"test accuracy {100 * accuracy:.2f}%", flush=True)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()
        return evaluate(model, test_set)

    accuracy = train(state)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    print(f"final test accuracy: {100 * accuracy:.2f}% on rank {hvd.rank()} of {hvd.size()}; "
          f"parameter checksum {checksum:.10f}", flush=True)


if __name__ == "__main__":
    main(parse_args())
