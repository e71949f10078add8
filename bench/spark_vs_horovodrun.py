"""The same 2-rank allreduces under horovod.spark.run (ranks as Spark tasks) and under horovodrun, in one run.

    python bench/spark_vs_horovodrun.py [--np 2] [--max-mib 64] [--seconds 0.3] [--rounds 2] [--out DIR]

Both sides run bench/workers.py's horovod measurement (calibrated iteration counts, slowest rank's median per size);
the launchers alternate ``--rounds`` times and each row keeps its faster time, so the VM's slow phases hit both
alike. Start-up is timed from the launcher's start (the ``horovod.spark.run`` call; the ``horovodrun`` process) to
the end of the first allreduce; Spark's first job is reported apart (it starts the executors' Python workers). The
Spark cluster is ``local-cluster[<np>,1,1024]`` (a master and one executor JVM per rank), started once. Writes
``<out>/spark_vs_horovodrun.json`` and ``.md``.
"""

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import suite  # noqa: E402  (bench/ is a folder of scripts)
from ray_vs_horovodrun import best, horovodrun_startup  # noqa: E402


def first_allreduce() -> float:
    """On a Spark rank: init, one allreduce, the wall-clock time it ended."""
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    hvd.allreduce(np.ones(4, np.float32), name="first")
    return time.time()


def spark_measure(plan) -> None:
    """On a Spark rank: bench/workers.py's horovod measurement (rank 0 writes plan['out'])."""
    import workers
    workers.horovod(plan)


def spark_session(np_: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master(f"local-cluster[{np_},1,1024]").appName("spark-vs-horovodrun")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "ERROR").getOrCreate())
    tracker = session.sparkContext._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) < np_ + 1:
        time.sleep(0.2)
    return session


def spark_startup(np_: int) -> float:
    import horovod.spark
    started = time.time()
    return max(horovod.spark.run(first_allreduce, num_proc=np_, verbose=0)) - started


def table(results, startups, spark_first, spark_init, np_):
    lines = [f"#### allreduce, float32, {np_} ranks: horovod.spark.run vs horovodrun (time per op, bus bandwidth "
             "GB/s)", "", "| size | horovodrun time | horovodrun busbw | spark time | spark busbw | "
             "busbw spark / horovodrun |", "|---|---|---|---|---|---|"]
    by_size = {r["bytes"]: r for r in results["spark"]}
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
    lines.append(f"\nSpark's first horovod.spark.run (starts the executors' Python workers): {spark_first:.1f} s; "
                 f"the local Spark cluster itself (once, not per job): {spark_init:.1f} s")
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
    started = time.time()
    session = spark_session(args.np)
    spark_init = time.time() - started
    import horovod.spark
    rounds = {"horovodrun": [], "spark": []}
    startups = {"horovodrun": [], "spark": []}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            spark_first = spark_startup(args.np)
            for index in range(args.rounds):
                plan = {"impl": "horovod", "ops": ["allreduce"], "max_bytes": args.max_mib << 20,
                        "seconds": args.seconds}
                startups["horovodrun"].append(horovodrun_startup(args.np, tmp))
                rounds["horovodrun"].append(suite.run_horovod(dict(plan, out=os.path.join(tmp, f"h{index}.json")),
                                                              args.np))
                startups["spark"].append(spark_startup(args.np))
                out = os.path.join(tmp, f"s{index}.json")
                horovod.spark.run(spark_measure, args=(dict(plan, impl="spark", out=out),), num_proc=args.np,
                                  verbose=0)
                rounds["spark"].append(json.load(open(out)))
        finally:
            session.stop()
    results = {name: best(rows) for name, rows in rounds.items()}
    text = table(results, startups, spark_first, spark_init, args.np)
    print(text)
    with open(os.path.join(args.out, "spark_vs_horovodrun.json"), "w") as handle:
        json.dump({"np": args.np, "results": results, "startup_seconds": startups, "spark_first_seconds": spark_first,
                   "spark_init_seconds": spark_init}, handle, indent=1)
    with open(os.path.join(args.out, "spark_vs_horovodrun.md"), "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
