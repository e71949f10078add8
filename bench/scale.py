"""Cost against world size on one host: horovod-py beside torch.distributed (Gloo), in one run.

    python bench/scale.py [--np 2,4,8,16,32,64] [--repeats 3] [--seconds 0.3] [--launch env|horovodrun]
                          [--json FILE] [--results] [--ab OTHER_CHECKOUT ...] [--no-gloo]

For each np, ``--repeats`` times, alternating horovod-py and Gloo, both started the same way: each rank a subprocess
of this script with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torch's ``env://``, which ``hvd.init()`` honours too:
its rank 0 serves the rendezvous as Gloo's serves the TCPStore); ``--launch horovodrun`` starts ours under
``horovodrun`` instead (the launcher's cost in our start-up; ``--extra`` passes it flags). It measures: start-up to
the first allreduce's result, the slowest rank's, from the launch (and how much of it came after the last rank
finished importing its framework); 4 B and 1 MiB allreduce time and the step of 200 × 4 KiB gradients, timed by
bench/workers.py as bench/suite.py times them (the slowest rank's median): ours submits 200 async allreduces, then
waits (they fuse); Gloo's peer is what buckets them, DistributedDataParallel's reducer (``workers.ddp_step``: a
backward pass over 200 parameters of that size, less the same pass under ``no_sync()``); OS threads, file
descriptors and max RSS (VmHWM) per rank (the largest over ranks, at the end of the job); rank 0's CPU time per 4 B
allreduce; and for horovod-py rank 0's CPU time per negotiation cycle (its process CPU over a loop of 4 B
allreduces, and over a loop of steps, divided by the engine's cycles). Above 8 ranks a figure is timed after one
warm-up op over at least one op, not two and three. Each figure is the median of the runs that completed.

Prints a line per run as it starts and ends, then the table; writes JSON (``--json``), plots of each cost against np
on log axes (``bench/figures/scale-*.png``, needs matplotlib) and, with ``--results``, the section "Scale across world
sizes (one host)" of bench/RESULTS.md (text of that section outside its generated block is kept); ``--from-json``
redraws all three from a saved run (bench/scale_report.py). ``--ab OTHER_CHECKOUT`` runs another checkout's horovod-py
beside this one's (its ranks import that checkout's package; the workers are this script's), the sides' order
rotating from round to round, and prints an A/B table per other checkout: each side's median and the median of the
rounds' own ratios, a ratio above 1.10 marked; ``--no-gloo`` leaves Gloo out. Every run has a hard
timeout (``--timeout``; by default it grows with np) and whatever it started is ended by pid when it finishes, fails
or times out: this process is its descendants' subreaper, so a worker orphaned by its launcher is still found.
"""

from __future__ import annotations

import time

_STARTED = time.time()      # a worker's interpreter reached this script: before numpy, torch or horovod load

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEARDOWN_ABORT = "terminate called without an active exception"   # a Gloo rank's abort in its teardown (SIGABRT)
sys.path.insert(0, HERE)

from scale_report import (IMPLS, SECTION, ab_label, ab_summary, markdown, medians, plot,  # noqa: E402
                          results_section, summary as _summary, write_results)


# ----------------------------------------------------------------------------------------------------- the workers


def _thread_cpu():
    """CPU seconds so far of each of this process's threads, summed by name (Python's, else the kernel's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick, spent = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = names.get(int(tid)) or comm.read().strip()
        except OSError:
            continue
        spent[name] = spent.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick    # utime + stime
    return spent


def _peak_rss_mib() -> float:
    """This process image's peak RSS (VmHWM): ``ru_maxrss`` outlives ``exec``, so a rank forked from this script
    would report the script's peak."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def _cpu_loops(spec, ops_for, agree, cycles, ar4, step):
    """Rank 0's process CPU (every thread) over a loop of 4 B allreduces and, where the engine counts cycles, over
    a loop of steps: per op, and per negotiation cycle."""
    import workers
    seconds = spec["seconds"]
    loops = [("4b", ops_for("allreduce", 4), agree(int(min(2000, max(20, seconds / ar4)))))]
    if cycles is not None:      # (Gloo has no cycles to divide by, and its step takes seconds at 64 ranks)
        loops.append(("step", ops_for("step", workers.STEP_BYTES), agree(int(min(200, max(3, seconds / step))))))
    figures = {}
    for name, run, iters in loops:
        threads, cycle = _thread_cpu(), cycles() if cycles else 0
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(iters):
            run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if name == "4b":        # CPU over wall: how many cores rank 0 keeps busy while it waits for small ops
            figures.update(cpu_per_op_us=cpu / iters * 1e6, loop_per_op_us=wall / iters * 1e6)
        figures[f"thread_cpu_{name}_us"] = {thread: (spent - threads.get(thread, 0.0)) / iters * 1e6
                                            for thread, spent in _thread_cpu().items()}
        if cycles is not None:
            cycle = cycles() - cycle
            figures[f"cpu_per_cycle_{name}_us"] = cpu / max(cycle, 1) * 1e6
            figures["cycles_per_op" if name == "4b" else "cycles_per_step"] = cycle / iters
    return figures


