"""The four control-plane figures the simulation predicts, measured on one host across world sizes (horovod-py only).

    python bench/scale_control.py [--np 2,4,8,16,32,64,128] [--repeats 3] [--linger] [--evict MIB] [--curve SECONDS]
        [--json FILE]
    python bench/scale_control.py --pool RUN.json RUN.json ... --json FILE      # several runs' repeats as one

For each np, ``--repeats`` times, one ``horovodrun -np N`` job (default settings) measures:
- start-up to the first allreduce's result, the slowest rank's, from the launch;
- the 4 B allreduce: a loop of blocking ops, time per op (the slowest rank's);
- a cached cycle of 20 names: 20 async 4 B allreduces submitted at once, then every result (time per step);
- each rank's CPU (every thread of its process) per op of each of the two loops (``cpu_us``: rank 0 coordinates,
  the tree's relays pass messages on, the others only ask; the calibration fits rank 0's fold to np 4's and prints
  every role's beside the simulation's with ``--roles``);
- the time to detect a killed rank: once the loops are done every rank keeps allreducing; this script SIGKILLs rank
  ``np // 2 + 1`` (the last at np 2) and each survivor stamps when its allreduce raised; the figure is the last
  survivor's stamp less the kill's, and the run records how many survivors named the killed rank. Each survivor then
  exits, as a script without elastic does (its process's end takes a core for a few ms); with ``--linger`` it stays
  alive instead, as an elastic job's survivors do, which leaves the exits' CPU out of the figure. Each survivor also
  records what failing cost its process (``fail_cpu_us``, the median over survivors: the CPU of the op that raised
  less the loop's median op); with ``--evict MIB`` it writes MIB of its own memory before each op of that loop, so
  the failure runs with its caches emptied.

With ``--curve`` it also measures the machine's core-sharing curve (bench/core_sharing.py's ring of N processes)
right before each job of N ranks, so that the curve and the jobs see the machine in the same minutes; the JSON then
holds it as ``sharing``, which the calibration takes when no ``--sharing`` is given.

The 4 B and 20-name figures are the median of a loop of about ``--seconds`` after a warm-up of half as long. Each
figure of the table is the median over repeats, which go round the sizes in turn. Once per run of this script it also
measures the rendezvous server alone (``server_request_us`` in the JSON's meta): its CPU per request while a client
process sends it 400 registrations, the simulation's start-up and loss-board cost per request. ``python -m
horovod.tools.simulate.calibration bench/figures/scale-control.json`` fits the simulation to np 2 and 4 and prints its
prediction of every other np beside these measurements (docs/scaling-notebook.md). Every run has a hard timeout and whatever
it started is ended by pid (this process is its descendants' subreaper).

A single job's figures at 8-128 ranks spread by up to a factor of two between repeats on this machine (the 4 B
allreduce at 64 ranks took 6.5-14.4 ms), so a median of five moves between runs by more than the calibration's 25 %.
``--pool`` takes the repeats of several runs of the same sizes (and their curves' rings) as one run of that many
repeats and writes its medians, without running anything.
"""

from __future__ import annotations

import time

_STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Tuple  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import core_sharing  # noqa: E402
import rank_cpu  # noqa: E402

CYCLE_NAMES = 20
CURVE_EVICT_MIB = 16        # as bench/core_sharing.py empties the caches
FIGURES = ("first_s", "ar4_us", "cycle20_us", "detect_ms")


def _timed(run, seconds: float, agree, slowest) -> Tuple[float, float]:
    """The slowest rank's median time of ``run`` over a loop of about ``seconds``, after a warm-up of half as long
    (at 64 ranks and more the first half second after start-up runs up to twice as slow as the steady state); and
    this process's CPU (every thread's) per run of that loop."""
    import numpy as np
    began = time.perf_counter()
    run()
    one = max(time.perf_counter() - began, 1e-7)
    for _ in range(agree(int(min(1000, max(5, seconds / 2 / one))))):
        run()
    began = time.perf_counter()
    run()
    iters = agree(int(min(2000, max(5, seconds / max(time.perf_counter() - began, 1e-7)))))
    times = []
    cpu_began = time.process_time()
    for _ in range(iters):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return slowest(float(np.median(times))), (time.process_time() - cpu_began) / iters


