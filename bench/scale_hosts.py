"""One allreduce-only job over namespace hosts, measured from outside: start-up to the first allreduce's result (the
slowest rank's), each rank's threads and file descriptors during the job, and ``horovodrun``'s.

    sudo .venv/bin/python bench/scale_hosts.py --hosts 16 --slots 8      # 128 ranks over real sshd

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
for i in range(20):
    hvd.allreduce(np.ones(4096), name=f"step.{i % 4}")
threads = threading.active_count()
fds = len(os.listdir("/proc/self/fd"))
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
worst = hvd.allreduce(np.array([first - launched, inited - launched, threads, fds, rss], dtype=np.float64),
                      name="figures", op=hvd.Max)
if hvd.rank() == 0:
    print("FIGURES " + " ".join(f"{v:.3f}" for v in worst), flush=True)
hvd.shutdown()
"""


def _count(pid: int):
    try:
        threads = len(os.listdir(f"/proc/{pid}/task"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return threads, fds
    except OSError:
        return 0, 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--json", default="")
    parser.add_argument("--extra", default="", help="more horovodrun flags, space-separated")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    np_ = args.hosts * args.slots
    print(f"making {args.hosts} namespace hosts ...", flush=True)
    with NetnsCluster(args.hosts) as cluster, tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "job.py"), "w") as handle:
            handle.write(JOB)
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

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            output, _ = proc.communicate(timeout=900)
        finally:
            done.set()
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.communicate()
        wall = time.time() - launched
    figures = next((line.split()[1:] for line in output.splitlines() if "FIGURES" in line), None)
    if proc.returncode != 0 or figures is None:
        print(output[-4000:])
        print(f"the job failed (exit {proc.returncode}) after {wall:.1f} s")
        return 1
    first, inited, threads, fds, rss = (float(v) for v in figures)
    summary = {"ranks": np_, "hosts": args.hosts, "first_result_s": round(first, 2), "init_s": round(inited, 2),
               "rank_threads_max": int(threads), "rank_fds_max": int(fds), "rank_maxrss_mib": round(rss / 1024, 1),
               "horovodrun_threads_max": peak[0], "horovodrun_fds_max": peak[1], "wall_s": round(wall, 1)}
    for key, value in summary.items():
        print(f"{key:>24}: {value}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
