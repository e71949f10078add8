"""Horovod's PyTorch synthetic benchmark on CPU: images/sec of training on random data, per worker and in total.

    horovodrun -np 2 python examples/pytorch_synthetic_benchmark.py --model resnet8 --batch-size 32

torchvision is not needed: the models are defined here (``resnet8``/``resnet18``: ResNets with basic blocks for
small images, ``mlp``). ``build_model`` and ``make_batch`` are shared with ``bench/torch_ddp_vs_horovod.py``.

With ``--json PATH`` rank 0 also writes what the scaling planner fits (``python -m horovod.tools.scaling --fit
PATH``): the step with Horovod, the same step of an unwrapped copy of the model (compute alone), one fused allreduce
of every gradient (communication alone), and the rate of packing the gradients into one buffer and back, as the
engine packs them.
"""

import argparse
import datetime
import json
import os
import platform
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce")
    parser.add_argument("--model", default="resnet8", choices=sorted(MODELS), help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size (per worker)")
    parser.add_argument("--image-size", type=int, default=32, help="height and width of the synthetic images")
    parser.add_argument("--num-warmup-batches", type=int, default=3, help="number of warm-up batches")
    parser.add_argument("--num-batches-per-iter", type=int, default=5, help="number of batches per benchmark iter")
    parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
    parser.add_argument("--use-adasum", action="store_true", help="use the Adasum algorithm to do reduction")
    parser.add_argument("--no-cuda", action="store_true", help="accepted for compatibility; training is on CPU")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cores / local size)")
    parser.add_argument("--json", default="", help="also measure compute, communication and packing apart and write "
                                                  "them here (rank 0), for python -m horovod.tools.scaling --fit")
    return parser.parse_args(argv)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, blocks, widths, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for stage, (count, width) in enumerate(zip(blocks, widths)):
            for i in range(count):
                layers.append(BasicBlock(cin, width, 2 if stage > 0 and i == 0 else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _mlp(image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1000))


MODELS = {
    "resnet8": lambda size: ResNet([1, 1, 1], [16, 32, 64]),
    "resnet18": lambda size: ResNet([2, 2, 2, 2], [64, 128, 256, 512]),
    "mlp": _mlp,
}


def build_model(name, image_size):
    return MODELS[name](image_size)


def make_batch(batch_size, image_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(batch_size, 3, image_size, image_size, generator=g)
    target = torch.randint(0, 1000, (batch_size,), generator=g)
    return data, target


def run_benchmark(args, model, optimizer, log):
    """Time training steps; returns the per-iteration images/sec of this worker."""
    data, target = make_batch(args.batch_size, args.image_size)

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"Iter #{i}: {rates[-1]:.1f} img/sec per CPU")
    return rates


def _median_of(step, repeats):
    """The median of ``repeats`` timings of ``step`` (seconds)."""
    times = []
    for _ in range(repeats):
        start = timeit.default_timer()
        step()
        times.append(timeit.default_timer() - start)
    return float(np.median(times))


def measure_apart(args, model, rates):
    """What the planner fits, measured on every rank (the allreduce is a collective): see the module docstring."""
    data, target = make_batch(args.batch_size, args.image_size)
    plain = build_model(args.model, args.image_size)
    plain.load_state_dict(model.state_dict())
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01)

    def compute():
        plain_opt.zero_grad()
        F.cross_entropy(plain(data), target).backward()
        plain_opt.step()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    arrays = [g.numpy().reshape(-1) for g in grads]
    buf = np.empty(sum(a.size for a in arrays), np.float32)

    def pack():             # into one buffer and back out, as the engine's fusion does
        np.concatenate(arrays, out=buf)
        at = 0
        for a in arrays:
            a[...] = buf[at:at + a.size]
            at += a.size
    repeats = args.num_iters * args.num_batches_per_iter
    compute_s = _median_of(compute, repeats)
    sent = [g.clone() for g in grads]       # (in place, averaged: the values stay as they are)
    allreduce_s = _median_of(lambda: hvd.grouped_allreduce_(sent, op=hvd.Average), repeats)
    pack_s = min(_median_of(pack, 5) for _ in range(3))
    return {"benchmark": "pytorch_synthetic_benchmark", "model": args.model, "batch_size": args.batch_size,
            "np": hvd.size(), "local_size": hvd.local_size(), "cores": os.cpu_count(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "params": int(sum(p.numel() for p in model.parameters())), "gradient_tensors": len(grads),
            "gradient_bytes": int(buf.nbytes), "step_s": float(np.median([args.batch_size / r for r in rates])),
            "compute_s": compute_s, "allreduce_s": allreduce_s, "pack_bytes_s": 2 * buf.nbytes / pack_s}


def main(args):
    hvd.init()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(0)
    model = build_model(args.model, args.image_size)
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def log(message):
        if hvd.rank() == 0:
            print(message, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()}")
    rates = run_benchmark(args, model, optimizer, log)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
    if args.json:
        record = measure_apart(args, model, rates)
        if hvd.rank() == 0:
            with open(args.json, "w") as out:
                json.dump(record, out, indent=1)
            log(f"Wrote {args.json}: step {record['step_s'] * 1e3:.1f} ms, compute alone "
                f"{record['compute_s'] * 1e3:.1f} ms, allreduce alone {record['allreduce_s'] * 1e3:.1f} ms")
    hvd.shutdown()


if __name__ == "__main__":
    main(parse_args())
