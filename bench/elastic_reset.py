"""An elastic reset measured beside the simulation's prediction of it (one machine).

    python bench/elastic_reset.py [--np 4,8,16] [--repeats 3] [--calibrated bench/figures/scale-control.json]

For each np, ``--repeats`` times: ``horovodrun -np N --min-np N-1`` over N loopback addresses (``127.0.0.K:1``, one
slot each, all on this machine's cores) runs a numpy elastic loop (``hvd.elastic.run``, an ``ObjectState`` committed
every step, one blocking 4 B allreduce per step). Once every rank has stepped, this script SIGKILLs rank ``N // 2
+ 1``'s process; the figure is from the kill until the last survivor completed its first step in the new round of
N - 1 workers (detection, the driver's round, the new mesh, the state's sync and the first allreduce). Each rank
stamps its steps with the wall clock of this machine.

Beside it, the simulation's reset for the same job (``horovod.tools.simulate.elastic.reset_seconds``: N ranks on one
host of this machine's cores, with the costs fitted to ``--calibrated``'s np 2 and 4), without and with the one cost
that benchmark cannot show: each survivor starting its engine again in its process, fitted to the first np's reset
here. Every process a run starts is ended by its process group before the next.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _worker(out: str) -> None:
    import numpy as np

    import horovod.numpy as hvd
    from horovod import elastic
    hvd.init()
    state = elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)
    stamps = open(os.path.join(out, f"stamps.{os.getpid()}"), "a", buffering=1)

    @elastic.run
    def train(state):
        while state.step < 100000:
            hvd.allreduce(np.ones(1, np.float32), name="step")
            state.step += 1
            stamps.write(f"{time.time()} {hvd.size()} {hvd.rank()} {state.step}\n")
            state.commit()
            if os.path.exists(os.path.join(out, "stop")):
                return
            time.sleep(0.01)
    train(state)


def _stamps(out: str):
    """pid -> [(time, size, rank, step)]."""
    rows = {}
    for path in glob.glob(os.path.join(out, "stamps.*")):
        with open(path) as handle:
            rows[int(path.rsplit(".", 1)[1])] = [tuple(float(x) for x in line.split()) for line in handle
                                                if line.endswith("\n") and len(line.split()) == 4]
    return rows


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.02)


def run_one(n: int, timeout: float) -> float:
    """Seconds from the kill to the last survivor's first step in the round of ``n - 1``."""
    out = tempfile.mkdtemp(prefix="elastic-reset-")
    hosts = ",".join(f"127.0.0.{k + 1}:1" for k in range(n))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", str(n), "--min-np", str(n - 1),
                             "--max-np", str(n), "-H", hosts, sys.executable, os.path.abspath(__file__), "--worker",
                             out], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        victim = n // 2 + 1 if n > 2 else n - 1

        def every_rank_stepped():      # rank -> pid, once each of the n ranks took 20 steps
            rows = _stamps(out)
            if len(rows) < n or any(len(r) < 20 for r in rows.values()):
                return None
            return {int(r[-1][2]): pid for pid, r in rows.items()}
        pids = _wait(every_rank_stepped, timeout, "20 steps on every rank")
        killed = time.time()
        os.kill(pids[victim], signal.SIGKILL)
        survivors = [pid for pid in pids.values() if pid != pids[victim]]

        def first_new_steps():
            rows = _stamps(out)
            firsts = [next((t for t, size, _, _ in rows.get(pid, []) if size == n - 1 and t > killed), None)
                      for pid in survivors]
            return firsts if all(firsts) else None
        reset = max(_wait(first_new_steps, timeout, "step in the new round")) - killed
        open(os.path.join(out, "stop"), "w").close()
        proc.communicate(timeout=60)
        return reset
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for path in glob.glob(os.path.join(out, "*")):
            os.unlink(path)
        os.rmdir(out)


def predicted(n: int, costs, reinit: float = 0.0) -> float:
    """The simulation's reset of ``n`` ranks on one host of this machine's cores (``reinit``: a survivor's CPU to
    start its engine again)."""
    from horovod.tools.simulate.elastic import reset_seconds
    return reset_seconds(n, slots=n, cores=os.cpu_count() or 1, cpu=costs.cpu, link=costs.link,
                         startup=costs.startup, state_bytes=64, reinit=reinit)["reset_s"]


def fit_reinit(n: int, measured: float, costs) -> float:
    """The re-initialisation's CPU per survivor at which the simulated reset of ``n`` ranks meets ``measured``."""
    from horovod.tools.simulate.calibration import solve
    return solve(lambda x: predicted(n, costs, x), measured, 1e-6, 1.0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="4,8,16", help="world sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--calibrated", default=os.path.join(HERE, "figures", "scale-control.json"))
    args = parser.parse_args(argv)
    from horovod.tools.simulate import calibration
    with open(args.calibrated) as handle:
        costs = calibration.fit_saved(json.load(handle))
    measured = {}
    for n in [int(x) for x in args.np.split(",")]:
        runs = []
        for repeat in range(args.repeats):
            runs.append(run_one(n, args.timeout))
            print(f"[np {n}] run {repeat + 1}/{args.repeats}: {runs[-1] * 1e3:.0f} ms", file=sys.stderr, flush=True)
        measured[n] = runs
    first = min(measured)
    reinit = fit_reinit(first, statistics.median(measured[first]), costs)
    print(f"a survivor's engine started again: {reinit * 1e3:.2f} ms of CPU (fitted to np {first})", file=sys.stderr)
    print("| np | reset measured, ms (median; runs) | predicted without the re-init, ms (error) | "
          "with it, ms (error) |\n|---|---|---|---|")
    for n, runs in measured.items():
        median = statistics.median(runs)
        bare, whole = predicted(n, costs), predicted(n, costs, reinit)
        print(f"| {n} | {median * 1e3:,.0f} ({', '.join(f'{r * 1e3:,.0f}' for r in runs)}) | {bare * 1e3:,.0f} "
              f"({bare / median - 1:+.0%}) | {whole * 1e3:,.0f} ({whole / median - 1:+.0%}"
              f"{' fitted' if n == first else ''}) |", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        sys.exit(main())
