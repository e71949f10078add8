"""The same 2-worker allreduces under Ray actors (horovod.ray.RayExecutor) and under horovodrun, in one run.

    python bench/ray_vs_horovodrun.py [--np 2] [--max-mib 64] [--seconds 0.3] [--rounds 2] [--out DIR]

Both sides run bench/workers.py's horovod measurement (calibrated iteration counts, slowest rank's median per size)
on a local machine; with ``--rounds 2`` the two launchers alternate twice and each row keeps its faster time, so the
VM's slow phases hit both alike. Start-up is timed from the launcher's start (``RayExecutor.start()``; the
``horovodrun`` process) to the end of the first allreduce, on an already running Ray (``ray.init`` reported apart:
a cluster is started once, not per job). Writes ``<out>/ray_vs_horovodrun.json`` and ``.md``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import suite  # noqa: E402  (bench/ is a folder of scripts)

FIRST = """
import sys, time
import numpy as np
import horovod.numpy as hvd
hvd.init()
hvd.allreduce(np.ones(4, np.float32), name="first")
if hvd.rank() == 0:
    open(sys.argv[1], "w").write(repr(time.time()))
hvd.shutdown()
"""


def first_allreduce() -> float:
    """In a Ray worker: init, one allreduce, the wall-clock time it ended."""
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    hvd.allreduce(np.ones(4, np.float32), name="first")
    return time.time()


def ray_measure(plan):
    """In a Ray worker: bench/workers.py's horovod measurement (rank 0 writes plan['out'])."""
    import workers
    workers.horovod(plan)


def horovodrun_startup(np_: int, tmp: str) -> float:
    script, stamp = os.path.join(tmp, "first.py"), os.path.join(tmp, "first.stamp")
    with open(script, "w") as handle:
        handle.write(FIRST)
    started = time.time()
    subprocess.run([sys.executable, "-m", "horovod.runner", "-np", str(np_), sys.executable, script, stamp],
                   check=True, env=suite._env(), timeout=300)
    return float(open(stamp).read()) - started


def ray_round(np_: int, plan):
    from horovod.ray import RayExecutor
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=np_)
    started = time.time()
    executor.start()
    try:
        startup = max(executor.run(first_allreduce)) - started
        executor.run(ray_measure, args=[plan])
    finally:
        executor.shutdown()
    return startup, json.load(open(plan["out"]))


def best(rows_by_round):
    """Per (op, bytes) the fastest of the rounds."""
    keep = {}
    for rows in rows_by_round:
        for r in rows:
            key = (r["op"], r["bytes"])
            if key not in keep or r["seconds"] < keep[key]["seconds"]:
                keep[key] = r
    return [keep[k] for k in sorted(keep)]


def table(results, startups, ray_init, np_):
    lines = [f"#### allreduce, float32, {np_} workers: Ray actors vs horovodrun (time per op, bus bandwidth GB/s)",
             "", "| size | horovodrun time | horovodrun busbw | ray time | ray busbw | busbw ray / horovodrun |",
             "|---|---|---|---|---|---|"]
    by_size = {r["bytes"]: r for r in results["ray"]}
    for r in results["horovodrun"]:
        other = by_size.get(r["bytes"])
        if other is None:
            continue
        a, b = (suite.busbw("allreduce", r["bytes"], x["seconds"], np_) for x in (r, other))
        lines.append(f"| {suite.human(r['bytes'])} | {r['seconds'] * 1e6:.0f} us | {a:.3f} | "
                     f"{other['seconds'] * 1e6:.0f} us | {b:.3f} | {b / a:.2f}x |")
    lines += ["", "#### start-up: launcher start to the end of the first allreduce (each round)", "",
              "| launcher | rounds (s) | best (s) |", "|---|---|---|"]
    for name, values in startups.items():
        lines.append(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} | {min(values):.2f} |")
    lines.append(f"\nray.init of the local cluster (once, not per job): {ray_init:.1f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")])  # for Ray's workers
    import ray
    started = time.time()
    ray.init(num_cpus=args.np, include_dashboard=False, object_store_memory=100 * 1024 * 1024)
    ray_init = time.time() - started
    rounds = {"horovodrun": [], "ray": []}
    startups = {"horovodrun": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for index in range(args.rounds):
                plan = {"impl": "horovod", "ops": ["allreduce"], "max_bytes": args.max_mib << 20,
                        "seconds": args.seconds}
                startups["horovodrun"].append(horovodrun_startup(args.np, tmp))
                rounds["horovodrun"].append(suite.run_horovod(dict(plan, out=os.path.join(tmp, f"h{index}.json")),
                                                              args.np))
                startup, rows = ray_round(args.np, dict(plan, impl="ray", out=os.path.join(tmp, f"r{index}.json")))
                startups["ray"].append(startup)
                rounds["ray"].append(rows)
        finally:
            ray.shutdown()
    results = {name: best(rows) for name, rows in rounds.items()}
    text = table(results, startups, ray_init, args.np)
    print(text)
    with open(os.path.join(args.out, "ray_vs_horovodrun.json"), "w") as handle:
        json.dump({"np": args.np, "results": results, "startup_seconds": startups, "ray_init_seconds": ray_init},
                  handle, indent=1)
    with open(os.path.join(args.out, "ray_vs_horovodrun.md"), "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
