"""A scaling planner: predicted step time and scaling efficiency of data-parallel training at 2-4,096 workers.

    python -m horovod.tools.scaling --params 44.5e6 --compute-ms 490 [--link-gbit 25] [--per-host 4]
                                    [--fit bench/results/crosshost/crosshost.json] [--overlap 0.5]
    python -m horovod.tools.scaling --published        # ResNet-101, Inception V3, VGG-16 beside Horovod's figures
    python -m horovod.tools.scaling --check bench/results/crosshost/crosshost.json   # against measured steps

The model. A ring allreduce of ``B`` bytes over ``n`` workers costs ``c + 2(n-1) a + 2(n-1)/n B / (e L)``: a fixed
cost ``c`` per operation (negotiation, Python), a latency ``a`` per dependent step, and the link's bandwidth ``L``
used at efficiency ``e``. With ``k`` workers per host (hierarchical), the ring runs over ``n/k`` hosts and each host
adds a local reduce and broadcast at ``--local-gbyte-s``. Gradients (4 bytes a parameter, fused into buffers of the
fusion threshold) are reduced while the backward pass runs, so a step takes ``T + max(C1, C - o T)``: ``T`` the
compute time, ``C`` the communication, ``o`` the fraction of the compute it can hide behind (``--overlap``), and ``C1``
the last fusion buffer's allreduce, which starts only when the backward pass ends and is never hidden. Scaling
efficiency is ``T`` over the step time.

The control plane. Before the last buffer's allreduce, the ranks agree on it in a negotiation cycle. ``c`` holds
that cycle's cost at the few hosts the fit sees; what grows with the world size beyond them is added to ``C1``:
:func:`cycle_seconds` of the protocol the engine picks at ``n`` ranks (peer to peer up to 4, a star up to 16, a
3-ary tree above) less its cost at 2 ranks. Its constants are those of the control-plane simulation
(:mod:`horovod.tools.simulate`, whose figures the tests hold this closed form to): a hop is a frame's flight and both
ends' handling (a rank with a core of its own polls for it: no wake-up); the star's rank 0 handles ``2(n-1)`` frames
in a row.

Start-up. From the launch to the first allreduce's result: the launcher's start, another host reached over ssh, a
host's ranks spawned one after another and booting (the interpreter and imports) on its cores, the rendezvous server
taking each rank's record (and, up to 16 ranks, answering each with every record; past that rank 0 gets them and the
tree hands them down, a level at a time), then the first negotiation cycle. :func:`startup_seconds` adds these up;
its constants are the simulation's (:mod:`horovod.tools.simulate.startup`, fitted to this machine by
:mod:`horovod.tools.simulate.calibration`), and the tests hold it to the simulated start-up within 25 %.

``--fit`` (repeatable) takes a synthetic benchmark's JSON (``examples/pytorch_synthetic_benchmark.py --json``), from
which it fits the packing rate and the overlap (:mod:`horovod.tools.planner_fit`), or the cross-host benchmark's JSON
(``bench/crosshost.py``), from which it fits ``c``, ``a`` and ``e`` to
horovod-py's allreduce times of every flat layout by non-negative least squares on relative errors (one bandwidth
for the machine; ``e`` is it over the mean measured link ceiling). Namespace hosts share one machine's cores (the
benchmark records ``machine_cores``), and on them the link is the kernel copying bytes, so with more ranks than cores
every term slows by the ranks' share of a core; the fit divides that out, giving constants for ranks with a core
each, as on a real cluster. Packing gradients into the fusion buffer and back costs ``2 B`` at ``copy_bytes_s``.
``--check`` fits the same way and predicts the benchmark's model step (4.2 M parameters, no compute) on each layout,
with that layout's share of a core and the packing rate measured on this machine, beside the measured time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.core.bootstrap import DIRECT_RECORDS_MAX_RANKS
from horovod.core.negotiation import PEER_NEGOTIATION_MAX_RANKS, STAR_NEGOTIATION_MAX_RANKS
from horovod.core.negotiation.tree import ARITY
from horovod.tools.planner_fit import Sources, fit_files, measure_copy_bytes_s
from horovod.tools.planner_notes import assumptions, explain
from horovod.tools.simulate.startup import StartupModel as SimStartup

__all__ = ["LinkModel", "ControlModel", "StartupTerm", "Workload", "startup_seconds", "PUBLISHED", "allreduce_seconds", "cycle_seconds",
           "step_seconds", "fit", "predict_table", "published_table", "check", "main"]

MODEL_TENSORS = [1 << k for k in range(10, 22)] + [256] * 12     # bench/workers.py's model step
MODEL_STEP_PARAMS = sum(MODEL_TENSORS)


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """The communication model's constants (see the module docstring)."""

    fixed_s: float = 1e-3          # c: per allreduce operation
    hop_s: float = 20e-6           # a: per dependent ring step
    efficiency: float = 0.9        # e: fraction of the link's bandwidth a ring reaches
    link_bytes_s: float = 25e9 / 8
    local_bytes_s: float = 10e9    # within a host (hierarchical)
    copy_bytes_s: float = 5e9      # packing gradients into the fusion buffer and back
    fusion_bytes: int = 64 << 20   # gradients travel in buffers of at most this size


