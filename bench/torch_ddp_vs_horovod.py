"""Training throughput of horovod-py beside torch DistributedDataParallel (Gloo): three models, world sizes, hosts.

    python bench/torch_ddp_vs_horovod.py [--np 2,4,8] [--models resnet8,transformer,embedding] [--rounds 3]
    python bench/torch_ddp_vs_horovod.py --hosts 2x2 [...]     # 2 network-namespace hosts of 2 ranks (needs root)

For each world size and model, ``--rounds`` rounds; a round runs each side once, a fresh job each, and which side
goes first alternates from round to round (a shared machine's speed drifts). A side's figure is the median of its
rounds' samples/sec; the ratio is the median of the rounds' ratios (ours over DDP's of the same round).

- horovod-py: ``horovodrun -np N`` (with ``--hosts``: ``-H a:R,b:R`` over ssh into the namespace hosts) running
  bench/e2e_worker.py with ``hvd.DistributedOptimizer`` at default settings;
- DDP: the same worker, model, batch and timing loop under ``DistributedDataParallel`` (Gloo, default buckets), its
  N ranks started by this script with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (with ``--hosts``, each inside its
  host's namespace, ``GLOO_SOCKET_IFNAME`` its interface).

Both use one torch thread per rank unless ``--threads`` says otherwise. Samples are images (CNN), sequences
(transformer) or bags (embedding model); bench/e2e_worker.py describes the models. Prints a line per job, then a
table with each side's CPU per step and rank beside its throughput (these jobs are CPU-bound: where one side is
slower, its ranks' CPU per step says whether it did more work; the ranks' own, not ``horovodrun``'s); ``--json FILE``
writes every round. Every job has a hard timeout (``--timeout``), and whatever it started is ended by process-group id
when it ends or fails; the namespace hosts, with every process inside them, are removed on the way out
(:class:`horovod.testing.netns.NetnsCluster`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "e2e_worker.py")
TEARDOWN_ABORT = "terminate called without an active exception"
SIDES = ("horovod-py", "DDP")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2", help="world sizes on this host, comma-separated (e.g. 2,4,8)")
    parser.add_argument("--hosts", default="",
                        help="instead of --np: namespace-host layouts HxR (H hosts of R ranks), comma-separated")
    parser.add_argument("--models", "--model", default="resnet8,transformer,embedding",
                        help="comma-separated, of resnet8, resnet18, mlp, transformer, embedding")
    parser.add_argument("--batch-size", type=int, default=0, help="samples per rank and step (0: each model's own)")
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--fp16-allreduce", action="store_true", help="horovod-py only: fp16 gradient compression")
    parser.add_argument("--tiny", action="store_true", help="small models and batches: a smoke run")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per world size and model, the side going first alternating; medians of them")
    parser.add_argument("--timeout", type=float, default=600, help="hard limit per job, s")
    parser.add_argument("--json", default="", help="write every round's figures here")
    return parser.parse_args(argv)


def _env(extra=None):
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **(extra or {}))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _end(procs) -> None:
    """End each process's group (by id: each was started in a session of its own), SIGTERM then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        live = [p for p in procs if p.poll() is None]
        for proc in live:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def run_job(commands, timeout):
    """Start ``commands`` ([(argv, env)]) together; ``(samples/sec, CPU ms per step and rank, None)`` as their rank 0
    prints them, or ``(None, None, why)``."""
    with tempfile.TemporaryFile("w+") as log:
        procs, why = [], None
        try:
            for argv, env in commands:
                procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            began, failed_at = time.monotonic(), None
            while any(p.poll() is None for p in procs):
                if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                    failed_at = time.monotonic()        # a dead Gloo rank leaves its peers waiting: 5 s grace
                if time.monotonic() - began > timeout or (failed_at and time.monotonic() - failed_at > 5):
                    why = f"timed out after {timeout:.0f} s" if failed_at is None else "a process failed"
                    break
                time.sleep(0.1)
        finally:
            _end(procs)
        log.seek(0)
        text = log.read()
    match = re.search(r"RESULT ([\d.]+)", text)
    if why is None:     # (every process has ended: each has an exit code)
        codes = sorted({p.returncode for p in procs})
        # Gloo's ranks sometimes abort in their teardown, after the timing loop and the figure ("terminate called
        # without an active exception", SIGABRT): that figure stands, and the line says so. (Survivors that hang
        # more than 5 s after such an abort still fail the job above.)
        teardown_abort = match is not None and -signal.SIGABRT in codes and set(codes) <= {0, -signal.SIGABRT} \
            and TEARDOWN_ABORT in text
        if (any(codes) and not teardown_abort) or not match:
            why = f"exit codes {codes}"
        elif teardown_abort:
            print(f"  (a rank aborted in Gloo's teardown after the figure was in; exit codes {codes})", flush=True)
    if why is not None:
        return None, None, f"{why}:\n{text[-2500:]}"
    cpu = re.search(r"CPU_MS_PER_STEP ([\d.]+)", text)
    return float(match.group(1)), float(cpu.group(1)) if cpu else None, None


