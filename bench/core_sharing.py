"""What a wake-up costs as more processes share this machine's cores: the curve the simulation's cache refill uses.

    python bench/core_sharing.py [--np 2,4,8,16,32,48,64,96,128] [--seconds 3] [--repeats 3] [--json FILE]

Two measurements, neither of which runs a job of the sizes the simulation predicts:

- **The machine's curve.** N Python processes, each started fresh (a private heap, as ranks have), pass two tokens
  round a ring of Unix sockets, so both cores stay busy as in a collective; on each token a process does the same
  small piece of interpreter work (dictionary and object lookups, a numpy op). CPU per wake-up against N, and at
  N = 2 again with ``--evict`` MiB of the process's own memory written before each wake-up (its own CPU left out): the
  cost of a wake-up whose caches were emptied. Each ring runs ``--repeats`` times, in turn across the sizes, and the
  median counts (one ring's figure moves by up to a third from run to run around 64 processes). A wake-up after
  ``N - 1`` others ran pays the share ``(cost(N) - cost(2)) / (cost evicted - cost(2))`` of a full refill.
- **What a full refill costs a rank.** ``bench/rank_cpu.py --np 4 --evict MIB``: a loop of 4 B allreduces at np 4,
  each rank's CPU per op, as is and with the same eviction before each op; the mean difference is ``rank_cold_us``.

It also records the kernel's tick and preemption model (``kernel_hz``, ``preempt`` in the meta), which decide how
long a process's end keeps a core from the ranks. The JSON (default ``bench/figures/core-sharing.json``) holds both
and ``sharing``: (other processes per core, share) pairs, which ``python -m horovod.tools.simulate.calibration RESULTS
--sharing FILE`` gives the simulation (``bench/scale_control.py --curve`` measures the same beside its jobs).
Every process this starts is ended by pid before it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
TOKENS = 2

_CHILD = r'''
import os, socket, sys, time
import numpy as np
rx, tx = socket.socket(fileno=int(sys.argv[1])), socket.socket(fileno=int(sys.argv[2]))
out, evict_mib = int(sys.argv[3]), int(sys.argv[4])
table = {k: str(k) for k in range(4096)}
objects = [dict(x=i, y=[i] * 4) for i in range(3000)]
vector = np.ones(256)
evict = np.zeros(evict_mib << 20, np.uint8) if evict_mib else None


def work():
    total = sum(len(table[k]) for k in range(0, 4096, 16)) + sum(o["x"] for o in objects[::10])
    return total + int((vector * 2.0 + 1.0).sum())


evicting, wakes = 0.0, 0
while True:
    try:
        token = rx.recv(8)
        if not token or token == b"stop....":
            tx.send(b"stop....")
            break
        if evict is not None:
            began = time.process_time()
            evict += 1
            evicting += time.process_time() - began
        work()
        wakes += 1
        tx.send(token)
    except OSError:
        break
# The whole CPU counts (the kernel's receive and the switch too), less the eviction's own.
os.write(out, f"{time.process_time()} {evicting} {wakes}\n".encode())
'''


def ring(n: int, seconds: float, evict_mib: int = 0) -> float:
    """Mean CPU per wake-up (seconds: the processes' whole CPU less their start-up and the eviction) of an
    ``n``-process ring with two tokens."""
    pairs = [socket.socketpair() for _ in range(n)]
    reader, writer = os.pipe()
    procs = []
    try:
        for i in range(n):
            rx, tx = pairs[i][1].fileno(), pairs[(i + 1) % n][0].fileno()
            procs.append(subprocess.Popen([sys.executable, "-c", _CHILD, str(rx), str(tx), str(writer),
                                           str(evict_mib)], pass_fds=(rx, tx, writer)))
        idle = [_cpu_of(p.pid) for p in procs]
        while True:       # started: every child's CPU has stopped growing (imports done, blocked on its socket)
            time.sleep(0.5)
            now = [_cpu_of(p.pid) for p in procs]
            if now == idle:
                break
            idle = now
        for t in range(min(TOKENS, n)):
            pairs[(t * n) // TOKENS][0].send(b"tok.....")
        time.sleep(seconds)
        pairs[0][0].send(b"stop....")
        data = b""
        deadline = time.monotonic() + 60
        while data.count(b"\n") < n and time.monotonic() < deadline:
            data += os.read(reader, 65536)
        lines = data.decode().split("\n")[:n]
        total = sum(float(line.split()[0]) - float(line.split()[1]) for line in lines) - sum(idle)
        return total / max(sum(int(line.split()[2]) for line in lines), 1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for a, b in pairs:
            a.close()
            b.close()
        os.close(reader)
        os.close(writer)


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kernel_scheduler() -> dict:
    """The kernel's tick (CONFIG_HZ) and preemption model (the boot's ``preempt=`` over the build's), which decide
    how long a process's end, kernel work, keeps a core from a woken rank; {} where /proc does not say."""
    import gzip
    try:
        with gzip.open("/proc/config.gz", "rt") as handle:
            config = dict(line.strip().split("=", 1) for line in handle if line.startswith("CONFIG_"))
        with open("/proc/cmdline") as handle:
            boot = dict(arg.split("=", 1) for arg in handle.read().split() if arg.startswith("preempt="))
    except (OSError, ValueError):
        return {}
    built = next((mode for mode in ("none", "voluntary", "lazy") if config.get(f"CONFIG_PREEMPT_{mode.upper()}") ==
                  "y"), "full" if config.get("CONFIG_PREEMPT") == "y" else None)
    preempt = boot.get("preempt", built)
    return {"kernel_hz": int(config["CONFIG_HZ"]), "preempt": preempt} if "CONFIG_HZ" in config and preempt else {}


def rank_cold_seconds(evict_mib: int) -> float:
    """What emptying the caches before each op adds to a rank's CPU per op at np 4 (bench/rank_cpu.py)."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "rank_cpu.py"), "--np", "4", "--evict", str(evict_mib)],
                         capture_output=True, text=True, timeout=600)
    rows = [line for line in out.stdout.splitlines() if "with the caches emptied" in line]
    if out.returncode or not rows:
        raise RuntimeError(f"bench/rank_cpu.py failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    extra = [float(r.split(", ")[-1].split()[0]) - float(r.split(": ")[1].split()[0]) for r in rows]
    return sum(extra) / len(extra) * 1e-6


def curve(runs: dict, colds, cores: int, meta: dict) -> dict:
    """The JSON the calibration reads (``--sharing``): from ``runs`` (ring size -> seconds per wake-up of each run,
    and "evicted": the ring of 2 with its caches emptied) and ``colds`` (each measurement of a rank's full refill),
    their medians and each size's share of a full refill."""
    sizes = sorted(n for n in runs if n != "evicted")
    per_wake = {n: statistics.median(runs[n]) for n in sizes}
    evicted, cold = statistics.median(runs["evicted"]), statistics.median(colds)
    full = evicted - per_wake[2]
    return {"meta": meta, "ring_us": {str(n): v * 1e6 for n, v in per_wake.items()},
            "runs_us": {str(k): [v * 1e6 for v in vs] for k, vs in runs.items()},
            "ring_evicted_us": evicted * 1e6, "rank_cold_us": cold * 1e6,
            "sharing": [[(n - 1) / cores, max(0.0, (per_wake[n] - per_wake[2]) / full)] for n in sizes]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4,8,16,32,48,64,96,128", help="processes in the ring, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per ring")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each ring (the median counts)")
    parser.add_argument("--evict", type=int, default=16, help="MiB written before each wake-up to empty the caches")
    parser.add_argument("--json", default=os.path.join(HERE, "figures", "core-sharing.json"))
    args = parser.parse_args(argv)
    from scale import _meta       # the machine, versions, commit and load, as the other scale benchmarks record them
    meta = {**_meta(argparse.Namespace(binding="numpy", repeats=args.repeats)), "tokens": TOKENS,
            "seconds": args.seconds, "evict_mib": args.evict, **kernel_scheduler()}
    cores = os.cpu_count() or 1
    sizes = sorted({2, *(int(n) for n in args.np.split(","))})
    runs: dict = {n: [] for n in sizes}
    runs["evicted"] = []
    for repeat in range(args.repeats):
        for n in sizes:
            runs[n].append(ring(n, args.seconds))
            print(f"[{repeat + 1}/{args.repeats}] ring of {n}: {runs[n][-1] * 1e6:.1f} us CPU per wake-up",
                  file=sys.stderr, flush=True)
        runs["evicted"].append(ring(2, args.seconds, args.evict))
        print(f"[{repeat + 1}/{args.repeats}] ring of 2, {args.evict} MiB written before each wake-up: "
              f"{runs['evicted'][-1] * 1e6:.1f} us", file=sys.stderr, flush=True)
    cold = rank_cold_seconds(args.evict)
    print(f"a rank's op at np 4 with its caches emptied: {cold * 1e6:.0f} us more", file=sys.stderr)
    saved = curve(runs, [cold], cores, meta)
    for (others, share), n in zip(saved["sharing"], sizes):
        print(f"| {n} | {others:g} | {saved['ring_us'][str(n)]:.1f} | {share:.2f} |")
    with open(args.json, "w") as handle:
        json.dump(saved, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
