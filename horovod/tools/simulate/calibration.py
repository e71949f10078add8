"""The simulation against the benchmark: fit its costs to the small jobs, then predict the larger ones side by side.

    python -m horovod.tools.simulate.calibration bench/figures/scale-control.json [--cores 2] [--roles]
        [--sharing CURVE.json]

From ``bench/scale_control.py``'s JSON (n ranks on one host of ``cores`` cores: start-up to the first result, a loop
of blocking 4 B allreduces, a loop of cached 20-name cycles, the time until the last survivor of a killed rank
raised) it fits seven numbers (eight where the run recorded each rank's CPU) to np 2 and np 4 only, each from the
figure it governs:

- the CPU model's scale, from np 4's 4 B allreduce (CPU-bound: four ranks on two cores), and the loopback latency,
  from np 2's (latency-bound: a core each), in turn until both settle;
- a rank's boot (the interpreter and imports, on a shared core) from np 4's start-up less np 2's, and the
  launcher's own start from np 2's;
- the caller's CPU per request (submitting it and waiting for it), from np 2's cached cycle of 20 names;
- where the run recorded each rank's CPU per op (the bench's ``cpu_us``), rank 0's fold of each member's contribution
  (a small allreduce's data rides the members' messages to rank 0, which folds them all), from what np 4's cycle
  costs rank 0 beyond its other ranks;
- what a rank's process ending costs a core (the kernel frees its memory and closes its sockets: the killed rank's
  sockets close when it is done), from np 2's detection time; what failing costs a rank (the error raised through
  the engine, every handle failed, the hang-up) as np 4's survivors measured it (the bench's ``fail_cpu_us``), or,
  in runs without that record, from np 4's detection time, the two in turn until both settle. A survivor that
  raised exits too (the benchmark's script ends on the error), and its end shares the cores with the survivors that
  have not raised yet; with the benchmark's ``--linger`` they stay alive instead, as an elastic job's do.

With ``--sharing`` (``bench/core_sharing.py``'s JSON, measured on the same machine) a wake-up also refills the
caches that the processes which ran since took: the machine's curve, and a rank's full refill measured at np 4; and
the kernel's tick and preemption model it recorded say how long a process's end keeps a core (``CpuModel.tick``).

It then simulates every measured np with those costs and prints the four figures predicted beside the measured ones,
with the error; with ``--roles``, also each role's CPU per op (rank 0, the tree's relays, the others), measured and
simulated. ``bench/scale.py``'s JSON works too (start-up and the 4 B allreduce only). With ``--fit-from OTHER``
the costs come from another run's np 2 and 4 (the ``--linger`` run predicted from the costs fitted where survivors
exit, say).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

from horovod.core.negotiation.tree import children
from horovod.tools.simulate.job import Workload, victim_of
from horovod.tools.simulate.report import scenario
from horovod.tools.simulate.startup import StartupModel
from horovod.tools.simulate.world import CpuModel, Faults, LinkModel

__all__ = ["Costs", "allreduce_4b_seconds", "cycle_seconds", "startup_seconds", "detect_seconds", "FIGURES",
           "solve", "fit", "fit_saved", "exits_of", "predict", "table", "role_cpu", "roles_of", "role_table",
           "measured_figures", "describe", "main"]

_WARM = 3                   # steps left out of a loop's time: new names, the first cycles


@dataclasses.dataclass(frozen=True)
class Costs:
    """Everything the fit sets."""

    cpu: CpuModel = CpuModel()
    link: LinkModel = LinkModel()
    startup: StartupModel = StartupModel()


def _loop_job(size: int, cores: int, costs: Costs, tensors: int, steps: int):
    return scenario(size, seed=1, slots=size, cores=cores, cpu=costs.cpu, link=costs.link,
                    workload=Workload(steps=steps, tensors=tensors, compute=0.0, jitter=0.0, mixed=False))


def _loop(size: int, cores: int, costs: Costs, tensors: int, steps: int = 12) -> float:
    done = [t for _, t in sorted(_loop_job(size, cores, costs, tensors, steps).step_done.items())]
    return (done[-1] - done[_WARM - 1]) / (len(done) - _WARM)


def allreduce_4b_seconds(size: int, cores: int, costs: Costs) -> float:
    """Simulated time per op of a loop of blocking 4 B allreduces on ``size`` ranks sharing ``cores`` cores."""
    return _loop(size, cores, costs, tensors=1)


def cycle_seconds(size: int, cores: int, costs: Costs) -> float:
    """Simulated time per step of a loop of 20 cached 4 B allreduces submitted at once, then waited for."""
    return _loop(size, cores, costs, tensors=20, steps=10)


def startup_seconds(size: int, cores: int, costs: Costs) -> float:
    """Simulated time from the launch until the last rank holds its first allreduce's result."""
    job = scenario(size, seed=1, slots=size, cores=cores, cpu=costs.cpu, link=costs.link, startup=costs.startup,
                   workload=Workload(steps=1, tensors=1, compute=0.0, jitter=0.0))
    return job.step_done[0]


