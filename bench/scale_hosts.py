"""One allreduce-only job over namespace hosts, measured from outside: start-up to the first allreduce's result (the
slowest rank's), 4 B and 1 MiB allreduce time (the slowest rank's mean over a loop), each rank's threads and file
descriptors during the job, and ``horovodrun``'s; with ``--gloo``, the same job in torch.distributed (Gloo) on the
same hosts beside it (its ranks started in each host's namespace by this script, MASTER_ADDR on the first host).

    sudo .venv/bin/python bench/scale_hosts.py --hosts 16 --slots 8 [--gloo]     # 128 ranks over real sshd

Prints one line per figure and a JSON summary (``--json FILE`` writes it). Needs root (network namespaces); nothing is
left behind (the cluster is removed by pid and name, even on failure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from horovod.testing.netns import NetnsCluster, unavailable_reason  # noqa: E402

JOB = """
import os, sys, threading, time
import numpy as np
import horovod.numpy as hvd
launched = float(sys.argv[1])
hvd.init()
inited = time.time()
out = hvd.allreduce(np.full(1024, float(hvd.rank())), name="first", op=hvd.Sum)
first = time.time()
assert np.allclose(out, sum(range(hvd.size())))
def timed(buf, name, iters):
    for _ in range(3):
        hvd.allreduce_(buf, name=name)
    began = time.perf_counter()
    for _ in range(iters):
        hvd.allreduce_(buf, name=name)
    return (time.perf_counter() - began) / iters
ar4 = timed(np.ones(1, np.float32), "ar4", 50)
ar1m = timed(np.ones(1 << 18, np.float32), "ar1m", 5)
threads = threading.active_count()
fds = len(os.listdir("/proc/self/fd"))
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
worst = hvd.allreduce(np.array([first - launched, inited - launched, threads, fds, rss, ar4, ar1m],
                               dtype=np.float64), name="figures", op=hvd.Max)
if hvd.rank() == 0:
    print("FIGURES " + " ".join(f"{v:.6f}" for v in worst), flush=True)
hvd.shutdown()
"""

GLOO_JOB = """
import os, sys, threading, time
import torch
import torch.distributed as dist
torch.set_num_threads(1)
launched = float(sys.argv[1])
dist.init_process_group("gloo", init_method="env://")
inited = time.time()
out = torch.full((1024,), float(dist.get_rank()), dtype=torch.float64)
dist.all_reduce(out)
first = time.time()
assert float(out[0]) == sum(range(dist.get_world_size()))
def timed(buf, iters):
    for _ in range(3):
        dist.all_reduce(buf)
    began = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    return (time.perf_counter() - began) / iters
ar4 = timed(torch.ones(1), 50)
ar1m = timed(torch.ones(1 << 18), 5)
import resource
worst = torch.tensor([first - launched, inited - launched, threading.active_count(),
                      len(os.listdir("/proc/self/fd")), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, ar4, ar1m],
                     dtype=torch.float64)
dist.all_reduce(worst, op=dist.ReduceOp.MAX)
if dist.get_rank() == 0:
    print("FIGURES " + " ".join(f"{v:.6f}" for v in worst.tolist()), flush=True)
dist.destroy_process_group()
"""


def _count(pid: int):
    try:
        threads = len(os.listdir(f"/proc/{pid}/task"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return threads, fds
    except OSError:
        return 0, 0


FIELDS = ("first_result_s", "init_s", "rank_threads_max", "rank_fds_max", "rank_maxrss_mib", "ar4_us", "ar1m_us")


def _figures(output: str):
    """The FIGURES line's values, named (None when the job printed none)."""
    values = next((line.split()[1:] for line in output.splitlines() if "FIGURES" in line), None)
    if values is None:
        return None
    first, inited, threads, fds, rss, ar4, ar1m = (float(v) for v in values)
    return {"first_result_s": round(first, 2), "init_s": round(inited, 2), "rank_threads_max": int(threads),
            "rank_fds_max": int(fds), "rank_maxrss_mib": round(rss / 1024, 1), "ar4_us": round(ar4 * 1e6, 1),
            "ar1m_us": round(ar1m * 1e6, 1)}


