"""Across hosts: horovod-py beside torch.distributed (Gloo) and Open MPI (TCP) on network-namespace test hosts.

    python bench/crosshost.py [--layouts 2x1,3x1,2x2] [--rounds 2] [--seconds 0.3] [--max-mib 64]
                              [--rate 10gbit] [--ops allreduce,allgather,broadcast] [--out bench/results/crosshost]
    python bench/crosshost.py --render bench/results/crosshost/crosshost.json   # tables and plots again

Each layout ``HxR`` is H namespace hosts (:class:`horovod.testing.netns.NetnsCluster`: veth links to one bridge, a real
sshd each) with R ranks per host. In one run, per layout: the link's own limit (one plain TCP stream between two
hosts, ``bench/link_stream.py``, best of three; also both directions at once), then every implementation ``--rounds``
times, alternating, each row keeping its fastest time:

- ``horovod-py``: ``horovodrun -H a:R,b:R`` over ssh into the hosts (``horovod-py-hier`` adds
  ``--hierarchical-allreduce`` when R > 1);
- ``torch-gloo``: each rank started inside its host's namespace (``ip netns exec``), ``GLOO_SOCKET_IFNAME`` its
  host's interface;
- ``openmpi``: ``mpirun`` over ssh into the same hosts, mpi4py, ``pml ob1`` with the ``tcp`` BTL (also between the
  ranks of one host: namespace hosts share ``/dev/shm`` and the host name, and the shared-memory BTL crashed there).

``--rate`` limits every host's link with a token bucket (``tc qdisc ... tbf``) on both ends of its veth.
horovod-py also runs a "model step" (4.2 M float32 parameters in 24 tensors, one synchronous step, no compute),
which ``python -m horovod.tools.scaling --check`` predicts. Writes
``<out>/crosshost.json``, ``<out>/crosshost.md`` and ``<out>/crosshost-<layout>.png``. Needs root (namespaces). Bus
bandwidth as in bench/suite.py. A benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import plotting  # noqa: E402  (bench/ is a folder of scripts)
from suite import busbw, human  # noqa: E402
from horovod.testing.netns import NetnsCluster, unavailable_reason  # noqa: E402

SIZES = [4, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
STREAM_BYTES = 1 << 30
JOB_TIMEOUT = 1800


def _env(extra=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]), OMP_NUM_THREADS="1")
    env.update(extra or {})
    return env


def _ns(host, *argv):
    return ["ip", "netns", "exec", host.netns, *argv]


def limit_links(cluster, rate: str) -> None:
    """A token bucket of ``rate`` on both ends of every host's veth."""
    for host in cluster.hosts:
        for argv in (["tc", "qdisc", "replace", "dev", host.root_veth],
                     _ns(host, "tc", "qdisc", "replace", "dev", host.iface)):
            subprocess.run(argv + ["root", "tbf", "rate", rate, "burst", "1mb", "latency", "50ms"], check=True)


