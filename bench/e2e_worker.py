"""The training worker of bench/torch_ddp_vs_horovod.py: one model, one timing loop, under ``horovod.torch`` or DDP.

    python bench/e2e_worker.py horovod SPEC    # under horovodrun
    python bench/e2e_worker.py ddp SPEC        # each rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (env://)

``SPEC`` is JSON: ``model`` (a name in :data:`MODELS`), ``batch`` (samples per rank and step; 0: the model's own),
``warmup``, ``per_iter``, ``iters``, ``threads``, ``fp16`` (horovod only: fp16 gradient compression) and ``tiny``
(small models and batches, for a smoke run). Both sides build the same model from the same seed, train it with SGD
on one fixed random batch, time ``iters`` × ``per_iter`` steps after ``warmup`` and sum every rank's mean samples/sec
with their own allreduce; rank 0 prints ``RESULT <samples/sec>`` and ``CPU_MS_PER_STEP <a rank's process CPU per
step, mean over ranks>``. The models:

- ``resnet8`` (and ``resnet18``, ``mlp``): the CNNs of examples/pytorch_synthetic_benchmark.py, 32 × 32 images;
- ``transformer``: token ids through an embedding, 8 small ``nn.TransformerEncoder`` layers (12 tensors each) and a
  head, next-token loss: 100 gradients of 64 to 128 K floats, 0.53 M in all;
- ``embedding``: an ``nn.EmbeddingBag`` of 50 K × 64 (3.2 M floats: dense gradients, as Horovod allreduces them by
  default and DDP too) under a small MLP: a step moves 12.8 MB of gradients for little compute.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


class TinyTransformer(nn.Module):
    def __init__(self, vocab, width, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq, width))
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids) + self.position)).flatten(0, 1)


class EmbeddingHeavy(nn.Module):
    def __init__(self, rows, width, classes=10):
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, width, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, classes))

    def forward(self, ids):
        return self.mlp(self.bag(ids))


def _cnn(name):
    def build(tiny, batch, g):
        import pytorch_synthetic_benchmark as example     # (imports horovod.torch too: inert until init)
        size = 16 if tiny else 32
        data = torch.randn(batch or 32, 3, size, size, generator=g)
        return example.build_model(name, size), data, torch.randint(0, 1000, (data.shape[0],), generator=g)
    return build


def _transformer(tiny, batch, g):
    vocab, width, layers, seq = (200, 32, 2, 8) if tiny else (2000, 64, 8, 32)
    ids = torch.randint(0, vocab, (batch or 16, seq + 1), generator=g)
    return TinyTransformer(vocab, width, layers, seq), ids[:, :-1], ids[:, 1:].flatten()


def _embedding(tiny, batch, g):
    rows = 1000 if tiny else 50_000
    ids = torch.randint(0, rows, (batch or 256, 16), generator=g)
    return EmbeddingHeavy(rows, 64), ids, torch.randint(0, 10, (ids.shape[0],), generator=g)


MODELS = {"resnet8": _cnn("resnet8"), "resnet18": _cnn("resnet18"), "mlp": _cnn("mlp"),
          "transformer": _transformer, "embedding": _embedding}


def build(spec):
    """The model (same weights on every rank), its input and its targets."""
    torch.manual_seed(0)
    return MODELS[spec["model"]](spec["tiny"], spec["batch"], torch.Generator().manual_seed(0))


def time_steps(spec, model, optimizer, data, target):
    """This rank's samples/sec in each timed iteration, and its process's CPU milliseconds per timed step (every
    thread: the training loop's and the library's own)."""
    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(spec["warmup"]):
        step()
    rates, cpu_began = [], time.process_time()
    for _ in range(spec["iters"]):
        began = time.perf_counter()
        for _ in range(spec["per_iter"]):
            step()
        rates.append(data.shape[0] * spec["per_iter"] / (time.perf_counter() - began))
    return rates, 1e3 * (time.process_time() - cpu_began) / (spec["iters"] * spec["per_iter"])


def run_horovod(spec):
    import horovod.torch as hvd
    hvd.init()
    torch.set_num_threads(spec["threads"])
    model, data, target = build(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if spec["fp16"] else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    rates, cpu_ms = time_steps(spec, model, optimizer, data, target)
    total, cpu = hvd.allreduce(torch.tensor([float(np.mean(rates)), cpu_ms], dtype=torch.float64), op=hvd.Sum,
                               name="rate").tolist()
    if hvd.rank() == 0:
        print(f"RESULT {total:.3f}\nCPU_MS_PER_STEP {cpu / hvd.size():.3f}", flush=True)
    hvd.shutdown()


def run_ddp(spec):
    import torch.distributed as dist
    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", init_method="env://")
    model, data, target = build(spec)
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * dist.get_world_size())
    rates, cpu_ms = time_steps(spec, model, optimizer, data, target)
    totals = torch.tensor([float(np.mean(rates)), cpu_ms], dtype=torch.float64)
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        total, cpu = totals.tolist()
        print(f"RESULT {total:.3f}\nCPU_MS_PER_STEP {cpu / dist.get_world_size():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    {"horovod": run_horovod, "ddp": run_ddp}[sys.argv[1]](json.loads(sys.argv[2]))
