"""The device check: every collective on CUDA tensors, a model trained on the GPU against the same run on the CPU,
and the host-staged path's bandwidth, on a machine with a GPU.

    python bench/gpu_check.py [--out results.json]

What it runs, each under the real ``horovodrun``:

1. ``collectives`` at 1 rank with ``HOROVOD_DEVICE_PLANE=nccl`` (the NCCL device plane) and at 2 ranks sharing the
   one GPU (NCCL refuses two ranks on one GPU, so ``auto`` stages them through host memory): allreduce with every op,
   prescale/postscale and Average over six dtypes, grouped allreduce, allgather with uneven first dimensions,
   broadcast, alltoall with uneven splits, reducescatter; each result on the GPU and equal to numpy's bit for bit
   where the arithmetic is exact (integers; floats summed by one or two ranks), within the dtype's rounding for
   float16 and bfloat16 (the device plane reduces them natively, the CPU plane in float32). Each rank reports which
   plane ran and what it carried.
2. ``train``: a small convolutional model trained 20 steps with ``DistributedOptimizer`` on CUDA and on the CPU (TF32
   off), at 1 rank (NCCL) and 2 ranks (staged); the parameters must agree to float32 tolerance.
3. ``bandwidth``: the staged path's allreduce bus bandwidth at 2 ranks on 64 MiB, beside a plain device -> host ->
   device copy of the same bytes.

Every local rank uses GPU ``local_rank % device_count``, as Horovod's examples do with ``torch.cuda.set_device``.
Without a GPU it says so and exits with status 77 (skipped), having run nothing. ``--cpu-dry-run`` runs the same
checks on a machine without one, CPU tensors through the Gloo stand-in of the device plane in place of CUDA tensors
(no bandwidth), so the check itself is known to work before a GPU is lent. It takes about two minutes on one H100.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPPED = 77
DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16")
DRY = os.environ.get("GPU_CHECK_DRY_RUN") == "1"     # the workers of --cpu-dry-run: CPU tensors, Gloo's plane


# -- workers (run by horovodrun) -------------------------------------------------------------------------------------

def _setup():
    import torch
    import horovod.torch as hvd
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hvd.init()
    if not DRY:
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    return torch, hvd


def _dev(tensor):
    """``tensor`` on this rank's GPU (left on the CPU in a dry run)."""
    return tensor if DRY else tensor.cuda()


def _data(torch, rank, shape, dtype, salt):
    g = torch.Generator().manual_seed(7919 * salt + rank)
    if dtype.is_floating_point:
        return (torch.randint(-8, 8, shape, generator=g).to(torch.float64) / 4).to(dtype)    # exact in every dtype
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def _plane(hvd):
    from horovod.runtime import basics
    plane = basics.context().engine.device_plane
    return (plane.name, dict(plane.stats)) if plane is not None else ("staged", {})


def _same(torch, got, want, dtype, what, failures):
    """Bit for bit where exact, else within the dtype's rounding; the result must be on the GPU."""
    if not got.is_cuda and not DRY:
        failures.append(f"{what}: result on {got.device}, not the GPU")
        return
    g, w = got.cpu().to(torch.float64), want.to(torch.float64)
    if g.shape != w.shape:
        failures.append(f"{what}: shape {tuple(g.shape)} != {tuple(w.shape)}")
    elif dtype in (torch.float16, torch.bfloat16):
        if not torch.allclose(g, w, rtol=1e-2, atol=1e-2):
            failures.append(f"{what}: {g.flatten()[:6].tolist()} != {w.flatten()[:6].tolist()}")
    elif not torch.equal(g, w):
        failures.append(f"{what}: max difference {float((g - w).abs().max())}")


def _reference(torch, tensors, op, hvd):
    stack = torch.stack([t.to(torch.float64) for t in tensors])
    return {hvd.Sum: stack.sum(0), hvd.Average: stack.sum(0) / len(tensors), hvd.Min: stack.min(0).values,
            hvd.Max: stack.max(0).values, hvd.Product: stack.prod(0)}[op]