@dataclasses.dataclass(frozen=True)
class ControlModel:
    """The negotiation's constants (see the module docstring), by default the control-plane simulation's."""

    hop_s: float = 80e-6           # one frame between two ranks: the link and both ends' work
    frame_s: float = 15e-6         # one more frame handled by the same rank in the same cycle
    fixed_s: float = 70e-6         # a cycle's bookkeeping and the caller's wake-up to take its result
    arity: int = ARITY                              # the tree's children per rank
    peer_max: int = PEER_NEGOTIATION_MAX_RANKS      # the largest job negotiating peer to peer (auto), then a star
    star_max: int = STAR_NEGOTIATION_MAX_RANKS      # ... then the tree

    @classmethod
    def simulated(cls) -> "ControlModel":
        """The constants from the simulation's CPU and link models: a frame across hosts, to a rank with a core of its
        own, which polls for it instead of sleeping (no wake-up on the way)."""
        from horovod.tools.simulate.world import CpuModel, LinkModel as SimLink
        cpu, link = CpuModel(), SimLink()
        return cls(hop_s=link.remote_latency + 2 * cpu.frame, frame_s=cpu.frame, fixed_s=cpu.cycle + cpu.wake)


@dataclasses.dataclass(frozen=True)
class StartupTerm:
    """Start-up's constants (see the module docstring), by default the simulation's start-up model's."""

    launch_s: float = SimStartup.launch             # the launcher's own start
    remote_s: float = SimStartup.remote             # reaching the other hosts (in parallel)
    spawn_s: float = SimStartup.spawn               # between two ranks a host starts
    boot_s: float = SimStartup.boot                 # a rank's CPU until init
    request_s: float = SimStartup.request           # the rendezvous server's CPU per request
    answer_byte_s: float = 1.0 / SimStartup.serve_bandwidth    # per byte of records written or relayed
    record_bytes: int = SimStartup.record           # one rank's record
    direct_max: int = DIRECT_RECORDS_MAX_RANKS      # the largest job whose every rank asks the server for the records

    @classmethod
    def simulated(cls) -> "StartupTerm":
        """The simulation's start-up constants (:mod:`horovod.tools.simulate.startup`): the defaults."""
        return cls()


