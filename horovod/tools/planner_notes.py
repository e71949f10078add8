"""What the scaling planner (:mod:`horovod.tools.scaling`) prints beside its table: the constants it assumed, and
notes on where the predicted efficiency moves most and why."""

from __future__ import annotations

from typing import Sequence, Tuple

__all__ = ["assumptions", "explain"]


def assumptions(link, work, per_host: int, cores: int, fitted: str = "") -> str:
    """The constants a prediction used (``link``: a :class:`~horovod.tools.scaling.LinkModel`; ``work``: a
    :class:`~horovod.tools.scaling.Workload` or None), one line each, so that a reader sees what to change."""
    lines = [f"assumed: links between hosts {link.link_bytes_s * 8 / 1e9:g} Gbit/s (--link-gbit), reached at "
             f"{link.efficiency:.0%} by a ring; {link.fixed_s * 1e3:.2f} ms fixed per allreduce and "
             f"{link.hop_s * 1e6:.0f} us per ring step ({fitted or 'defaults; --fit FILE fits them to a benchmark'})",
             f"assumed: {per_host} worker(s) per host (--per-host; fewer workers than that share one host, whose "
             f"local reduce runs at {link.local_bytes_s / 1e9:g} GB/s), {cores} core(s) per host for start-up "
             f"(--cores); float32 gradients in fusion buffers of {link.fusion_bytes >> 20} MiB, packed at "
             f"{link.copy_bytes_s / 1e9:g} GB/s",
             "assumed: the negotiation and start-up costs of the control-plane simulation (python -m "
             "horovod.tools.simulate; docs/scaling.md says how to fit it to your machine)"]
    if work is not None:
        lines.append(f"assumed: {work.params:.3g} parameters, {work.compute_s * 1e3:g} ms of compute per step "
                     f"(--compute-ms), of which {work.overlap:.0%} can hide communication (--overlap)")
    return "\n".join(lines)


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