def _allreduce_checks(torch, hvd, n, me, failures):
    for name in DTYPES:
        dtype = getattr(torch, name)
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            if op == hvd.Average and not dtype.is_floating_point:
                continue
            x = _dev(_data(torch, me, (33, 5), dtype, 1))
            want = _reference(torch, [_data(torch, r, (33, 5), dtype, 1) for r in range(n)], op, hvd)
            _same(torch, hvd.allreduce(x, op=op, name=f"ar.{name}.{op}"), want.to(dtype).to(torch.float64)
                  if not dtype.is_floating_point else want, dtype, f"allreduce {name} op {op}", failures)
    x = _dev(_data(torch, me, (17,), torch.float32, 2))
    want = _reference(torch, [_data(torch, r, (17,), torch.float32, 2) for r in range(n)], hvd.Sum, hvd) * 0.5 * 4.0
    _same(torch, hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="scaled"), want,
          torch.float32, "allreduce pre/postscale", failures)
    shapes = [(3,), (4, 2), (1,), (64, 3)]
    ins = [_dev(_data(torch, me, s, torch.float32, 3 + i)) for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce(ins, op=hvd.Sum, name="grouped")
    for i, s in enumerate(shapes):
        want = _reference(torch, [_data(torch, r, s, torch.float32, 3 + i) for r in range(n)], hvd.Sum, hvd)
        _same(torch, outs[i], want, torch.float32, f"grouped allreduce {i}", failures)


def _other_checks(torch, hvd, n, me, failures):
    rows = [_data(torch, r, (r + 1, 3), torch.float32, 10) for r in range(n)]
    _same(torch, hvd.allgather(_dev(rows[me]), name="gather"), torch.cat(rows), torch.float32,
          "allgather uneven", failures)
    root = n - 1
    _same(torch, hvd.broadcast(_dev(_data(torch, me, (9,), torch.int64, 11)), root_rank=root, name="bcast"),
          _data(torch, root, (9,), torch.int64, 11), torch.int64, "broadcast", failures)
    splits = [[(i + j) % 3 + 1 for j in range(n)] for i in range(n)]     # row i: what rank i sends to each rank
    sent = [_data(torch, r, (sum(splits[r]), 2), torch.float32, 12) for r in range(n)]
    out, received = hvd.alltoall(_dev(sent[me]), splits=splits[me], name="a2a")
    parts = []
    for r in range(n):
        start = sum(splits[r][:me])
        parts.append(sent[r][start:start + splits[r][me]])
    _same(torch, out, torch.cat(parts), torch.float32, "alltoall uneven", failures)
    if received.tolist() != [splits[r][me] for r in range(n)]:
        failures.append(f"alltoall received splits {received.tolist()}")
    full = [_data(torch, r, (2 * n + 1, 4), torch.float32, 13) for r in range(n)]
    total = _reference(torch, full, hvd.Sum, hvd)
    base, extra = divmod(2 * n + 1, n)
    start = me * base + min(me, extra)
    mine = total[start:start + base + (1 if me < extra else 0)]
    _same(torch, hvd.reducescatter(_dev(full[me]), op=hvd.Sum, name="rs"), mine, torch.float32,
          "reducescatter uneven", failures)


def worker_collectives():
    torch, hvd = _setup()
    n, me = hvd.size(), hvd.rank()
    failures = []
    _allreduce_checks(torch, hvd, n, me, failures)
    _other_checks(torch, hvd, n, me, failures)
    plane, stats = _plane(hvd)
    hvd.shutdown()
    return {"rank": me, "size": n, "plane": plane, "stats": stats, "failures": failures}


def worker_train(device_name: str, out_path: str):
    torch, hvd = _setup()
    device = torch.device("cpu" if device_name == "cpu" or DRY else f"cuda:{torch.cuda.current_device()}")
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 10)).to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    for _ in range(20):
        x = torch.randn(16, 1, 8, 8, generator=g).to(device)
        y = torch.randint(0, 10, (16,), generator=g).to(device)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    params = {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}
    plane, stats = _plane(hvd)
    me = hvd.rank()
    if me == 0:
        with open(out_path, "w") as f:
            json.dump({"params": params, "plane": plane, "stats": stats}, f)
    hvd.shutdown()
    return {"rank": me, "plane": plane}


def worker_bandwidth():
    torch, hvd = _setup()
    count = 16 << 20      # 64 MiB of float32
    x = torch.ones(count, device="cuda")
    hvd.allreduce(x, name="bw.warmup")
    torch.cuda.synchronize()
    reps, start = 5, time.perf_counter()
    for i in range(reps):
        hvd.allreduce(x, name=f"bw.{i}", op=hvd.Sum)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / reps
    n = hvd.size()
    bus = 2 * (n - 1) / n * x.numel() * 4 / seconds / 1e9
    copy_start = time.perf_counter()
    for _ in range(reps):
        host = x.to("cpu", non_blocking=False)
        host.to("cuda", non_blocking=False)
    torch.cuda.synchronize()
    copy = (time.perf_counter() - copy_start) / reps
    plane, _ = _plane(hvd)
    me = hvd.rank()
    hvd.shutdown()
    return {"rank": me, "plane": plane, "allreduce_s": seconds, "bus_GBps": bus, "copy_s": copy,
            "copy_GBps": 2 * x.numel() * 4 / copy / 1e9}