def _measure(spec, ops_for, agree, slowest, vmax, cycles, rank, size, stamps, local=None):
    """The timed rows (bench/workers.py), rank 0's CPU, then the per-rank counts; rank 0 writes the figures.
    ``local()``, when given, is the step's work without its reduction (DDP's backward under ``no_sync``), timed the
    same way and taken off the step's time."""
    import workers
    plan = {"impl": spec["impl"], "ops": ["allreduce", "step"], "sizes": [4, 1 << 20], "max_bytes": 1 << 20,
            "seconds": spec["seconds"], "warmups": 2 if size <= 8 else 1, "min_iters": 3 if size <= 8 else 1}
    ar4, ar1m, step = (r["seconds"] for r in workers._plan(plan, ops_for, agree, slowest, rank, size))
    figures = {"ar4_us": ar4 * 1e6, "ar1m_us": ar1m * 1e6, "step_ms": step * 1e3}
    if local is not None:
        counts = {k: plan[k] for k in ("warmups", "min_iters")}
        spent = workers._measure(local(), spec["seconds"], agree, slowest, **counts)
        figures.update(step_ms=(step - spent) * 1e3, step_local_ms=spent * 1e3)
    figures.update(_cpu_loops(spec, ops_for, agree, cycles, ar4, step))
    counts = [len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), threading.active_count(),
              _peak_rss_mib()]
    worst = vmax([t - spec["launched"] for t in stamps] + counts)
    keys = ["started_s", "imported_s", "inited_s", "first_s", "threads", "fds", "py_threads", "rss_mib"]
    figures.update(zip(keys, worst))
    if rank == 0:
        with open(spec["out"], "w") as handle:
            json.dump(figures, handle)


def _worker_horovod(spec) -> None:
    import numpy as np
    import workers
    if spec["binding"] == "torch":
        import torch
        import horovod.torch as hvd
        torch.set_num_threads(1)
        ops, sync = workers.horovod_torch_ops, workers.horovod_torch_sync

        def tensor(values):
            return torch.tensor(values, dtype=torch.float64)
    else:
        import horovod.numpy as hvd
        ops, sync = workers.horovod_ops, workers.horovod_sync

        def tensor(values):
            return np.array(values, dtype=np.float64)
    from horovod.runtime import basics
    imported = time.time()
    hvd.init()
    inited = time.time()
    rank, size = hvd.rank(), hvd.size()
    out = hvd.allreduce(tensor([float(rank)] * 1024), name="first", op=hvd.Sum)
    first = time.time()
    assert float(out[0]) == size * (size - 1) / 2, out[:4]
    engine = basics.engine()
    _measure(spec, ops(hvd, size), *sync(hvd),
             lambda v: [float(x) for x in hvd.allreduce(tensor(v), op=hvd.Max, name="figures")],
             lambda: engine.cycles, rank, size, [_STARTED, imported, inited, first])
    hvd.shutdown()


