"""Asynchronous training against synchronous training: time to a target accuracy, per mode, in three conditions.

    python bench/async_training.py                       # everything (needs root for the namespace hosts)
    python bench/async_training.py --conditions local straggler --models digits

Each (condition, model) is one ``horovodrun`` job of ``examples/pytorch_async_digits.py --mode all``, which trains
every mode in turn (sync, localsgd, outer, stale, gossip) from the same initial weights and records rank 0's test
accuracy after every epoch against training wall-clock time (evaluation not counted). Conditions:

- ``local``: this machine as is, 2 ranks over loopback.
- ``straggler``: 3 ranks, rank 2 sleeps a random time (exponential, mean ``--delay-ms``) before each step.
- ``link``: two network-namespace hosts (:class:`horovod.testing.netns.NetnsCluster`), one rank each, whose link is
  limited with ``tc netem rate 100mbit delay 5ms`` on each host's interface (5 ms and 100 Mbit/s each way); where
  the kernel lacks netem, a token bucket (``tbf``) of 100 Mbit/s without the added delay.

Models: ``digits`` (the 8x8 CNN, 40 k parameters) and ``synthetic`` (an MLP with 1.3 M parameters on a synthetic
10-class task). It also measures whether a gossip pair waits for a non-partner: at 3 ranks, ranks 0 and 1 average
on their pair set while rank 2 is asleep, against the same exchanges with rank 2 awake.

Writes ``bench/figures/async-<condition>-<model>.png`` (accuracy against time), the raw records in
``bench/figures/async-results.json`` and prints the Markdown table for bench/RESULTS.md with the issue's targets.
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
sys.path.insert(0, ROOT)

from horovod.testing.netns import NetnsCluster, unavailable_reason  # noqa: E402
import plotting  # noqa: E402  (bench/ is a folder of scripts)

EXAMPLE = os.path.join(ROOT, "examples", "pytorch_async_digits.py")
FIGURES = os.path.join(HERE, "figures")
MODES = ("sync", "localsgd", "outer", "stale", "gossip")
EPOCHS = {"digits": 12, "synthetic": 4}
JOB_TIMEOUT = 1800


def _env(extra=None):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.update(extra or {})
    return env


def _example_args(model, record, extra=()):
    return [sys.executable, EXAMPLE, "--mode", "all", "--model", model, "--epochs", str(EPOCHS[model]),
            "--record", record, *extra]


def run_local(model, np_, record, extra=()):
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(np_), *_example_args(model, record, extra)]
    subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, timeout=JOB_TIMEOUT)
    return json.load(open(record))


def limit_link(cluster, rate: str, delay: str) -> bool:
    """Limit each host's interface (every packet leaving a host): netem with ``rate`` and ``delay`` where the
    kernel has it, else a token bucket of ``rate`` alone. Returns whether the delay was applied."""
    for host in cluster.hosts:
        base = ["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", host.iface, "root"]
        netem = subprocess.run(base + ["netem", "rate", rate, "delay", delay, "limit", "100000"],
                               capture_output=True, text=True)
        if netem.returncode != 0:
            subprocess.run(base + ["tbf", "rate", rate, "burst", "64kb", "latency", "100ms"], check=True)
    return netem.returncode == 0


def run_link(model, record, rate, delay):
    with NetnsCluster(2) as cluster:            # close() removes the namespaces, their qdiscs with them
        if not limit_link(cluster, rate, delay):
            print(f"tc netem is not available in this kernel: the link is limited to {rate} (tbf) with no added "
                  f"delay", flush=True)
        hosts = ",".join(f"{h.address}:1" for h in cluster.hosts)
        cmd = [sys.executable, "-m", "horovod.runner", "-np", "2", "-H", hosts, "-i", cluster.identity_file,
               *_example_args(model, record)]
        subprocess.run(cmd, check=True, env=_env(cluster.env()), cwd=ROOT, timeout=JOB_TIMEOUT)
    return json.load(open(record))


def pair_wait(exchanges: int = 40, sleep_s: float = 2.0):
    """Milliseconds per pair exchange of ranks 0-1 with rank 2 awake (in a barrier loop) and asleep."""
    from horovod.testing import spawn_ranks

    def fn(exchanges, sleep_s):
        import numpy as np

        import horovod.torch as hvd
        from horovod.runtime.async_policy import average_arrays
        from horovod.runtime.gossip import gossip_rounds
        hvd.init(process_sets="dynamic")
        pair = hvd.add_process_set(list(gossip_rounds(3)[0][0]))
        data, out = [np.ones(40_000, dtype=np.float32)], {}
        for phase in ("awake", "asleep"):
            hvd.barrier()
            if hvd.rank() == 2:
                if phase == "asleep":
                    time.sleep(sleep_s)
                continue
            started = time.perf_counter()
            for _ in range(exchanges):
                average_arrays(data, "pairwait", pair)()
            out[phase] = 1000 * (time.perf_counter() - started) / exchanges
        hvd.barrier()
        hvd.shutdown()
        return out
    return spawn_ranks(fn, 3, timeout=120, args=(exchanges, sleep_s))[0]


def plot(results, path, title):
    plt, why = plotting.pyplot()
    if plt is None:
        return plotting.say_skipped(path, why)
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        curve = results[mode]["curve"]
        ax.plot([0] + [c[0] for c in curve], [0] + [100 * c[1] for c in curve], marker=".", label=mode)
    ax.axhline(95, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training wall-clock time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(seconds):
    return "never" if seconds is None else f"{seconds:.1f}"


def table(record):
    lines = ["| condition | model | mode | time to 95 % (s) | vs sync | final accuracy (%) | vs sync (points) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for key, results in record.items():
        condition, model = key.split("/")
        sync = results["sync"]
        for mode in MODES:
            r = results[mode]
            ratio = "" if r["target_seconds"] is None or sync["target_seconds"] is None else \
                f"{r['target_seconds'] / sync['target_seconds']:.2f}x"
            lines.append(f"| {condition} | {model} | {mode} | {_fmt(r['target_seconds'])} | {ratio} | "
                         f"{100 * r['final']:.2f} | {100 * (r['final'] - sync['final']):+.2f} |")
    return "\n".join(lines)


def _best(results, modes):
    times = [(results[m]["target_seconds"], m) for m in modes if results[m]["target_seconds"] is not None]
    return min(times) if times else (None, None)


def targets(record):
    """The issue's three targets, each met or missed by how much."""
    lines = []
    for key, results in record.items():
        sync_t = results["sync"]["target_seconds"]
        condition = key.split("/")[0]
        if condition == "link":
            best, mode = _best(results, MODES[1:])
            goal = None if sync_t is None else 0.5 * sync_t
            met = best is not None and goal is not None and best <= goal
            miss = None if best is None or goal is None else best - goal
            lines.append(f"- {key}: best asynchronous mode ({mode}) {_fmt(best)} s to 95 % vs sync {_fmt(sync_t)} s;"
                         f" target <= {_fmt(goal)} s: " + ("met" if met else f"missed by {_fmt(miss)} s"))
        if condition == "straggler":
            best, mode = _best(results, ("gossip", "localsgd"))
            met = best is not None and sync_t is not None and best < sync_t
            miss = None if best is None or sync_t is None else best - sync_t
            lines.append(f"- {key}: {mode} {_fmt(best)} s to 95 % vs sync {_fmt(sync_t)} s: "
                         + ("met" if met else f"missed by {_fmt(miss)} s"))
        worst = min(MODES[1:], key=lambda m: results[m]["final"])
        gap = 100 * (results["sync"]["final"] - results[worst]["final"])
        lines.append(f"- {key}: lowest final accuracy {worst} {100 * results[worst]['final']:.2f} % vs sync "
                     f"{100 * results['sync']['final']:.2f} %: " + ("within 1 point" if gap <= 1.0 else
                                                                     f"missed by {gap - 1.0:.2f} points"))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", nargs="+", default=["local", "straggler", "link"])
    parser.add_argument("--models", nargs="+", default=["digits", "synthetic"])
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--delay", default="5ms")
    args = parser.parse_args()
    os.makedirs(FIGURES, exist_ok=True)
    out_path = os.path.join(FIGURES, "async-results.json")
    record = json.load(open(out_path)) if os.path.exists(out_path) else {}
    with tempfile.TemporaryDirectory() as tmp:
        for condition in args.conditions:
            if condition == "link" and unavailable_reason():
                print(f"skipping link: {unavailable_reason()}", flush=True)
                continue
            for model in args.models:
                path = os.path.join(tmp, f"{condition}-{model}.json")
                if condition == "local":
                    results = run_local(model, 2, path)
                elif condition == "straggler":
                    results = run_local(model, 3, path, ["--delay-rank", "2", "--delay-ms", str(args.delay_ms)])
                else:
                    results = run_link(model, path, args.rate, args.delay)
                record[f"{condition}/{model}"] = results
                json.dump(record, open(out_path, "w"), indent=1)
                plot(results, os.path.join(FIGURES, f"async-{condition}-{model}.png"), f"{condition}, {model}")
    record["pair_wait_ms"] = pair_wait()
    json.dump(record, open(out_path, "w"), indent=1)
    runs = {k: v for k, v in record.items() if "/" in k}
    print(table(runs))
    print(targets(runs))
    print(f"pair exchange (160 kB) at 3 ranks: {record['pair_wait_ms']}")


if __name__ == "__main__":
    main()