def commands(side, spec, ranks, cluster, per_host):
    """The processes of one job: horovodrun, or DDP's ranks (in the namespace hosts when there is a cluster)."""
    worker = [sys.executable, WORKER, "horovod" if side == "horovod-py" else "ddp", json.dumps(spec)]
    if side == "horovod-py":
        where = []
        if cluster is not None:
            hosts = ",".join(f"{h.address}:{per_host}" for h in cluster.hosts)
            where = ["-H", hosts, "-i", cluster.identity_file]
        argv = [sys.executable, "-m", "horovod.runner", "-np", str(ranks), *where, *worker]
        return [(argv, _env(cluster.env() if cluster is not None else None))]
    master = cluster.hosts[0].address if cluster is not None else "127.0.0.1"
    port, out = str(_free_port()), []
    for rank in range(ranks):
        env = _env({"RANK": str(rank), "WORLD_SIZE": str(ranks), "MASTER_ADDR": master, "MASTER_PORT": port})
        if cluster is None:
            out.append((worker, env))
            continue
        host = cluster.hosts[rank // per_host]
        out.append((["ip", "netns", "exec", host.netns, *worker], dict(env, GLOO_SOCKET_IFNAME=host.iface)))
    return out


def measure(args, layout, cluster, records) -> None:
    """Every model's rounds on one layout (``(label, ranks, per_host)``), appended to ``records``."""
    label, ranks, per_host = layout
    for model in args.models.split(","):
        spec = {"model": model, "batch": args.batch_size, "warmup": args.num_warmup_batches,
                "per_iter": args.num_batches_per_iter, "iters": args.num_iters, "threads": args.threads,
                "fp16": args.fp16_allreduce, "tiny": args.tiny}
        for round_ in range(args.rounds):
            rates, cpus = {}, {}
            for side in (SIDES if round_ % 2 == 0 else SIDES[::-1]):
                rate, cpus[side], why = run_job(commands(side, spec, ranks, cluster, per_host), args.timeout)
                rates[side] = rate
                cpu = "-" if cpus[side] is None else f"{cpus[side]:.1f}"
                shown = f"{rate:10.1f} samples/sec, {cpu} CPU ms a step and rank" if rate is not None else \
                    f"FAILED ({why})"
                print(f"[{label}, {ranks} ranks, {model}] round {round_ + 1}/{args.rounds}: {side:<10} {shown}",
                      flush=True)
            records.append({"layout": label, "ranks": ranks, "model": model, "round": round_, "rates": rates,
                            "cpu_ms_per_step": cpus})


def table(records) -> str:
    """Per layout and model: each side's median samples/sec, the median of the rounds' ratios, and each side's
    median CPU per step and rank (the process's, every thread)."""
    lines = ["| where | ranks | model | horovod-py samples/s | DDP samples/s | horovod-py / DDP (median of rounds) "
             "| rounds' ratios | CPU ms a step and rank, horovod-py / DDP |", "|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r["layout"], r["ranks"], r["model"]) for r in records):
        chosen = [r for r in records if (r["layout"], r["ranks"], r["model"]) == key]
        rounds = [r["rates"] for r in chosen]
        cells = []
        for side in SIDES:
            done = [r[side] for r in rounds if r.get(side)]
            cells.append(f"{statistics.median(done):.1f}" if done else "failed")
        ratios = [r["horovod-py"] / r["DDP"] for r in rounds if r.get("horovod-py") and r.get("DDP")]
        ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
        cpu = [[r[side] for r in (x.get("cpu_ms_per_step", {}) for x in chosen) if r.get(side)] for side in SIDES]
        cpu_cell = " / ".join(f"{statistics.median(c):.1f}" if c else "-" for c in cpu)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {cells[0]} | {cells[1]} | {ratio} | "
                     f"{', '.join(f'{x:.2f}' for x in ratios)} | {cpu_cell} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"models {args.models}, {args.threads} torch thread(s) per rank, {args.rounds} round(s) each, "
          f"{'tiny sizes, ' if args.tiny else ''}load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    records = []
    # Ended by a signal (a timeout's), unwind like an error: the jobs' processes and the namespace hosts go too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.hosts:
        sys.path.insert(0, ROOT)
        from horovod.testing.netns import NetnsCluster, unavailable_reason
        reason = unavailable_reason()
        if reason:
            sys.exit(f"--hosts: {reason}")
        for layout in args.hosts.split(","):
            count, per_host = (int(n) for n in layout.lower().split("x"))
            with NetnsCluster(count) as cluster:
                measure(args, (f"{count} × {per_host} hosts", count * per_host, per_host), cluster, records)
    else:
        for ranks in (int(n) for n in args.np.split(",")):
            measure(args, ("1 host", ranks, ranks), None, records)
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n\n{table(records)}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "cores": os.cpu_count(), "records": records}, handle, indent=1)
    return 0 if all(all(r["rates"].values()) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