def _worker_gloo(spec) -> None:
    import workers
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    imported = time.time()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size)
    inited = time.time()
    out = torch.full((1024,), float(rank), dtype=torch.float64)
    dist.all_reduce(out)
    first = time.time()
    assert float(out[0]) == size * (size - 1) / 2, out[:4]

    def vmax(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(x) for x in t]
    gloo_ops, ddp = workers.gloo_ops(dist, size), []

    def ops_for(op, nbytes):    # the step's peer is DDP's bucketed reducer (built here: every rank, in plan order)
        if op != "step":
            return gloo_ops(op, nbytes)
        ddp[:] = workers.ddp_step(max(1, nbytes // 4))
        return ddp[0]
    _measure(spec, ops_for, *workers.gloo_sync(dist), vmax, None, rank, size, [_STARTED, imported, inited, first],
             local=lambda: ddp[1])
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------- launching runs


def _become_subreaper() -> None:
    """Orphaned descendants (a worker whose launcher died) are re-parented to this process, where cleanup finds them."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)     # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _end_all(roots, grace: float = 5.0) -> int:
    """End every process this one started (the launchers first, so they may clean up; then any descendant left, by
    pid) and reap them; returns how many had to be ended."""
    import psutil
    ended = 0
    for stage in range(3):
        procs = psutil.Process().children(recursive=True)
        if not procs:
            break
        targets = [p for p in procs if p.pid in {r.pid for r in roots}] if stage == 0 else procs
        for proc in targets or procs:
            try:
                proc.terminate() if stage < 2 else proc.kill()
            except psutil.NoSuchProcess:
                pass
        ended = max(ended, len(procs))
        psutil.wait_procs(procs, timeout=grace if stage < 2 else 5)
    for root in roots:
        root.poll()
    return ended


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch(impl, np_, spec, log, args, root=ROOT):
    """Both sides' ranks as subprocesses of this script with torch's env:// variables (``--launch env``, which
    horovod-py's ``hvd.init()`` honours: rank 0 serves the rendezvous), or ours under ``horovodrun``; ``root``: the
    checkout whose ``horovod`` the ranks import (``--ab``), this script's workers either way."""
    import suite
    worker = [sys.executable, os.path.abspath(__file__), "--worker", impl]
    spec["launched"] = time.time()
    base = suite._env() if root == ROOT else dict(
        suite._env(), PYTHONPATH=os.pathsep.join([root, HERE, os.environ.get("PYTHONPATH", "")]))
    if impl == "horovod-py" and args.launch == "horovodrun":
        cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), *args.extra.split(), *worker, json.dumps(spec)]
        return [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=base, start_new_session=True)]
    env = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(np_))
    return [subprocess.Popen([*worker, json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT,
                             env=dict(env, RANK=str(rank)), start_new_session=True) for rank in range(np_)]


def run_one(impl, np_, args, tmp, root=ROOT, label=""):
    """One job of ``np_`` ranks; its figures, or ``{"error": ...}``. Nothing it started outlives it."""
    tag = (label or impl).replace(":", "-").replace("/", "-")
    out, log_path = os.path.join(tmp, f"{tag}-{np_}.json"), os.path.join(tmp, f"{tag}-{np_}.log")
    if os.path.exists(out):
        os.remove(out)
    spec = {"impl": impl, "binding": args.binding, "seconds": args.seconds, "out": out}
    timeout = args.timeout or 120 + 8 * np_
    start = time.monotonic()
    error = None
    with open(log_path, "w") as log:
        procs = _launch(impl, np_, spec, log, args, root)
        try:
            failed_at = None
            while True:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = time.monotonic()     # a dead Gloo rank leaves its peers waiting 30 min: 5 s grace
                if time.monotonic() - start > timeout or (failed_at and time.monotonic() - failed_at > 5):
                    error = f"timed out after {timeout} s" if not failed_at else "a rank failed; the others were ended"
                    break
                time.sleep(0.1)
        finally:
            left = _end_all(procs)
    wall = time.monotonic() - start
    codes = [p.returncode for p in procs]
    with open(log_path) as handle:
        tail = handle.read()[-3000:]
    # Gloo's ranks sometimes abort in their teardown, after the figures are written ("terminate called without an
    # active exception", SIGABRT): the figures stand, and the run's line says so (as bench/torch_ddp_vs_horovod.py).
    teardown_abort = error is None and os.path.exists(out) and -signal.SIGABRT in codes and \
        set(codes) <= {0, -signal.SIGABRT} and TEARDOWN_ABORT in tail
    if error is None and not teardown_abort and (any(codes) or not os.path.exists(out)):
        error = f"exit codes {sorted(set(codes))}"
    if error:
        return {"error": error, "ended_processes": left, "wall_s": wall, "log_tail": tail}
    with open(out) as handle:
        figures = json.load(handle)
    return dict(figures, wall_s=wall, ended_processes=left, **({"teardown": TEARDOWN_ABORT} if teardown_abort else {}))


def _meta(args):
    import numpy
    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    try:
        import torch
        versions["torch"] = torch.__version__
    except ImportError:
        pass
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(), "cpu": model,
            "load_at_start": os.getloadavg(), "commit": commit.strip(), "argv": sys.argv[1:], "versions": versions,
            "binding": args.binding, "repeats": args.repeats, "launch": args.launch, "step_peer": "ddp"}