# -- the driver ------------------------------------------------------------------------------------------------------

def _run(np_: int, role: str, *extra: str, plane: str = "auto", timeout: float = 240) -> list:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HOROVOD_DEVICE_PLANE="gloo" if DRY and plane != "staged" else plane, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable,
                           os.path.abspath(__file__), "--worker", role, *extra], env=env, capture_output=True,
                          text=True, timeout=timeout)
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line]
    if proc.returncode != 0 or len(results) != np_:
        raise RuntimeError(f"{role} at {np_} rank(s) failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                           f"{proc.stderr[-4000:]}")
    return sorted(results, key=lambda r: r["rank"])


def _compare(a_path: str, b_path: str) -> float:
    with open(a_path) as f:
        a = json.load(f)["params"]
    with open(b_path) as f:
        b = json.load(f)["params"]
    import numpy as np
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run the checks without a GPU: CPU tensors through the Gloo stand-in of the device plane")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        result = {"collectives": worker_collectives, "train": worker_train,
                  "bandwidth": worker_bandwidth}[opts.worker](*opts.args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if opts.cpu_dry_run:
        global DRY
        DRY = True
        os.environ["GPU_CHECK_DRY_RUN"] = "1"
        import torch
        return _check(torch, opts.out)
    try:
        import torch
    except ImportError:
        print("gpu_check: no GPU here: torch is not installed; nothing was run", flush=True)
        return SKIPPED
    if not torch.cuda.is_available():
        print(f"gpu_check: no GPU here (torch {torch.__version__}, CUDA {torch.version.cuda}); nothing was run",
              flush=True)
        return SKIPPED
    return _check(torch, opts.out)


def _check(torch, out_path) -> int:
    import tempfile
    report = {"gpu": "none (dry run)" if DRY else torch.cuda.get_device_name(0), "torch": torch.__version__}
    problems = []
    began = time.perf_counter()
    for np_, plane, expect in ((1, "nccl", "gloo" if DRY else "nccl"), (2, "auto", "gloo" if DRY else "staged")):
        ranks = _run(np_, "collectives", plane=plane)
        report[f"collectives_np{np_}"] = ranks
        for r in ranks:
            problems += [f"np {np_} rank {r['rank']}: {f}" for f in r["failures"]]
            if r["plane"] != expect:
                problems.append(f"np {np_} rank {r['rank']}: ran on {r['plane']}, expected {expect}")
        print(f"collectives at {np_} rank(s): {ranks[0]['plane']}, "
              f"{sum(len(r['failures']) for r in ranks)} failure(s), plane stats {ranks[0]['stats']}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for np_, plane in ((1, "nccl"), (2, "auto")):
            gpu, cpu = os.path.join(tmp, f"gpu{np_}.json"), os.path.join(tmp, f"cpu{np_}.json")
            _run(np_, "train", "cuda", gpu, plane=plane)
            _run(np_, "train", "cpu", cpu, plane="staged")
            diff = _compare(gpu, cpu)
            report[f"train_np{np_}_max_param_diff"] = diff
            print(f"training 20 steps at {np_} rank(s): GPU vs CPU parameters differ by at most {diff:.3g}",
                  flush=True)
            if not diff < 1e-4:
                problems.append(f"training at np {np_}: GPU and CPU parameters differ by {diff}")
    if not DRY:
        bw = _run(2, "bandwidth")
        report["bandwidth_np2"] = bw
        print(f"staged allreduce of 64 MiB at 2 ranks: {bw[0]['allreduce_s'] * 1e3:.1f} ms, bus "
              f"{bw[0]['bus_GBps']:.2f} GB/s; a plain device->host->device copy: {bw[0]['copy_s'] * 1e3:.1f} ms "
              f"({bw[0]['copy_GBps']:.2f} GB/s)", flush=True)
    report["seconds"] = time.perf_counter() - began
    report["problems"] = problems
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    print(f"gpu_check: {'PASSED' if not problems else 'FAILED'} in {report['seconds']:.0f} s", flush=True)
    for p in problems:
        print("  " + p, flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