def run_horovod(cluster, args, work: str):
    """horovodrun over the cluster's sshd: the job's figures and horovodrun's peak threads and descriptors."""
    np_ = args.hosts * args.slots
    hosts = ",".join(f"{h.address}:{args.slots}" for h in cluster.hosts)
    env = {**os.environ, **cluster.env(), "PYTHONPATH": ROOT}
    launched = time.time()
    command = [sys.executable, "-m", "horovod.runner", "-i", cluster.identity_file, "-np", str(np_), "-H", hosts,
               *args.extra.split(), sys.executable, "job.py", repr(launched)]
    print(f"horovodrun -np {np_} over {args.hosts} hosts ...", flush=True)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=work, start_new_session=True)
    peak = [0, 0]
    done = threading.Event()

    def watch():
        while not done.wait(0.5):
            threads, fds = _count(proc.pid)
            peak[0], peak[1] = max(peak[0], threads), max(peak[1], fds)

    threading.Thread(target=watch, daemon=True).start()
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        done.set()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    figures = _figures(output) if proc.returncode == 0 else None
    if figures is None:
        print(output[-4000:])
        return None
    return dict(figures, horovodrun_threads_max=peak[0], horovodrun_fds_max=peak[1],
                wall_s=round(time.time() - launched, 1))


def run_gloo(cluster, args, work: str):
    """The same job in torch.distributed (Gloo): ``slots`` ranks started in each host's namespace."""
    np_ = args.hosts * args.slots
    launched = time.time()
    print(f"torch.distributed (Gloo), {np_} ranks over {args.hosts} hosts ...", flush=True)
    procs = []
    log = open(os.path.join(work, "gloo.log"), "w")
    try:
        for index, host in enumerate(cluster.hosts):
            for slot in range(args.slots):
                rank = index * args.slots + slot
                env = {**os.environ, "PYTHONPATH": ROOT, "RANK": str(rank), "WORLD_SIZE": str(np_),
                       "MASTER_ADDR": cluster.hosts[0].address, "MASTER_PORT": "29517",
                       "GLOO_SOCKET_IFNAME": host.iface}
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", host.netns, sys.executable, "gloo_job.py", repr(launched)],
                    stdout=subprocess.PIPE if rank == 0 else log, stderr=log, text=True, env=env, cwd=work,
                    start_new_session=True))
        output, _ = procs[0].communicate(timeout=900)
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        log.close()
    figures = _figures(output) if not any(codes) else None
    if figures is None:
        with open(os.path.join(work, "gloo.log")) as handle:
            print(handle.read()[-4000:])
        return None
    return dict(figures, wall_s=round(time.time() - launched, 1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--gloo", action="store_true", help="the same job in torch.distributed (Gloo) beside it")
    parser.add_argument("--json", default="")
    parser.add_argument("--extra", default="", help="more horovodrun flags, space-separated")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    print(f"making {args.hosts} namespace hosts ...", flush=True)
    summary = {"ranks": args.hosts * args.slots, "hosts": args.hosts}
    with NetnsCluster(args.hosts) as cluster, tempfile.TemporaryDirectory() as work:
        for name, text in (("job.py", JOB), ("gloo_job.py", GLOO_JOB)):
            with open(os.path.join(work, name), "w") as handle:
                handle.write(text)
        summary["horovod-py"] = run_horovod(cluster, args, work)
        if args.gloo:
            summary["torch-gloo"] = run_gloo(cluster, args, work)
    impls = [k for k in ("horovod-py", "torch-gloo") if k in summary]
    for key in dict.fromkeys(k for i in impls for k in (summary[i] or {})):
        print(f"{key:>24}: " + "  ".join(f"{i} {(summary[i] or {}).get(key, '-')}" for i in impls))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)
    return 0 if all(summary[i] for i in impls) else 1


if __name__ == "__main__":
    sys.exit(main())
