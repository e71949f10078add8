"""The benchmark suite: horovod-py beside its peers, in one run, one command.

    python bench/suite.py [--np 2] [--max-mib 256] [--seconds 0.5] [--rounds 2] [--out bench/results] [--no-e2e]

Runs, for each implementation (horovod-py through ``horovod.numpy``, and through ``horovod.torch`` as
``horovod-py-torch``; torch.distributed with Gloo; mpi4py over Open MPI when ``mpirun`` and
``mpi4py`` are installed — on Debian: ``apt-get install openmpi-bin libopenmpi-dev`` then ``pip install mpi4py``):
allreduce latency and bus bandwidth from 4 B up to ``--max-mib``, allgather and broadcast bandwidth, and the
"200 × 4 KiB allreduces, one step" figure; then (unless ``--no-e2e``) the end-to-end synthetic benchmark against
DistributedDataParallel (bench/torch_ddp_vs_horovod.py: a CNN, a transformer and an embedding model, several
minutes; its lines are shown as they come). Writes
``<out>/suite.json``, ``<out>/suite.md`` (the tables, with the ratios the performance targets are stated in) and
``<out>/busbw.png`` (bus bandwidth against size, one line per implementation; without matplotlib the run says it
skipped the figure).

Bus bandwidth follows nccl-tests: allreduce algbw × 2(n−1)/n; allgather algbw × (n−1)/n (algbw over the gathered
size); broadcast algbw. These are benchmarks, not tests: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import plotting  # noqa: E402  (bench/ is a folder of scripts, not a package)
import workers  # noqa: E402

OPS = ["allreduce", "allgather", "broadcast", "step"]


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))


def run_horovod(plan, np_, binding="horovod"):
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable,
           os.path.join(HERE, "workers.py"), binding, json.dumps(plan)]
    subprocess.run(cmd, check=True, env=_env(), timeout=3600)
    return json.load(open(plan["out"]))


def run_horovod_torch(plan, np_):
    return run_horovod(plan, np_, binding="horovod-torch")


def run_gloo(plan, np_):
    import torch.multiprocessing as mp
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(workers.gloo, args=(np_, port, plan), nprocs=np_, start_method="spawn")
    return json.load(open(plan["out"]))


def mpi_available() -> bool:
    if shutil.which("mpirun") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def run_mpi(plan, np_):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), sys.executable,
           os.path.join(HERE, "workers.py"), "mpi", json.dumps(plan)]
    subprocess.run(cmd, check=True, env=_env(), timeout=3600)
    return json.load(open(plan["out"]))


def busbw(op: str, nbytes: int, seconds: float, n: int) -> float:
    algbw = nbytes / seconds / 1e9
    if op == "allreduce":
        return algbw * 2 * (n - 1) / n
    if op == "allgather":
        return algbw * n * (n - 1) / n    # gathered size is n × per-rank bytes
    return algbw


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _pairs(impls):
    """The ratios the targets are stated in: horovod-py over every other implementation, and horovod-py through
    torch over every peer (numpy/torch shows the binding's own cost)."""
    ours = [i for i in impls if i.startswith("horovod-py")]
    pairs = [(ours[0], other) for other in impls if other != ours[0]]
    return pairs + [(o, p) for o in ours[1:] for p in impls if p not in ours]


def tables(results, np_):
    impls = list(results)
    pairs = _pairs(impls)
    lines = []
    for op in ["allreduce", "allgather", "broadcast"]:
        if not any(r["op"] == op for r in results[impls[0]]):
            continue
        lines.append(f"\n### {op}, float32, {np_} ranks: time per op and bus bandwidth (GB/s)\n")
        lines.append("| size | " + " | ".join(f"{i} time | {i} busbw" for i in impls) +
                     "".join(f" | busbw {a} / {b}" for a, b in pairs) + " |")
        lines.append("|" + "---|" * (1 + 2 * len(impls) + len(pairs)))
        rows = {i: [r for r in results[i] if r["op"] == op] for i in impls}
        for k, base in enumerate(rows[impls[0]]):
            cells = [human(base["bytes"])]
            bws = {}
            for i in impls:
                r = rows[i][k]
                bws[i] = busbw(op, r["bytes"], r["seconds"], np_)
                cells += [f"{r['seconds'] * 1e6:.0f} us", f"{bws[i]:.3f}"]
            cells += [f"{bws[a] / bws[b]:.2f}x" for a, b in pairs]
            lines.append("| " + " | ".join(cells) + " |")
    steps = {i: r["seconds"] for i in impls for r in results[i] if r["op"] == "step"}
    if len(steps) == len(impls):
        ours = [i for i in impls if i.startswith("horovod-py")]
        lines.append(f"\n### {workers.STEP_TENSORS} × {workers.STEP_BYTES // 1024} KiB allreduces, one step, "
                     f"{np_} ranks\n")
        lines.append("| implementation | step time | " + " | ".join(f"speed-up of {o}" for o in ours) + " |")
        lines.append("|---|---|" + "---|" * len(ours))
        for i in impls:
            lines.append(f"| {i} | {steps[i] * 1e3:.2f} ms | " +
                         " | ".join(f"{steps[i] / steps[o]:.2f}x" for o in ours) + " |")
    return "\n".join(lines)


def plot(results, np_, path) -> Optional[str]:
    """Bus bandwidth against size, one line per implementation, to ``path``; None, or why it was skipped (said)."""
    plt, why = plotting.pyplot()
    if plt is None:
        return plotting.say_skipped(path, why)
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl, rows in results.items():
        pts = [(r["bytes"], busbw("allreduce", r["bytes"], r["seconds"], np_)) for r in rows
               if r["op"] == "allreduce"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce bus bandwidth (GB/s)")
    ax.set_title(f"allreduce, float32, {np_} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


E2E_SCRIPT = os.path.join(HERE, "torch_ddp_vs_horovod.py")


def end_to_end(np_: int, echo: Optional[Callable[[str], None]] = None, timeout: float = 3600) -> str:
    """Run the end-to-end comparison (:data:`E2E_SCRIPT`), echoing each of its lines as it comes (on standard error
    by default: a round takes tens of seconds), and return its output for the report."""
    echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    echo(f"end to end: {os.path.basename(E2E_SCRIPT)} --np {np_} (three models, a few rounds each of horovod-py "
         f"and DDP: several minutes) ...")
    lines = []
    with subprocess.Popen([sys.executable, "-u", E2E_SCRIPT, "--np", str(np_)], env=_env(), stdout=subprocess.PIPE,
                          text=True) as proc:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            echo("  " + lines[-1])
        proc.wait(timeout=timeout)
    if proc.returncode != 0:
        echo(f"end to end: exited with status {proc.returncode}")
    return "\n".join(lines).strip()


def best_of(previous, rows):
    """Row by row, the faster of two runs of one implementation (rows match by op and size)."""
    if previous is None:
        return rows
    return [a if a["seconds"] <= b["seconds"] else b for a, b in zip(previous, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=0.5, help="timed seconds per size and implementation")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--no-e2e", action="store_true", help="skip the synthetic-benchmark comparison")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run every implementation this many times, alternating, and keep each row's fastest "
                             "time: a shared machine's slow phases then hit every implementation alike")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runners = {"horovod-py": run_horovod, "horovod-py-torch": run_horovod_torch, "torch-gloo": run_gloo}
    if mpi_available():
        runners["mpi4py-openmpi"] = run_mpi
    else:
        print("mpi4py/Open MPI not installed: skipping that peer (apt-get install openmpi-bin libopenmpi-dev; "
              "pip install mpi4py)", file=sys.stderr)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for impl, runner in runners.items():
                plan = {"impl": impl, "ops": args.ops.split(","), "max_bytes": args.max_mib << 20,
                        "seconds": args.seconds, "out": os.path.join(tmp, f"{impl}.json")}
                print(f"running {impl} (round {round_ + 1} of {args.rounds}) ...", file=sys.stderr, flush=True)
                results[impl] = best_of(results.get(impl), runner(plan, args.np))
    text = tables(results, args.np)
    e2e = None
    if not args.no_e2e and os.path.exists(E2E_SCRIPT):
        e2e = end_to_end(args.np)
        text += "\n\n### end to end: synthetic benchmark vs DistributedDataParallel\n\n```\n" + e2e + "\n```\n"
    print(text)
    with open(os.path.join(args.out, "suite.md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(args.out, "suite.json"), "w") as handle:
        json.dump({"np": args.np, "results": results, "e2e": e2e}, handle, indent=1)
    if plot(results, args.np, os.path.join(args.out, "busbw.png")) is None:
        print(f"plot: {os.path.join(args.out, 'busbw.png')}")


if __name__ == "__main__":
    main()