def detect_seconds(size: int, cores: int, costs: Costs, exits: bool = True) -> float:
    """Simulated time from killing rank ``size // 2 + 1`` (the last at 2) in a loop of blocking 4 B allreduces until
    the last survivor raised (``exits``: each survivor's process ends once it raised)."""
    victim = victim_of(size)
    loop = allreduce_4b_seconds(size, cores, costs)
    faults = Faults(kill=[(loop * 6.5, victim)])
    job = scenario(size, seed=1, slots=size, cores=cores, cpu=costs.cpu, link=costs.link, faults=faults,
                   workload=Workload(steps=1000, tensors=1, compute=0.0, jitter=0.0, mixed=False, exits=exits))
    return job.detection_seconds()


FIGURES: Dict[str, Callable[[int, int, Costs], float]] = {
    "first_s": startup_seconds, "ar4_us": allreduce_4b_seconds, "cycle20_us": cycle_seconds,
    "detect_ms": detect_seconds}
_UNIT = {"first_s": 1.0, "ar4_us": 1e-6, "cycle20_us": 1e-6, "detect_ms": 1e-3}
_LABEL = {"first_s": "start-up, s", "ar4_us": "4 B allreduce, µs", "cycle20_us": "cached cycle of 20 names, µs",
          "detect_ms": "killed rank detected, ms"}


