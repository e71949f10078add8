"""Train a small CNN on scikit-learn's bundled 8x8 digits with Horovod, on CPU, offline.

    horovodrun -np 2 python examples/pytorch_digits.py          # or: make demo
    python examples/pytorch_digits.py                            # a single worker works too

Each worker trains on its shard of the training set; DistributedOptimizer averages the gradients; rank 0 prints
one line per epoch (metrics averaged over all workers), saves a checkpoint, and prints the final test accuracy.
"""

import argparse
import os
import time

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
from torch.utils.data.distributed import DistributedSampler

import horovod.torch as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.02, help="per worker; scaled by the number of workers")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    parser.add_argument("--checkpoint", default=os.path.join(".", "checkpoints", "digits.pt"),
                        help="written by rank 0 after every epoch")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint if it exists")
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where a GPU is available")
    return parser.parse_args(argv)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def datasets(seed):
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]      # N x 1 x 8 x 8 in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.2, random_state=seed,
                                                        stratify=digits.target)
    as_set = lambda x, y: TensorDataset(torch.from_numpy(x), torch.from_numpy(y).long())  # noqa: E731
    return as_set(x_train, y_train), as_set(x_test, y_test)


def averaged(value, name):
    """The average of a scalar metric over all workers."""
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def evaluate(model, loader, device):
    model.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += int((out.argmax(1) == y).sum())
            count += len(y)
    totals = hvd.allreduce(torch.tensor([loss, correct, count], dtype=torch.float64), op=hvd.Sum, name="eval")
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def load_checkpoint(path, model, optimizer):
    """Rank 0 reads the checkpoint; every rank then receives its weights, optimizer state and epoch."""
    start_epoch = 0
    if hvd.rank() == 0 and os.path.exists(path):
        state = torch.load(path, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"]
    return hvd.broadcast_object(start_epoch, root_rank=0, name="start_epoch")


def train(args):
    """Train and return the final test accuracy (the same on every worker)."""
    hvd.init()
    cuda = not args.no_cuda and torch.cuda.is_available()
    if cuda:      # one GPU per worker, by local rank (ranks share the GPU where a host has fewer)
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    train_set, test_set = datasets(args.seed)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    start_epoch = load_checkpoint(args.checkpoint, model, optimizer) if args.resume else 0
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    if hvd.rank() == 0:
        print(f"training on {hvd.size()} worker(s) ({device.type}), {len(train_sampler)} of {len(train_set)} images "
              f"each", flush=True)

    accuracy = 0.0
    for epoch in range(start_epoch, args.epochs):
        started = time.time()
        model.train()
        train_sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        train_loss = averaged(total / max(batches, 1), "train_loss")
        test_loss, accuracy = evaluate(model, test_loader, device)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:2d}/{args.epochs}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                  f"test accuracy {100 * accuracy:5.2f}%  ({time.time() - started:.1f}s)", flush=True)
            os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                       args.checkpoint)
    if hvd.rank() == 0:
        print(f"final test accuracy: {100 * accuracy:.2f}%  (checkpoint: {args.checkpoint})", flush=True)
    hvd.shutdown()
    return accuracy


if __name__ == "__main__":
    train(parse_args())