def startup_seconds(term: StartupTerm, control: ControlModel, workers: int, per_host: int = 1,
                    cores: int = 1) -> float:
    """From the launch to the first result at ``workers`` ranks, ``per_host`` to a host of ``cores`` cores."""
    hosts = max(1, math.ceil(workers / max(1, per_host)))
    local = min(workers, per_host)
    spawned = term.launch_s + (term.remote_s if hosts > 1 else 0.0) + local * term.spawn_s
    booted = spawned + term.boot_s * math.ceil(local / max(1, cores))
    records = workers * term.record_bytes * term.answer_byte_s
    if workers <= term.direct_max:      # every rank registers and asks; the server answers each
        served = workers * (3 * term.request_s + records)
    else:                               # every rank registers, rank 0 asks; the tree hands the records down
        depth, reach = 0, 1
        while reach < workers:
            depth, reach = depth + 1, reach * control.arity + 1
        served = (workers + 2) * term.request_s + records + \
            depth * (control.hop_s + control.arity * (control.frame_s + records))
    return booted + served + cycle_seconds(control, workers)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model: parameters (float32 gradients), compute time per step, and the share of it communication can hide."""

    name: str
    params: float
    compute_s: float
    overlap: float = 0.5


# Horovod's published scaling at 512 GPUs (128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE; docs/benchmarks):
# ResNet-101 and Inception V3 about 90 %, VGG-16 about 68 %. Compute times per step are our assumption (batch 64
# on one P100, roughly what tf_cnn_benchmarks reported), not published with those figures.
PUBLISHED = [(Workload("ResNet-101", 44.5e6, 0.49), 0.90), (Workload("Inception V3", 23.8e6, 0.45), 0.90),
             (Workload("VGG-16", 138.4e6, 0.42), 0.68)]


def allreduce_seconds(link: LinkModel, workers: int, nbytes: float, per_host: int = 1) -> float:
    """One allreduce of ``nbytes`` over ``workers`` (``per_host`` to a host: hierarchical when above 1). Fewer
    workers than ``per_host`` share one host: the bytes never cross a link."""
    per_host = max(1, min(per_host, workers))
    hosts = max(1, math.ceil(workers / per_host))
    local = 0.0
    if per_host > 1 and workers > 1:
        local = 2 * (per_host - 1) / per_host * nbytes / link.local_bytes_s
    if hosts == 1:
        return link.fixed_s + local if workers > 1 else 0.0
    ring = 2 * (hosts - 1) * link.hop_s + 2 * (hosts - 1) / hosts * nbytes / (link.efficiency * link.link_bytes_s)
    return link.fixed_s + ring + local


def cycle_seconds(control: ControlModel, workers: int) -> float:
    """One cached negotiation cycle's latency at ``workers`` ranks, in the protocol the engine picks there."""
    if workers <= 1:
        return 0.0
    if workers <= control.peer_max:        # every rank sends to every other: one hop, n-1 frames read in a row
        return control.fixed_s + control.hop_s + (workers - 2) * control.frame_s
    if workers <= control.star_max:        # in to rank 0 and out again; it reads and writes 2(n-1) frames
        return control.fixed_s + 2 * control.hop_s + (2 * (workers - 1) - 2) * control.frame_s
    depth, reach = 0, 1                    # levels below rank 0: up and down them, an interior rank busy with
    while reach < workers:                 # its children's frames (arity in, arity out) at every level
        depth, reach = depth + 1, reach * control.arity + 1
    return control.fixed_s + 2 * depth * (control.hop_s + (control.arity - 1) * control.frame_s)


def control_seconds(control: Optional[ControlModel], workers: int) -> float:
    """What the control plane adds to a step at ``workers`` ranks beyond what 2 ranks pay (see the docstring)."""
    if control is None or workers <= 2:
        return 0.0
    return max(0.0, cycle_seconds(control, workers) - cycle_seconds(control, 2))