def _stream(cluster, src, dst, port, nbytes):
    recv = subprocess.Popen(_ns(dst, sys.executable, os.path.join(HERE, "link_stream.py"), "recv", str(port)),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        send = subprocess.Popen(_ns(src, sys.executable, os.path.join(HERE, "link_stream.py"), "send", dst.address,
                                    str(port), str(nbytes)))
        return recv, send
    except BaseException:
        recv.kill()
        raise


def ceiling(cluster, nbytes: int, tries: int = 3):
    """GB/s of one stream host 0 -> host 1 (best of ``tries``), and per direction with both directions at once."""
    a, b = cluster.hosts[0], cluster.hosts[1]
    one_way, both = 0.0, 0.0
    for _ in range(tries):
        pairs = [_stream(cluster, a, b, 47001, nbytes)]
        pairs[0][1].wait(timeout=600)
        got, secs = pairs[0][0].communicate(timeout=60)[0].split()
        one_way = max(one_way, int(got) / float(secs) / 1e9)
        pairs = [_stream(cluster, a, b, 47002, nbytes), _stream(cluster, b, a, 47003, nbytes)]
        rates = []
        for recv, send in pairs:
            send.wait(timeout=600)
            got, secs = recv.communicate(timeout=60)[0].split()
            rates.append(int(got) / float(secs) / 1e9)
        both = max(both, min(rates))
    return one_way, both


def run_horovod(cluster, per_host, plan, hierarchical=False):
    hosts = ",".join(f"{h.address}:{per_host}" for h in cluster.hosts)
    cmd = [sys.executable, "-m", "horovod.runner", "-np", str(per_host * len(cluster.hosts)), "-H", hosts,
           "-i", cluster.identity_file, *(["--hierarchical-allreduce"] if hierarchical else []),
           sys.executable, os.path.join(HERE, "workers.py"), "horovod", json.dumps(plan)]
    subprocess.run(cmd, check=True, env=_env(cluster.env()), cwd=ROOT, timeout=JOB_TIMEOUT,
                   stdout=subprocess.DEVNULL)
    return json.load(open(plan["out"]))


def run_gloo(cluster, per_host, plan):
    size = per_host * len(cluster.hosts)
    master = cluster.hosts[0]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    try:
        for rank in range(size):
            host = cluster.hosts[rank // per_host]
            procs.append(subprocess.Popen(
                _ns(host, "env", f"GLOO_SOCKET_IFNAME={host.iface}", sys.executable,
                    os.path.join(HERE, "workers.py"), "gloo", json.dumps(plan), str(rank), str(size),
                    master.address, str(port)), env=_env(), cwd=ROOT))
        for proc in procs:
            if proc.wait(timeout=JOB_TIMEOUT) != 0:
                raise RuntimeError(f"a Gloo rank exited with {proc.returncode}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return json.load(open(plan["out"]))


def run_mpi(cluster, per_host, plan):
    hosts = ",".join(f"{h.address}:{per_host}" for h in cluster.hosts)
    subnet = f"{cluster.subnet}.0/24"
    cmd = ["mpirun", "--allow-run-as-root", "-np", str(per_host * len(cluster.hosts)), "-H", hosts,
           "--mca", "plm_rsh_args", f"{cluster.ssh_args} -i {cluster.identity_file}",
           "--mca", "plm_rsh_no_tree_spawn", "1",
           "--mca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
           # TCP between every pair: namespace hosts share /dev/shm and the host name, and Open MPI's shared-memory
           # BTL (vader) crashed there (SIGSEGV in mca_btl_vader_poll_handle_frag) with two ranks per host
           "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           sys.executable, os.path.join(HERE, "workers.py"), "mpi", json.dumps(plan)]
    subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, timeout=JOB_TIMEOUT, stdout=subprocess.DEVNULL)
    return json.load(open(plan["out"]))


def best_of(previous, rows):
    if previous is None:
        return rows
    return [a if a["seconds"] <= b["seconds"] else b for a, b in zip(previous, rows)]


def _ops_for(impl, args):
    ops = args.ops.split(",")
    return ops + (["model"] if impl.startswith("horovod-py") and args.model_step else [])


def run_layout(layout, args, tmp):
    """Every implementation on one layout, alternating; returns the layout's record."""
    hosts, per_host = (int(x) for x in layout.split("x"))
    runners = {"horovod-py": lambda c, p: run_horovod(c, per_host, p)}
    if per_host > 1:
        runners["horovod-py-hier"] = lambda c, p: run_horovod(c, per_host, p, hierarchical=True)
    runners["torch-gloo"] = lambda c, p: run_gloo(c, per_host, p)
    runners["openmpi"] = lambda c, p: run_mpi(c, per_host, p)
    if args.impls:
        runners = {k: v for k, v in runners.items() if k in args.impls.split(",")}
    record = {"layout": layout, "ranks": hosts * per_host, "rate": args.rate, "results": {}, "rounds": {},
              "machine_cores": os.cpu_count()}     # every namespace host runs on this machine's cores
    with NetnsCluster(hosts) as cluster:
        if args.rate:
            limit_links(cluster, args.rate)
        record["ceiling_gbs"], record["ceiling_both_gbs"] = ceiling(cluster, args.stream_bytes)
        print(f"[{layout}] link: {record['ceiling_gbs']:.3f} GB/s one way, {record['ceiling_both_gbs']:.3f} GB/s "
              f"each way with both at once", file=sys.stderr, flush=True)
        for round_ in range(args.rounds):
            for impl, runner in runners.items():
                plan = {"impl": impl, "ops": _ops_for(impl, args), "max_bytes": args.max_mib << 20,
                        "sizes": SIZES, "seconds": args.seconds, "out": os.path.join(tmp, f"{layout}-{impl}.json")}
                print(f"[{layout}] {impl}, round {round_ + 1} of {args.rounds}", file=sys.stderr, flush=True)
                started = time.monotonic()
                try:
                    rows = runner(cluster, plan)
                except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
                    print(f"[{layout}] {impl} failed, left out of this round: {exc}", file=sys.stderr, flush=True)
                    record.setdefault("failures", []).append(f"{impl} round {round_ + 1}: {exc}")
                    continue
                record["rounds"].setdefault(impl, []).append(rows)
                record["results"][impl] = best_of(record["results"].get(impl), rows)
                print(f"[{layout}] {impl}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return record


def table(record, op):
    impls = list(record["results"])
    n, ceil = record["ranks"], record["ceiling_gbs"]
    ours = impls[:2] if "horovod-py-hier" in impls else impls[:1]
    peers = [i for i in impls if i not in ours]
    both = record.get("ceiling_both_gbs") or ceil
    head = ["size"] + [f"{i} time / busbw" for i in impls] + [f"{o} / {p}" for o in ours for p in peers] + \
        [f"{o} / link" for o in ours] + [f"{o} / link both ways" for o in ours]
    lines = [f"\n#### {op}, float32, {record['layout']} ({n} ranks), link {ceil:.2f} GB/s one way, {both:.2f} GB/s "
             f"each way with both at once"
             f"{' (' + record['rate'] + ')' if record['rate'] else ''}: best time per op, bus bandwidth (GB/s)\n",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = {i: [r for r in record["results"][i] if r["op"] == op] for i in impls}
    for k, base in enumerate(rows[impls[0]]):
        bws = {i: busbw(op, rows[i][k]["bytes"], rows[i][k]["seconds"], n) for i in impls}
        cells = [human(base["bytes"])] + [f"{rows[i][k]['seconds'] * 1e6:.0f} us / {bws[i]:.3f}" for i in impls]
        cells += [f"{bws[o] / bws[p]:.2f}x" for o in ours for p in peers]
        cells += [f"{bws[o] / ceil:.0%}" for o in ours] + [f"{bws[o] / both:.0%}" for o in ours]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(record, path) -> Optional[str]:
    plt, why = plotting.pyplot()
    if plt is None:
        return plotting.say_skipped(path, why)
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl, rows in record["results"].items():
        pts = [(r["bytes"], busbw("allreduce", r["bytes"], r["seconds"], record["ranks"])) for r in rows
               if r["op"] == "allreduce"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    ax.axhline(record["ceiling_gbs"], color="grey", linestyle="--", label="link (one TCP stream)")
    if record.get("ceiling_both_gbs"):
        ax.axhline(record["ceiling_both_gbs"], color="grey", linestyle=":", label="link, each way with both at once")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce bus bandwidth (GB/s)")
    ax.set_title(f"allreduce across namespace hosts, {record['layout']} (hosts x ranks)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="2x1,3x1,2x2", help="comma-separated HOSTSxRANKS_PER_HOST")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.3, help="timed seconds per size and implementation")
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--ops", default="allreduce,allgather,broadcast")
    parser.add_argument("--impls", default="", help="only these implementations (comma-separated names)")
    parser.add_argument("--rate", default="", help="limit every link, e.g. 10gbit or 1gbit (tc tbf)")
    parser.add_argument("--stream-bytes", type=int, default=STREAM_BYTES)
    parser.add_argument("--no-model-step", dest="model_step", action="store_false",
                        help="skip horovod-py's model step (what the scaling planner is checked against)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "crosshost"))
    parser.add_argument("--render", help="only write the tables and plots of this crosshost.json (no runs)")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as handle:
            report(json.load(handle), args.ops.split(","), args.out)
        return
    reason = unavailable_reason()
    if reason:
        sys.exit(f"namespace hosts unavailable: {reason}")
    os.makedirs(args.out, exist_ok=True)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.layouts.split(","):
            records.append(run_layout(layout, args, tmp))
            with open(os.path.join(args.out, "crosshost.json"), "w") as handle:
                json.dump(records, handle, indent=1)
    report(records, args.ops.split(","), args.out)


def report(records, ops, out) -> None:
    """Tables (printed, and ``<out>/crosshost.md``) and plots of the records."""
    text = "\n".join(table(r, op) for r in records for op in ops)
    text += "\n\n#### model step (4.2 M float32 parameters in 24 tensors, no compute), best time\n\n"
    text += "| layout | horovod-py | horovod-py-hier |\n|---|---|---|\n"
    for r in records:
        steps = [f"{row['seconds'] * 1e3:.1f} ms" for impl, rows in r["results"].items()
                 if impl.startswith("horovod-py") for row in rows if row["op"] == "model"]
        text += f"| {r['layout']} | " + " | ".join(steps) + " |\n"
    print(text)
    with open(os.path.join(out, "crosshost.md"), "w") as handle:
        handle.write(text + "\n")
    for record in records:
        plot(record, os.path.join(out, f"crosshost-{record['layout']}.png"))

if __name__ == "__main__":
    main()