def _worker(spec) -> None:
    import numpy as np
    import horovod.numpy as hvd
    from horovod.common.exceptions import HorovodInternalError
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    with open(os.path.join(spec["dir"], f"pid-{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    out = hvd.allreduce(np.full(4, float(rank)), name="first", op=hvd.Sum)
    first = time.time() - spec["launched"]
    assert out[0] == size * (size - 1) / 2, out
    agree = lambda n: int(hvd.broadcast(np.array([n]), 0, name="iters")[0])         # noqa: E731
    slowest = lambda t: float(hvd.allreduce(np.array([t]), op=hvd.Max, name="slowest")[0])   # noqa: E731
    ar4, ar4_cpu = _timed(rank_cpu.op_of(hvd, 1), spec["seconds"], agree, slowest)
    cycle20, cycle_cpu = _timed(rank_cpu.op_of(hvd, CYCLE_NAMES), spec["seconds"], agree, slowest)
    first = slowest(first)
    cpu = hvd.allgather(np.array([[ar4_cpu, cycle_cpu]]) * 1e6, name="cpu")     # every rank's, in rank order
    if rank == 0:
        with open(os.path.join(spec["dir"], "figures.json"), "w") as handle:
            json.dump({"first_s": first, "ar4_us": ar4 * 1e6, "cycle20_us": cycle20 * 1e6,
                       "cpu_us": {"ar4": cpu[:, 0].round(1).tolist(), "cycle20": cpu[:, 1].round(1).tolist()}},
                      handle)
        os.rename(os.path.join(spec["dir"], "figures.json"), os.path.join(spec["dir"], "armed.json"))
    one = np.ones(1, np.float32)
    evict = np.zeros(spec["evict_mib"] << 20, np.uint8) if spec["evict_mib"] else None
    spent = []                  # the process's CPU (every thread's) per op of the loop the kill ends
    try:
        while True:
            if evict is not None:
                evict += 1      # outside the op's CPU: the op, and the failure, then run with the caches emptied
            began = time.process_time()
            hvd.allreduce_(one, op=hvd.Average, name="ar4")
            spent.append(time.process_time() - began)
    except HorovodInternalError as exc:
        stamp = time.time()
        failing = time.process_time() - began - float(np.median(spent[-200:] or [0.0]))
        path = os.path.join(spec["dir"], f"failed-{rank}")
        with open(path + ".part", "w") as handle:
            json.dump({"at": stamp, "error": str(exc), "fail_cpu": failing}, handle)
        os.rename(path + ".part", path)     # whole when it appears: this script reads it the moment it does
    if spec["linger"]:
        signal.pause()                      # until this script ends the job
    os._exit(1)


_CLIENT = """
import sys
from horovod.common.rendezvous_client import RendezvousClient
client = RendezvousClient("127.0.0.1", int(sys.argv[1]), bytes.fromhex(sys.argv[2]))
for i in range(int(sys.argv[3])):
    client.put("probe", str(i), b"10.0.0.1:12345 host0 settings - 8")
"""


def server_request_seconds(requests: int = 400) -> float:
    """The rendezvous server's CPU per request (this process serves; a child process is the client)."""
    import suite
    from horovod.common.rendezvous_client import make_secret
    from horovod.common.rendezvous_server import RendezvousServer
    secret = make_secret()
    with RendezvousServer(secret, host="127.0.0.1") as server:
        began = time.process_time()
        subprocess.run([sys.executable, "-c", _CLIENT, str(server.port), secret.hex(), str(requests)], check=True,
                       env=suite._env(), timeout=120)
        return (time.process_time() - began) / requests


def _wait_for(path: str, procs, deadline: float) -> bool:
    """Whether ``path`` appeared before ``deadline`` with the job still running (polls: a benchmark, not a test)."""
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        if all(p.poll() is not None for p in procs):
            return False
        time.sleep(0.02)
    return False


def run_one(np_: int, args) -> dict:
    """One job; its figures, or ``{"error": ...}``. Nothing it started outlives it."""
    import suite
    from scale import _end_all
    victim = np_ // 2 + 1 if np_ > 2 else np_ - 1
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"dir": tmp, "seconds": args.seconds, "launched": time.time(), "linger": args.linger,
                "evict_mib": args.evict}
        cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable, os.path.abspath(__file__),
               "--worker", json.dumps(spec)]
        log_path = os.path.join(tmp, "log")
        with open(log_path, "w") as log:
            procs = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=suite._env(),
                                      start_new_session=True)]
            try:
                figures = _kill_and_watch(np_, victim, tmp, procs, time.monotonic() + args.timeout + 8 * np_)
            finally:
                _end_all(procs)
        if "error" in figures:
            with open(log_path) as log:
                figures["log_tail"] = log.read()[-6000:]
    return figures