def step_seconds(link: LinkModel, work: Workload, workers: int, per_host: int = 1,
                 control: Optional[ControlModel] = None) -> float:
    """Predicted step time: compute, plus the communication the backward pass cannot hide (with ``control``, the
    control plane's growth with the world size too)."""
    total = 4.0 * work.params
    buffers = max(1, math.ceil(total / link.fusion_bytes))
    last = allreduce_seconds(link, workers, total / buffers, per_host) + control_seconds(control, workers)
    if workers > 1:
        last += 2 * total / buffers / link.copy_bytes_s
    return work.compute_s + max(last, buffers * last - work.overlap * work.compute_s)


def predict_table(link: LinkModel, works: Sequence[Workload], workers: Sequence[int], per_host: int = 1,
                  control: Optional[ControlModel] = None, startup: Optional[StartupTerm] = None,
                  cores: int = 1) -> str:
    """A markdown table: step time and scaling efficiency of each workload at each worker count, the control
    plane's share of the step and (with ``startup``) the time from the launch to the first result."""
    lines = ["| workers | " + " | ".join(f"{w.name} step / efficiency" for w in works) + " | control plane |" +
             (" start-up |" if startup else ""), "|---|" + "---|" * (len(works) + 1 + bool(startup))]
    for n in workers:
        cells = []
        for w in works:
            step = step_seconds(link, w, n, per_host, control)
            cells.append(f"{step * 1e3:.0f} ms / {w.compute_s / step:.0%}")
        first = f" {startup_seconds(startup, control or ControlModel(), n, per_host, cores):.2f} s |" \
            if startup else ""
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {control_seconds(control, n) * 1e3:.2f} ms |" + first)
    return "\n".join(lines)


def published_table(link: LinkModel, control: ControlModel, workers: int = 512, per_host: int = 4,
                    overlap: Optional[float] = None, sources: Optional[Sources] = None) -> str:
    """Horovod's published scaling efficiency at 512 GPUs beside this model's prediction for the same models (with
    ``overlap`` where it was fitted), each row saying which of its constants were fitted and which guessed."""
    sources = sources or Sources()
    fitted, guessed = sources.split()
    lines = [f"| model ({workers} workers, {per_host} per host) | published | predicted | predicted step | "
             "of which control plane | fitted | guessed |", "|---|---|---|---|---|---|---|"]
    for work, efficiency in PUBLISHED:
        work = work if overlap is None else dataclasses.replace(work, overlap=overlap)
        step = step_seconds(link, work, workers, per_host, control)
        lines.append(f"| {work.name} | {efficiency:.0%} | {work.compute_s / step:.0%} | {step * 1e3:.0f} ms | "
                     f"{control_seconds(control, workers) * 1e3:.2f} ms | {', '.join(fitted) or 'none'} | "
                     f"{', '.join(guessed) or 'none'} |")
    return "\n".join(lines)


def _share(record) -> float:
    """The share of a core each rank of ``record`` had: namespace hosts share one machine's ``machine_cores``
    (recorded by the benchmark), so a CPU-bound link and Python's fixed costs slow down as ranks outnumber them."""
    cores = record.get("machine_cores")
    return min(1.0, cores / record["ranks"]) if cores else 1.0


