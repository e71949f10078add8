"""What the scaling planner (:mod:`horovod.tools.scaling`) prints beside its table: the constants it assumed, and
notes on where the predicted efficiency moves most and why."""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

__all__ = ["assumptions", "explain"]


def assumptions(link, work, per_host: int, cores: int, sources: Dict[str, str]) -> str:
    """Every constant a prediction used, one line each with its value and where it came from (``link``: a
    :class:`~horovod.tools.scaling.LinkModel`; ``work``: a :class:`~horovod.tools.scaling.Workload` or None;
    ``sources``: :class:`~horovod.tools.planner_fit.Sources`), so that a reader sees what to measure or change."""
    values = [("link bandwidth", f"{link.link_bytes_s * 8 / 1e9:g} Gbit/s between hosts (--link-gbit)"),
              ("fixed cost per allreduce", f"c = {link.fixed_s * 1e3:.2f} ms (negotiation, Python; --fit a "
                                           f"bench/crosshost.py JSON)"),
              ("latency per ring step", f"a = {link.hop_s * 1e6:.0f} us"),
              ("link efficiency", f"e = {link.efficiency:.0%} of the link reached by a ring"),
              ("local reduce", f"{link.local_bytes_s / 1e9:g} GB/s within a host ({per_host} worker(s) per host, "
                               f"--per-host; {cores} core(s) per host for start-up, --cores)"),
              ("packing", f"{link.copy_bytes_s / 1e9:.3g} GB/s into the fusion buffer and back (--fit a synthetic "
                          f"benchmark JSON)"),
              ("fusion buffer", f"{link.fusion_bytes >> 20} MiB, float32 gradients")]
    if work is not None:
        values += [("compute time", f"{work.compute_s * 1e3:g} ms a step, {work.params:.3g} parameters "
                                    f"(--compute-ms, --params)"),
                   ("overlap", f"{work.overlap:.0%} of the compute can hide communication (--overlap, or --fit "
                               f"a synthetic benchmark JSON)")]
    values += [("control plane", "the negotiation's costs of the control-plane simulation (python -m "
                                 "horovod.tools.simulate; docs/scaling.md says how to fit it)"),
               ("start-up", "the simulation's start-up model")]
    return "\n".join(f"assumed: {name}: {value} [{sources.get(name, 'guessed')}]" for name, value in values)


def explain(effs: Sequence[Tuple[int, float]], per_host: int, link_gbit: float) -> str:
    """Why the efficiency (``(workers, efficiency)`` in order) changes where it changes most: the job leaving one
    host, and any rise."""
    notes = []
    for (a, ea), (b, eb) in zip(effs, effs[1:]):
        if a <= per_host < b:
            notes.append(f"from {a} to {b} workers the job leaves one host: the gradients start to cross the "
                         f"{link_gbit:g} Gbit/s links ({ea:.0%} -> {eb:.0%})")
        elif eb > ea + 0.005:
            notes.append(f"from {a} to {b} workers the efficiency rises ({ea:.0%} -> {eb:.0%}): a ring over more "
                         f"hosts sends each 2(n-1)/n of the bytes, nearly the same, while the fixed costs are "
                         f"spread differently; such steps are within the model's error")
    beyond = [n for n, _ in effs if n > per_host]
    if len(beyond) > 1:
        notes.append(f"past one host, what grows with the workers is the ring's latency (2(n-1) steps) and the "
                     f"negotiation; the bandwidth term stays near 2x the gradients over the link")
    return "\n".join("note: " + n for n in notes)