def _kill_and_watch(np_: int, victim: int, tmp: str, procs, deadline: float) -> dict:
    armed = os.path.join(tmp, "armed.json")
    if not _wait_for(armed, procs, deadline):
        return {"error": "the job ended or timed out before its loops were done"}
    with open(armed) as handle:
        figures = json.load(handle)
    with open(os.path.join(tmp, f"pid-{victim}")) as handle:
        pid = int(handle.read())
    time.sleep(0.2)                 # every rank is in its allreduce loop by now
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    survivors = [r for r in range(np_) if r != victim]
    for rank in survivors:
        if not _wait_for(os.path.join(tmp, f"failed-{rank}"), procs, deadline):
            break
    stamps, naming, missing, cpu = [], 0, [], []
    for rank in survivors:
        try:
            with open(os.path.join(tmp, f"failed-{rank}")) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            missing.append(rank)
            continue
        stamps.append(record["at"])
        cpu.append(record["fail_cpu"])
        naming += f"rank {victim} " in record["error"]
    figures.update(survivors_failed=len(stamps), survivors_naming=naming, victim=victim)
    if cpu:
        figures["fail_cpu_us"] = statistics.median(cpu) * 1e6
    if len(stamps) < len(survivors):
        figures["error"] = (f"survivors {missing} never raised ({time.time() - killed:.1f} s after the kill, the "
                            f"launcher {'running' if procs[0].poll() is None else 'ended'})")
    else:
        figures["detect_ms"] = (max(stamps) - killed) * 1e3
    return figures


def medians(runs) -> dict:
    """np -> the median of each figure over the runs that completed."""
    table = {}
    for np_ in sorted({r["np"] for r in runs}):
        done = [r["figures"] for r in runs if r["np"] == np_ and "error" not in r["figures"]]
        table[np_] = {k: statistics.median(f[k] for f in done) for k in FIGURES + ("fail_cpu_us",)
                      if done and all(k in f for f in done)}
        cpus = [f["cpu_us"] for f in done if "cpu_us" in f]
        if cpus:        # each rank's CPU per op of each loop (rank order), the median over runs
            table[np_]["cpu_us"] = {loop: [statistics.median(c[loop][r] for c in cpus) for r in range(np_)]
                                    for loop in cpus[0]}
        table[np_]["runs"] = len(done)
    return table


def markdown(table) -> str:
    """The medians as a markdown table."""
    lines = ["| np | start-up to first result, s | 4 B allreduce, µs | cached cycle of 20 names, µs | "
             "killed rank: last survivor raised after, ms | failing's CPU per survivor, µs | runs |",
             "|---|---|---|---|---|---|---|"]
    for np_, row in table.items():
        if row["runs"]:
            lines.append(f"| {np_} | {row['first_s']:.2f} | {row['ar4_us']:,.0f} | {row['cycle20_us']:,.0f} | "
                         f"{row['detect_ms']:,.1f} | {row.get('fail_cpu_us', float('nan')):,.0f} | {row['runs']} |")
    return "\n".join(lines)


def pool(saved_runs) -> dict:
    """Several runs' JSONs as one: every repeat of every run, the curve's rings of them all and the median of their
    full refills, and the medians over them all."""
    runs, rings, colds = [], {}, []
    for index, saved in enumerate(saved_runs):
        runs.extend({**run, "repeat": f"{index}.{run['repeat']}"} for run in saved["runs"])
        curve = saved.get("sharing")
        if curve:
            for size, values in curve["runs_us"].items():
                rings.setdefault(size if size == "evicted" else int(size), []).extend(v * 1e-6 for v in values)
            colds.append(curve["rank_cold_us"] * 1e-6)
    first = saved_runs[0]["meta"]
    meta = {**first, "pooled": [s["meta"].get("date") for s in saved_runs],
            "repeats": sum(s["meta"].get("repeats", 0) for s in saved_runs),
            "server_request_us": statistics.median(s["meta"]["server_request_us"] for s in saved_runs)}
    out = {"meta": meta, "medians": medians(runs), "runs": runs}
    if colds and 2 in rings and "evicted" in rings:
        out["sharing"] = core_sharing.curve(rings, colds, int(first.get("cores") or os.cpu_count() or 1),
                                            saved_runs[0]["sharing"]["meta"])
    return out