def solve(measure: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The ``x`` in [low, high] at which the increasing ``measure(x)`` meets ``target`` (bisection in log space)."""
    for _ in range(24):
        middle = (low * high) ** 0.5
        if measure(middle) < target:
            low = middle
        else:
            high = middle
    return (low * high) ** 0.5


def _scaled(cpu: CpuModel, factor: float) -> CpuModel:
    # The refill is measured on its own (bench/core_sharing.py), the tick is the kernel's and the memory's rate is
    # measured apart: none scales with the costs the fit sets.
    return dataclasses.replace(cpu, **{f.name: getattr(cpu, f.name) * factor for f in dataclasses.fields(CpuModel)
                                       if f.name not in ("cold", "sharing", "beyond", "tick", "copy")})


def fit(measured: Dict[str, Dict[int, float]], cores: int, base: Costs = Costs(), exits: bool = True,
        failing: Optional[float] = None, roles: Optional[Dict[str, List[float]]] = None) -> Costs:
    """The costs fitted to np 2 and 4 of ``measured`` (figure -> np -> seconds); figures it lacks keep ``base``'s
    (``exits``: whether the kill's survivors exited once they raised; ``failing``: a survivor's CPU for the op that
    raised, where np 4's run measured it; ``roles``: np 4's CPU per op of each rank, µs, by loop, where measured)."""
    costs = _fit_loops(measured, cores, base, roles)
    first = measured.get("first_s", {})
    if 2 in first and 4 in first:
        for _ in range(3):      # boot from the difference (two more ranks share the cores), the launch from np 2
            boot = solve(lambda x: _with_startup(startup_seconds, 4, cores, costs, boot=x) -
                          _with_startup(startup_seconds, 2, cores, costs, boot=x), first[4] - first[2], 1e-4, 10.0)
            launch = solve(lambda x: _with_startup(startup_seconds, 2, cores, costs, boot=boot, launch=x),
                            first[2], 1e-4, 10.0)
            costs = dataclasses.replace(costs, startup=dataclasses.replace(costs.startup, boot=boot, launch=launch))
    return _fit_kill(measured.get("detect_ms", {}), cores, costs, exits, failing)


def _fit_kill(detect: Dict[int, float], cores: int, costs: Costs, exits: bool, failing: Optional[float]) -> Costs:
    """A process's end from np 2's kill; failing's CPU as measured, else from np 4's kill, the two in turn. (np 4's
    kill alone decides failing badly: a run of 7.8 ms against one of 10.9 moves it from 0.6 ms to 3.2 and the
    prediction at 8-128 ranks by some 40 points, where the measured CPU varies by a tenth.)"""
    if failing is not None:
        costs = _with_cpu(costs, fail=failing)
    elif 4 not in detect:
        return costs
    for _ in range(3 if 2 in detect and failing is None else 1):
        if 2 in detect:
            ended = solve(lambda x: detect_seconds(2, cores, _with_cpu(costs, exit=x), exits), detect[2], 1e-6, 1.0)
            costs = _with_cpu(costs, exit=ended)
        if failing is None:
            fail = solve(lambda x: detect_seconds(4, cores, _with_cpu(costs, fail=x), exits), detect[4], 1e-6, 1.0)
            costs = _with_cpu(costs, fail=fail)
    return costs


def _fit_loops(measured: Dict[str, Dict[int, float]], cores: int, costs: Costs,
               roles: Optional[Dict[str, List[float]]] = None) -> Costs:
    """The loopback latency (np 2's 4 B), the CPU costs' scale (np 4's 4 B), the caller's cost per request (np 2's
    cycle of 20 names) and, with ``roles``, rank 0's fold of a contribution (np 4's rank 0 against its other ranks),
    each fitted in turn three times: each moves the others a little."""
    ar4, cycle = measured.get("ar4_us", {}), measured.get("cycle20_us", {})
    if not (2 in ar4 and 4 in ar4):
        return costs
    base, factor, fitted = costs.cpu, 1.0, {"submit": costs.cpu.submit, "fold": costs.cpu.fold}
    for _ in range(3):
        cpu = dataclasses.replace(_scaled(base, factor), **fitted)
        local = solve(lambda x: allreduce_4b_seconds(2, cores, dataclasses.replace(
            costs, cpu=cpu, link=dataclasses.replace(costs.link, local_latency=x))), ar4[2], 1e-7, 1e-2)
        costs = dataclasses.replace(costs, link=dataclasses.replace(costs.link, local_latency=local))
        factor = solve(lambda x: allreduce_4b_seconds(4, cores, dataclasses.replace(
            costs, cpu=dataclasses.replace(_scaled(base, x), **fitted))), ar4[4], 1e-3, 1e3)
        costs = dataclasses.replace(costs, cpu=dataclasses.replace(_scaled(base, factor), **fitted))
        if 2 in cycle:
            fitted["submit"] = solve(lambda x: cycle_seconds(2, cores, _with_cpu(costs, submit=x)), cycle[2], 1e-8,
                                     1e-3)
            costs = _with_cpu(costs, submit=fitted["submit"])
        if roles:
            fitted["fold"] = _fit_fold(roles, cores, costs)
            costs = _with_cpu(costs, fold=fitted["fold"])
    return costs


def _fold_extra(ar4: Dict[str, float], cycle: Dict[str, float]) -> float:
    # What the cycle of 20 names costs rank 0 beyond the 4 B op, less what it costs the others (by role_cpu's roles).
    return (cycle["rank 0"] - ar4["rank 0"]) - (cycle["others"] - ar4["others"])


def _fit_fold(roles: Dict[str, List[float]], cores: int, costs: Costs) -> float:
    """Rank 0's fold of a contribution, from what np 4's cycle costs its rank 0 beyond its other ranks (0 where the
    simulation charges that much without it)."""
    target = _fold_extra(roles_of(roles["ar4"], False), roles_of(roles["cycle20"], False)) * 1e-6

    def extra(fold: float) -> float:
        with_fold = _with_cpu(costs, fold=fold)
        return _fold_extra(role_cpu(4, cores, with_fold, 1, 12), role_cpu(4, cores, with_fold, 20, 10))
    return 0.0 if extra(0.0) >= target else solve(extra, target, 1e-9, 1e-4)


def _with_cpu(costs: Costs, **changes) -> Costs:
    return dataclasses.replace(costs, cpu=dataclasses.replace(costs.cpu, **changes))


def _with_startup(figure, size: int, cores: int, costs: Costs, **changes) -> float:
    return figure(size, cores, dataclasses.replace(costs, startup=dataclasses.replace(costs.startup, **changes)))


def predict(measured: Dict[str, Dict[int, float]], cores: int, costs: Optional[Costs] = None, exits: bool = True
            ) -> List[Dict[str, object]]:
    """For each figure and measured np: predicted and measured seconds and the relative error, from np 2 and 4's
    fit (or ``costs``); ``exits``: whether the kill's survivors exited once they raised."""
    costs = costs or fit(measured, cores, exits=exits)
    rows = []
    for name, by_np in measured.items():
        for size in sorted(by_np):
            predicted = detect_seconds(size, cores, costs, exits) if name == "detect_ms" else \
                FIGURES[name](size, cores, costs)
            rows.append({"figure": name, "ranks": size, "measured_s": by_np[size], "predicted_s": predicted,
                         "error": predicted / by_np[size] - 1.0, "fitted": size in (2, 4)})
    return rows


def role_cpu(size: int, cores: int, costs: Costs, tensors: int, steps: int) -> Dict[str, float]:
    """Simulated CPU per step of a loop of ``tensors`` cached 4 B allreduces, by role: rank 0, the tree's ranks that
    relay (their children's messages up, the reply down), the others (median of each)."""
    job = _loop_job(size, cores, costs, tensors, steps)
    first, last = job.snapshots[_WARM - 1], job.snapshots[steps - 1]
    return roles_of([(b[3] - a[3]) / (steps - _WARM) for a, b in zip(first, last)],
                    job.ranks[0].negotiation.name == "tree")


def roles_of(cpu: Sequence[float], tree: bool) -> Dict[str, float]:
    """Per-rank figures (rank order) as the median of each role (see :func:`role_cpu`)."""
    relays = [r for r in range(1, len(cpu)) if tree and children(r, len(cpu))]
    rest = [r for r in range(1, len(cpu)) if r not in relays]
    out = {"rank 0": cpu[0], "others": statistics.median(cpu[r] for r in rest)}
    if relays:
        out["relays"] = statistics.median(cpu[r] for r in relays)
    return out


def role_table(saved: dict, cores: int, costs: Costs) -> str:
    """Measured (the benchmark's ``cpu_us``) against simulated CPU per op of each role, for both loops, at every np
    whose run recorded it: where each rank's work goes, which the four figures only show summed."""
    lines = ["| ranks | loop | rank 0, µs: measured / simulated | relays | others |", "|---|---|---|---|---|"]
    for size in sorted(int(n) for n in saved["medians"]):
        measured = saved["medians"][str(size)].get("cpu_us")
        for loop, tensors, steps in (("ar4", 1, 12), ("cycle20", 20, 10)):
            if not measured or loop not in measured:
                continue
            sim = role_cpu(size, cores, costs, tensors, steps)
            real = roles_of(measured[loop], "relays" in sim)
            cells = [f"{real[k]:,.0f} / {sim[k] * 1e6:,.0f}" if k in sim else "" for k in ("rank 0", "relays",
                                                                                          "others")]
            lines.append(f"| {size} | {loop} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: Sequence[Dict[str, object]]) -> str:
    """The rows as a markdown table: a row per np, measured / predicted (error) per figure."""
    names = [n for n in FIGURES if any(r["figure"] == n for r in rows)]
    lines = ["| ranks | " + " | ".join(f"{_LABEL[n]}: measured / predicted (error)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for size in sorted({r["ranks"] for r in rows}):
        cells = []
        for name in names:
            row = next((r for r in rows if r["figure"] == name and r["ranks"] == size), None)
            if row is None:
                cells.append("")
                continue
            unit = _UNIT[name]
            fitted = " fitted" if row["fitted"] else ""
            cells.append(f"{row['measured_s'] / unit:,.3g} / {row['predicted_s'] / unit:,.3g} "
                         f"({row['error']:+.0%}{fitted})")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fit_saved(saved: dict, cores: int = 0, figures: Sequence[str] = tuple(FIGURES),
              sharing: Optional[dict] = None) -> Costs:
    """The costs fitted to a benchmark's saved JSON (its ``figures``): its np 2 and 4, and the rendezvous server's
    cost per request where the benchmark measured it alone (``server_request_us``); with ``sharing``
    (bench/core_sharing.py's JSON) wake-ups refill the caches as that machine's curve says."""
    base = Costs()
    request = saved["meta"].get("server_request_us")
    if request:
        base = dataclasses.replace(base, startup=dataclasses.replace(base.startup, request=request * 1e-6))
    if sharing:
        ring_refill = sharing["ring_evicted_us"] - sharing["ring_us"]["2"]     # the curve's own full refill
        base = _with_cpu(base, cold=sharing["rank_cold_us"] * 1e-6, beyond=ring_refill * 1e-6,
                         sharing=tuple((float(x), float(y)) for x, y in sharing["sharing"]), **_tick(sharing["meta"]))
    measured = {k: v for k, v in measured_figures(saved).items() if k in figures}
    four = saved["medians"].get("4", {})
    failing = four.get("fail_cpu_us") if "detect_ms" in figures else None
    return fit(measured, cores or int(saved["meta"].get("cores") or 2), base, exits=exits_of(saved),
               failing=failing and failing * 1e-6, roles=four.get("cpu_us"))


def _tick(meta: dict) -> dict:
    # The kernel that bench/core_sharing.py ran on (older JSONs lack it: CpuModel's default, this VM's kernel).
    if "kernel_hz" not in meta:
        return {}
    return {"tick": 0.0 if meta.get("preempt") == "full" else 1.0 / meta["kernel_hz"]}


def exits_of(saved: dict) -> bool:
    """Whether the survivors of the run's kill exited once they raised (``bench/scale_control.py`` without
    ``--linger``)."""
    return not saved["meta"].get("linger")


def measured_figures(saved: dict) -> Dict[str, Dict[int, float]]:
    """figure -> np -> seconds, from bench/scale_control.py's JSON or bench/scale.py's (its horovod-py medians)."""
    medians = saved["medians"]
    medians = medians.get("horovod-py", medians)
    out: Dict[str, Dict[int, float]] = {}
    for size, row in medians.items():
        for name in FIGURES:
            if row.get(name):
                out.setdefault(name, {})[int(size)] = row[name] * _UNIT[name]
    return out


def describe(costs: Costs) -> str:
    """The fitted numbers, in one line."""
    return (f"CPU costs x{costs.cpu.wake / CpuModel().wake:.2f} of the first guesses, failing "
            f"{costs.cpu.fail * 1e6:.0f} us, a process's exit {costs.cpu.exit * 1e3:.2f} ms, "
            f"a request {costs.cpu.submit * 1e6:.1f} us, loopback latency {costs.link.local_latency * 1e6:.1f} us, "
            f"boot {costs.startup.boot:.3f} s, launch {costs.startup.launch:.3f} s, rendezvous "
            f"{costs.startup.request * 1e6:.0f} us a request"
            + (f", a cold op {costs.cpu.cold * 1e6:.0f} us" if costs.cpu.cold and costs.cpu.sharing else "")
            + (f", rank 0 folds a contribution in {costs.cpu.fold * 1e6:.2f} us" if costs.cpu.fold else "")
            + (f", ends preempted at the {costs.cpu.tick * 1e3:g} ms tick" if costs.cpu.tick else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m horovod.tools.simulate.calibration", description=__doc__)
    parser.add_argument("results", help="bench/scale_control.py's (or bench/scale.py's) JSON")
    parser.add_argument("--cores", type=int, default=0, help="the benchmark machine's cores (default: its record)")
    parser.add_argument("--figures", default=",".join(FIGURES), help="which figures, comma-separated")
    parser.add_argument("--sharing", help="bench/core_sharing.py's JSON: wake-ups refill the caches as more "
                                          "processes share the cores (measured on the same machine; default: the "
                                          "curve the results hold, from bench/scale_control.py --curve)")
    parser.add_argument("--fit-from", help="fit to this run's np 2 and 4 instead (a run of the same figures)")
    parser.add_argument("--roles", action="store_true",
                        help="also each role's CPU per op (rank 0, the tree's relays, the others), measured and "
                             "simulated, where the run recorded it (bench/scale_control.py's cpu_us)")
    args = parser.parse_args(argv)
    saved = _load(args.results)
    source = _load(args.fit_from) or saved
    sharing = _load(args.sharing) or source.get("sharing")     # bench/scale_control.py --curve measured it beside
    wanted = set(args.figures.split(","))
    measured = {k: v for k, v in measured_figures(saved).items() if k in wanted}
    if not any(2 in v and 4 in v for v in measured_figures(source).values()):
        print("the results need np 2 and np 4 (the fit's two points)", file=sys.stderr)
        return 2
    cores = args.cores or int(saved["meta"].get("cores") or 2)
    costs = fit_saved(source, cores, list(measured), sharing)
    print(f"fitted{' to ' + args.fit_from if args.fit_from else ''}: {describe(costs)}", file=sys.stderr)
    rows = predict(measured, cores, costs, exits_of(saved))
    print(table(rows))
    checked = [r for r in rows if not r["fitted"]]
    print(f"\nwithin 25 %: {sum(abs(r['error']) <= 0.25 for r in checked)} of the {len(checked)} cells not fitted")
    if args.roles:
        print("\n" + role_table(saved, cores, costs))
    return 0


def _load(path: Optional[str]) -> Optional[dict]:
    if not path:
        return None
    with open(path) as handle:
        return json.load(handle)


if __name__ == "__main__":
    sys.exit(main())