def _flat_rows(records) -> List[Tuple[int, float, float, float]]:
    """(ranks, bytes, seconds, share of a core) of horovod-py's allreduce rows on one-rank-per-host layouts."""
    rows = []
    for record in records:
        if not record["layout"].endswith("x1"):
            continue
        for row in record["results"].get("horovod-py", []):
            if row["op"] == "allreduce":
                rows.append((record["ranks"], row["bytes"], row["seconds"], _share(record)))
    return rows


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of the unconstrained fits over subsets of the columns
    (three columns: seven subsets), so a negative cost is never clamped after the fact."""
    best, best_residual = np.zeros(x.shape[1]), float(np.sum(y ** 2))
    columns = range(x.shape[1])
    for mask in range(1, 1 << x.shape[1]):
        keep = [c for c in columns if mask >> c & 1]
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if np.any(coef < 0):
            continue
        residual = float(np.sum((x[:, keep] @ coef - y) ** 2))
        if residual < best_residual:
            best, best_residual = np.zeros(x.shape[1]), residual
            best[keep] = coef
    return best


def fit(records, base: LinkModel = LinkModel()) -> LinkModel:
    """``c``, ``a`` and ``e`` fitted to the cross-host benchmark's horovod-py allreduces (relative least squares,
    non-negative), for ranks with a core each.

    Raises:
        ValueError: the records hold no flat layout with allreduce rows.
    """
    rows = _flat_rows(records)
    if not rows:
        raise ValueError("no horovod-py allreduce rows of an HOSTSx1 layout in the benchmark records")
    # seconds = (c + a * 2(n-1) + 2(n-1)/n * B / W) / share, linear in (c, a, 1/W); weight each row by 1/seconds.
    # The bandwidth W is the machine's, fitted across layouts; e is W over the mean measured ceiling.
    x = np.array([[1.0 / s, 2 * (n - 1) / s, 2 * (n - 1) / n * b / s] for n, b, _, s in rows])
    y = np.array([t for _, _, t, _ in rows])
    fixed, hop, inverse = (float(v) for v in _nonnegative_lstsq(x / y[:, None], np.ones_like(y)))
    ceiling = float(np.mean([r["ceiling_gbs"] for r in records if r["layout"].endswith("x1")])) * 1e9
    bandwidth = 1.0 / inverse if inverse > 0 else ceiling
    return dataclasses.replace(base, fixed_s=fixed, hop_s=hop, efficiency=bandwidth / ceiling, link_bytes_s=ceiling)


def check(records, link: Optional[LinkModel] = None) -> List[Dict[str, float]]:
    """The benchmark's model step on every flat layout: measured best time against the fitted prediction (each
    layout with its ranks' share of the machine's cores, see :func:`fit`)."""
    link = link or fit(records)
    out = []
    for record in records:
        measured = [r["seconds"] for r in record["results"].get("horovod-py", []) if r["op"] == "model"]
        if not measured or not record["layout"].endswith("x1"):
            continue
        share = _share(record)
        here = dataclasses.replace(link, fixed_s=link.fixed_s / share, hop_s=link.hop_s / share,
                                   efficiency=link.efficiency * share, copy_bytes_s=link.copy_bytes_s * share)
        predicted = step_seconds(here, Workload("model step", MODEL_STEP_PARAMS, 0.0), record["ranks"])
        out.append({"layout": record["layout"], "measured_s": measured[0], "predicted_s": predicted,
                    "error": predicted / measured[0] - 1.0})
    return out


def _args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m horovod.tools.scaling", description=__doc__.splitlines()[0]
                                     + " It prints the constants it assumed; docs/scaling.md is the user guide.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--params", type=float, help="model parameters (float32 gradients), e.g. 25.6e6")
    parser.add_argument("--compute-ms", type=float, help="compute time of one step on one worker, ms")
    parser.add_argument("--overlap", type=float, default=None, help="share of the compute communication can hide "
                        "(default: fitted by --fit from a synthetic benchmark's JSON, else 0.5)")
    parser.add_argument("--link-gbit", type=float, default=25.0, help="link speed between hosts, Gbit/s")
    parser.add_argument("--per-host", type=int, default=1, help="workers per host (hierarchical above 1)")
    parser.add_argument("--cores", type=int, default=0, help="cores per host for start-up (0: --per-host)")
    parser.add_argument("--workers", default="2,4,8,16,32,64,128,256,512,1024,2048,4096",
                        help="worker counts to predict, comma-separated")
    parser.add_argument("--fit", action="append", default=[],
                        help="a measured run's JSON to fit constants to (repeatable): bench/crosshost.py's (c, a, e) "
                             "or examples/pytorch_synthetic_benchmark.py --json's (packing, overlap)")
    parser.add_argument("--published", action="store_true", help="the three published models (128 x 4 GPUs)")
    parser.add_argument("--check", help="bench/crosshost.py's JSON: predicted vs measured model steps")
    parser.add_argument("--copy-gbyte-s", type=float, help="with --check: packing rate of the machine that ran the "
                        "benchmark (default: measured here)")
    return parser.parse_args(argv)


def _published(link: LinkModel, workers, control, startup, overlap: Optional[float], sources: Sources) -> int:
    """The --published report: the three models at every worker count, then beside Horovod's 512-GPU figures."""
    if link.link_bytes_s == 25e9 / 8:
        sources["link bandwidth"] = "published (25 Gbit/s RoCE)"
    else:
        sources["link bandwidth"] = f"given (--link-gbit {link.link_bytes_s * 8 / 1e9:g}; published: 25 Gbit/s)"
    works = [w if overlap is None else dataclasses.replace(w, overlap=overlap) for w, _ in PUBLISHED]
    print(predict_table(link, works, workers, per_host=4, control=control, startup=startup, cores=4))
    print("\npublished at 512 GPUs: " + ", ".join(f"{w.name} {eff:.0%}" for w, eff in PUBLISHED) + "\n")
    print(published_table(link, control, overlap=overlap, sources=sources))
    print("\n" + assumptions(link, works[0], 4, 4, sources).replace(
        f"{works[0].compute_s * 1e3:g} ms a step, {works[0].params:.3g} parameters",
        "per model (ResNet-101 490 ms, Inception V3 450 ms, VGG-16 420 ms: batch 64 on one P100, not published)"))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; see the module docstring."""
    args = _args(argv)
    if args.check:
        with open(args.check) as handle:
            records = json.load(handle)
        copy = args.copy_gbyte_s * 1e9 if args.copy_gbyte_s else measure_copy_bytes_s(MODEL_TENSORS)
        link = fit(records, LinkModel(copy_bytes_s=copy))
        print(f"fitted: c = {link.fixed_s * 1e3:.2f} ms per op, a = {link.hop_s * 1e6:.0f} us per step, "
              f"e = {link.efficiency:.0%} of the link, for ranks with a core each; packing "
              f"{copy / 1e9:.1f} GB/s\n")
        print("| layout | measured | predicted | error |\n|---|---|---|---|")
        for row in check(records, link):
            print(f"| {row['layout']} | {row['measured_s'] * 1e3:.1f} ms | {row['predicted_s'] * 1e3:.1f} ms | "
                  f"{row['error']:+.0%} |")
        return 0
    link, overlap, sources, said = fit_files(args.fit, LinkModel(link_bytes_s=args.link_gbit * 1e9 / 8), fit)
    print("\n".join(said)) if said else None
    workers = [int(w) for w in args.workers.split(",")]
    control, startup = ControlModel.simulated(), StartupTerm.simulated()
    if args.published:
        if args.overlap is not None:        # an explicit --overlap wins over a fitted one, as below
            overlap, sources["overlap"] = args.overlap, "given (--overlap)"
        return _published(link, workers, control, startup, overlap, sources)
    if args.params is None or args.compute_ms is None:
        print("give --params and --compute-ms (or --published, or --check FILE)", file=sys.stderr)
        return 2
    sources.given(sys.argv[1:] if argv is None else argv)
    overlap = args.overlap if args.overlap is not None else 0.5 if overlap is None else overlap
    work = Workload("model", args.params, args.compute_ms / 1e3, overlap)
    print(predict_table(link, [work], workers, args.per_host, control, startup, args.cores or args.per_host))
    print("\n" + assumptions(link, work, args.per_host, args.cores or args.per_host, sources))
    effs = [(n, work.compute_s / step_seconds(link, work, n, args.per_host, control)) for n in workers]
    notes = explain(effs, args.per_host, link.link_bytes_s * 8 / 1e9)
    print(notes) if notes else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
