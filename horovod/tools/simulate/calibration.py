"""The simulation against the benchmark: fit its costs to the small jobs, then predict the larger ones side by side.

    python -m horovod.tools.simulate.calibration bench/figures/scale-results.json [--cores 2]

From ``bench/scale.py``'s JSON (n ranks on one host of ``cores`` cores, a loop of blocking 4 B allreduces) it fits
two numbers to np 2 and np 4 only: how much the CPU model's costs scale (np 4 is CPU-bound: four ranks on two cores)
and the loopback's latency (np 2 is latency-bound: a core each). It then simulates every other measured np with those
costs and prints predicted against measured 4 B latency, with the error. Start-up, cached-cycle latency and the time
to detect a killed rank are not modelled yet (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Callable, Dict, List, Optional, Sequence

from horovod.tools.simulate.job import Workload
from horovod.tools.simulate.report import scenario
from horovod.tools.simulate.world import CpuModel, LinkModel

__all__ = ["allreduce_4b_seconds", "fit", "predict", "table", "main"]

_LOOP = Workload(steps=12, tensors=1, compute=0.0, jitter=0.0)     # blocking ops back to back, as the bench loops
_WARM = 3                                                          # steps left out: new names, the first cycles


def allreduce_4b_seconds(size: int, cores: int, cpu: CpuModel, link: LinkModel) -> float:
    """The simulated time per op of a loop of blocking 4 B allreduces on ``size`` ranks sharing ``cores`` cores."""
    job = scenario(size, seed=1, slots=size, cores=cores, workload=_LOOP, cpu=cpu, link=link)
    done = [job.step_done[s] for s in sorted(job.step_done)]
    return (done[-1] - done[_WARM - 1]) / (len(done) - _WARM)


def _solve(measure: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The ``x`` in [low, high] at which the increasing ``measure(x)`` meets ``target`` (bisection in log space)."""
    for _ in range(24):
        middle = (low * high) ** 0.5
        if measure(middle) < target:
            low = middle
        else:
            high = middle
    return (low * high) ** 0.5


def _scaled(cpu: CpuModel, factor: float) -> CpuModel:
    return CpuModel(**{f.name: getattr(cpu, f.name) * factor for f in dataclasses.fields(CpuModel)})


def fit(measured: Dict[int, float], cores: int, cpu: CpuModel = CpuModel(), link: LinkModel = LinkModel()):
    """CPU costs scaled to np 4's measured time and the loopback latency set to np 2's (seconds by np), fitted in
    turn three times: each moves the other a little (np 2 costs some CPU, np 4 some latency)."""
    factor = 1.0
    for _ in range(3):
        local = _solve(lambda x: allreduce_4b_seconds(2, cores, _scaled(cpu, factor),
                                                      dataclasses.replace(link, local_latency=x)),
                       measured[2], 1e-7, 1e-2)
        link = dataclasses.replace(link, local_latency=local)
        factor = _solve(lambda x: allreduce_4b_seconds(4, cores, _scaled(cpu, x), link), measured[4], 1e-3, 1e3)
    return _scaled(cpu, factor), link


def predict(measured: Dict[int, float], cores: int) -> List[Dict[str, float]]:
    """Each measured np: predicted and measured seconds per op and the relative error, from np 2 and 4's fit."""
    cpu, link = fit(measured, cores)
    rows = []
    for size in sorted(measured):
        predicted = allreduce_4b_seconds(size, cores, cpu, link)
        rows.append({"ranks": size, "measured_s": measured[size], "predicted_s": predicted,
                     "error": predicted / measured[size] - 1.0, "fitted": size in (2, 4)})
    return rows


def table(rows: Sequence[Dict[str, float]]) -> str:
    """The rows as a markdown table."""
    lines = ["| ranks | measured 4 B, µs | predicted, µs | error |", "|---|---|---|---|"]
    for r in rows:
        note = " (fitted)" if r["fitted"] else ""
        lines.append(f"| {r['ranks']} | {r['measured_s'] * 1e6:,.0f} | {r['predicted_s'] * 1e6:,.0f} | "
                     f"{r['error']:+.0%}{note} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m horovod.tools.simulate.calibration", description=__doc__)
    parser.add_argument("results", help="bench/scale.py's JSON")
    parser.add_argument("--cores", type=int, default=0, help="the benchmark machine's cores (default: its record)")
    args = parser.parse_args(argv)
    with open(args.results) as handle:
        saved = json.load(handle)
    ours = saved["medians"]["horovod-py"]
    measured = {int(n): row["ar4_us"] / 1e6 for n, row in ours.items() if row.get("ar4_us")}
    if 2 not in measured or 4 not in measured:
        print("the results need np 2 and np 4 (the fit's two points)", file=sys.stderr)
        return 2
    cores = args.cores or int(saved["meta"].get("cores") or 2)
    print(table(predict(measured, cores)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