def measure(args, nps):
    """Every run, alternating frameworks, ``args.repeats`` times per np (fewer past ``args.budget``)."""
    _become_subreaper()
    # Ended by a signal (a timeout's), it unwinds like an error: the run's workers are ended by pid, not orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    runs, begun = [], time.monotonic()
    sides = [(IMPLS[0], IMPLS[0], ROOT)] + [(ab_label(path), IMPLS[0], os.path.abspath(path)) for path in args.ab] + \
        ([] if args.no_gloo else [(IMPLS[1], IMPLS[1], ROOT)])
    with tempfile.TemporaryDirectory() as tmp:
        for np_ in nps:
            pair = 0.0
            for repeat in range(args.repeats):
                spent, pair_began = (time.monotonic() - begun) / 60, time.monotonic()
                if repeat and args.budget and spent + pair > args.budget:
                    print(f"[np {np_}] {args.repeats - repeat} more runs of {pair:.1f} min would pass the budget of "
                          f"{args.budget:.0f} min ({spent:.1f} spent): {repeat} of {args.repeats} runs",
                          file=sys.stderr, flush=True)
                    break
                turn = repeat % len(sides)     # (which side goes first rotates: a shared machine's speed drifts)
                for side, impl, root in sides[turn:] + sides[:turn]:
                    label = f"[np {np_}] {side} run {repeat + 1}/{args.repeats}"
                    print(f"{label}: starting", file=sys.stderr, flush=True)
                    figures = run_one(impl, np_, args, tmp, root, side)
                    print(f"{label}: {_summary(figures)}", file=sys.stderr, flush=True)
                    if "error" in figures:
                        print(figures["log_tail"][-1500:], file=sys.stderr, flush=True)
                    runs.append({"impl": side, "np": np_, "repeat": repeat, "figures": figures})
                pair = (time.monotonic() - pair_began) / 60
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4,8,16,32,64", help="world sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per np and framework (median)")
    parser.add_argument("--seconds", type=float, default=0.3, help="timed seconds per figure (at least 3 iterations)")
    parser.add_argument("--timeout", type=float, default=0, help="hard limit per run, s (default 120 + 8 × np)")
    parser.add_argument("--budget", type=float, default=0,
                        help="minutes: an np's next repeat is skipped when it would end past it (default: none)")
    parser.add_argument("--binding", choices=["numpy", "torch"], default="numpy", help="horovod-py's ranks use it")
    parser.add_argument("--launch", choices=["env", "horovodrun"], default="env",
                        help="env: both sides' ranks started here alike (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT); "
                             "horovodrun: ours under horovodrun, Gloo's as in env (the launcher's cost counted)")
    parser.add_argument("--extra", default="", help="more horovodrun flags, space-separated (--launch horovodrun)")
    parser.add_argument("--ab", action="append", default=[], metavar="CHECKOUT",
                        help="another checkout's horovod-py beside this one's, alternating (git worktree add ...)")
    parser.add_argument("--no-gloo", action="store_true", help="leave out torch.distributed (an A/B alone)")
    parser.add_argument("--json", default=os.path.join(HERE, "figures", "scale-results.json"))
    parser.add_argument("--figures", default=os.path.join(HERE, "figures"), help="folder for scale-*.png")
    parser.add_argument("--results", action="store_true", help="write the section of bench/RESULTS.md")
    parser.add_argument("--from-json", action="store_true",
                        help="measure nothing: the table, plots and section from the runs in --json")
    args = parser.parse_args(argv)
    if args.extra and args.launch != "horovodrun":
        parser.error(f"--extra {args.extra!r} holds horovodrun flags: it needs --launch horovodrun")
    if args.from_json:
        with open(args.json) as handle:
            saved = json.load(handle)
        meta, runs = saved["meta"], saved["runs"]
        nps = sorted({r["np"] for r in runs})
    else:
        nps = [int(n) for n in args.np.split(",")]
        meta = _meta(args)
        runs = measure(args, nps)
        meta["load_at_end"] = os.getloadavg()
    table = medians(runs)
    text = markdown(table, nps)
    print(text)
    for other in sorted({r["impl"] for r in runs} - set(IMPLS)):
        print(ab_summary(runs, nps, other))
    plots, why = plot(table, nps, args.figures)
    print(f"plots: {', '.join(plots)}" if plots else f"plots skipped: {why}", flush=True)
    if not args.from_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "medians": table, "runs": runs}, handle, indent=1)
    if args.results:
        repeats = meta.get("repeats") or max(r["repeat"] for r in runs) + 1
        write_results(os.path.join(HERE, "RESULTS.md"), results_section(meta, text, repeats, plots, why))
        print(f"wrote the section '{SECTION[3:]}' of bench/RESULTS.md")
    return 0 if all("error" not in r["figures"] for r in runs) else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        {"horovod-py": _worker_horovod, "torch-gloo": _worker_gloo}[sys.argv[2]](json.loads(sys.argv[3]))
    else:
        sys.exit(main())