def _read(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def _rings_of_the_repeat(seconds: float, rings: dict, colds: list) -> None:
    """Once per repeat, for the curve: the ring of 2 with its caches emptied, and a rank's full refill at np 4."""
    rings["evicted"].append(core_sharing.ring(2, seconds, CURVE_EVICT_MIB))
    colds.append(core_sharing.rank_cold_seconds(CURVE_EVICT_MIB))
    print(f"curve: ring of 2 emptied {rings['evicted'][-1] * 1e6:.1f} us, a rank's full refill {colds[-1] * 1e6:.0f} "
          f"us", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4,8,16,32,64,128", help="world sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per loop (and half that to warm up)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run, plus 8 per rank")
    parser.add_argument("--linger", action="store_true",
                        help="survivors stay alive after they raised instead of exiting (as elastic ones do)")
    parser.add_argument("--evict", type=int, default=0, metavar="MIB",
                        help="write MIB of each rank's memory before each op of the loop the kill ends: the failure "
                             "then runs with the caches emptied (its CPU: fail_cpu_us)")
    parser.add_argument("--curve", type=float, default=0.0, metavar="SECONDS",
                        help="before each job, a ring of as many processes for SECONDS (bench/core_sharing.py's), "
                             "and per repeat the ring of 2 with its caches emptied and a rank's full refill: the "
                             "machine's curve, measured beside the jobs it is for (the JSON's sharing)")
    parser.add_argument("--json", default=os.path.join(HERE, "figures", "scale-control.json"))
    parser.add_argument("--pool", nargs="+", metavar="RUN",
                        help="write the repeats of these runs' JSONs as one run's (nothing is measured)")
    args = parser.parse_args(argv)
    if args.pool:
        saved = pool([_read(path) for path in args.pool])
        print(markdown(saved["medians"]))
        with open(args.json, "w") as handle:
            json.dump(saved, handle, indent=1)
        return 0
    from scale import _become_subreaper, _meta
    _become_subreaper()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    meta, runs = _meta(argparse.Namespace(binding="numpy", repeats=args.repeats)), []
    meta["server_request_us"] = server_request_seconds() * 1e6
    meta["linger"], meta["evict_mib"] = args.linger, args.evict
    print(f"rendezvous server: {meta['server_request_us']:.0f} us of CPU per request", file=sys.stderr, flush=True)
    # Repeats go round every size in turn, so that the machine drifting during the run (its speed moved by a third
    # within an hour) reaches the fitted np 2 and 4 and the predicted sizes alike.
    rings: dict = {"evicted": []}
    colds: list = []
    for repeat in range(args.repeats):
        if args.curve:
            _rings_of_the_repeat(args.curve, rings, colds)
        for np_ in [int(n) for n in args.np.split(",")]:
            print(f"[np {np_}] run {repeat + 1}/{args.repeats}: starting", file=sys.stderr, flush=True)
            if args.curve:
                rings.setdefault(np_, []).append(core_sharing.ring(np_, args.curve))
            figures = run_one(np_, args)
            shown = figures.get("error") or ", ".join(f"{k} {figures[k]:.4g}" for k in FIGURES)
            print(f"[np {np_}] run {repeat + 1}/{args.repeats}: {shown}", file=sys.stderr, flush=True)
            runs.append({"np": np_, "repeat": repeat, "figures": figures})
    meta["load_at_end"] = os.getloadavg()
    table = medians(runs)
    print(markdown(table))
    saved = {"meta": meta, "medians": table, "runs": runs}
    if args.curve and 2 in rings:
        saved["sharing"] = core_sharing.curve(rings, colds, os.cpu_count() or 1, {
            **core_sharing.kernel_scheduler(), "seconds": args.curve, "evict_mib": CURVE_EVICT_MIB,
            "tokens": core_sharing.TOKENS})
    with open(args.json, "w") as handle:
        json.dump(saved, handle, indent=1)
    return 0 if all("error" not in r["figures"] for r in runs) else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
