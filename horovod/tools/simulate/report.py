"""Figures of simulated jobs across world sizes: what each rank handles per cycle, cycle latency, and how long the
survivors take to fail after a rank dies, start-up and an elastic reset.

    python -m horovod.tools.simulate --ranks 8,64,512,4096 --seed 1

Per world size it runs the training loop of :class:`~horovod.tools.simulate.job.Workload` twice: once whole, for
frames and bytes per rank and cycle (the first step, whose names are new, and the cached steps after it) and the
step's latency from its last submission to its last result (every data phase included: the collectives whose data
did not ride the negotiation, :mod:`~horovod.tools.simulate.dataphase`); once with a rank killed in the middle of a
step, for the time until the last survivor has failed naming it. Then once from the launch to the first result
(:mod:`~horovod.tools.simulate.startup`), and an elastic reset around the lost rank's detection
(:mod:`~horovod.tools.simulate.elastic`).
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

from horovod.tools.simulate.elastic import reset_seconds
from horovod.tools.simulate.job import Job, Workload, scenario, victim_of
from horovod.tools.simulate.startup import StartupModel
from horovod.tools.simulate.world import CpuModel, Faults, LinkModel

__all__ = ["scenario", "figures", "table"]


def _per_cycle(job: Job, first: int, last: int) -> Dict[str, float]:
    """Frames and bytes per rank and cycle between the ends of steps ``first`` and ``last`` (most and mean)."""
    start, end = job.snapshots.get(first), job.snapshots.get(last)
    frames, nbytes = [], []
    for a, b in zip(start or [], end or []):
        if a is None or b is None or b[2] == a[2]:
            continue
        frames.append((b[0] - a[0]) / (b[2] - a[2]))
        nbytes.append((b[1] - a[1]) / (b[2] - a[2]))
    if not frames:
        return {"frames_max": 0.0, "frames_mean": 0.0, "bytes_max": 0.0}
    return {"frames_max": max(frames), "frames_mean": sum(frames) / len(frames), "bytes_max": max(nbytes)}


def _first_step(job: Job) -> Dict[str, float]:
    """Frames and bytes per rank in the first step (new names), per cycle."""
    frames, nbytes = [], []
    for snap in job.snapshots.get(0) or []:
        if snap is not None and snap[2]:
            frames.append(snap[0] / snap[2])
            nbytes.append(snap[1] / snap[2])
    return {"new_frames_max": max(frames, default=0.0), "new_bytes_max": max(nbytes, default=0.0)}


def figures(size: int, seed: int, steps: int = 4, tensors: int = 20, slots: int = 8, cores: int = 8,
            env: Optional[Dict[str, str]] = None, cpu: CpuModel = CpuModel(),
            startup: StartupModel = StartupModel(), lifecycle: bool = True,
            link: LinkModel = LinkModel()) -> Dict[str, float]:
    """The figures of one world size (see the module's docstring); ``lifecycle=False`` leaves out start-up and the
    elastic reset."""
    began = time.process_time()
    job = scenario(size, seed, slots, cores, Workload(steps=steps, tensors=tensors), env=env, cpu=cpu, link=link)
    out: Dict[str, float] = {"ranks": size, "mode": job.ranks[0].negotiation.name}
    out.update(_per_cycle(job, 0, steps - 1))
    out.update(_first_step(job))
    cached = [job.step_done[s] - job.step_submitted[s] for s in range(1, steps)]
    out["step_latency_s"] = sum(cached) / len(cached) if cached else 0.0
    out["cycles_per_step"] = (max(r.cycles for r in job.ranks) - 1) / steps     # (the shutdown's cycle aside)
    plane = job.answers.plane       # collectives whose data did not ride the negotiation, and their data phases
    out["data_phases_per_step"] = plane.phases / steps
    out["data_phase_s"] = plane.seconds / plane.phases if plane.phases else 0.0
    victim = victim_of(size)
    middle = job.step_submitted.get(steps // 2, 0.0) + out["step_latency_s"] / 2
    lost = scenario(size, seed, slots, cores, Workload(steps=steps, tensors=tensors),
                    Faults(kill=[(middle, victim)]), env, cpu, link)
    out["detect_s"] = lost.detection_seconds()          # (NaN: the job ended before the kill)
    out["survivors_naming"] = sum(1 for r in lost.ranks if r.error is not None and
                                  f"rank {victim} was lost" in str(r.error))
    if lifecycle:
        out.update(_lifecycle(size, seed, slots, cores, tensors, env, cpu, link, startup, out["detect_s"]))
    out["sim_cpu_s"] = time.process_time() - began
    return out


def _lifecycle(size, seed, slots, cores, tensors, env, cpu, link, startup, detect) -> Dict[str, float]:
    """Start-up to the first result, and an elastic reset around the lost rank's ``detect``."""
    first = scenario(size, seed, slots, cores, Workload(steps=1, tensors=tensors, compute=0.0, jitter=0.0),
                     env=env, cpu=cpu, link=link, startup=startup)
    # The lost-rank run's survivors exit once they raised and an elastic job's live on; with a core per rank (the
    # table's hosts) the ends take hardly any survivor's core, so its detection serves both.
    reset = reset_seconds(size, slots, cores, cpu, link, startup, seed=seed, detect=detect)["reset_s"]
    return {"startup_s": first.step_done[0], "rendezvous_requests": first.rendezvous.requests, "reset_s": reset}


def table(rows: List[Dict[str, float]]) -> str:
    """The figures as a markdown table."""
    head = ("| ranks | mode | frames / rank / cached cycle (most, mean) | bytes / rank / cached cycle (most) | "
            "frames / rank / cycle, new names (most) | cycles / step | data phases / step (each, ms) | "
            "cached step latency, ms | "
            "lost rank: last survivor fails after, ms | survivors naming it | start-up to the first result, s | "
            "elastic reset, s | simulated in, s |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['mode']} | {r['frames_max']:.1f}, {r['frames_mean']:.1f} | "
                     f"{r['bytes_max']:.0f} | {r['new_frames_max']:.1f} | {r['cycles_per_step']:.2f} | "
                     f"{r.get('data_phases_per_step', 0.0):.1f} ({r.get('data_phase_s', 0.0) * 1e3:.2f}) | "
                     f"{r['step_latency_s'] * 1e3:.2f} | {r['detect_s'] * 1e3:.2f} | "
                     f"{r['survivors_naming']} of {r['ranks'] - 1} | {r.get('startup_s', float('nan')):.2f} | "
                     f"{r.get('reset_s', float('nan')):.2f} | "
                     f"{r['sim_cpu_s']:.1f} |")
    return "\n".join(lines)
