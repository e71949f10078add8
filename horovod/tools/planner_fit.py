"""Fitting the scaling planner (:mod:`horovod.tools.scaling`) to measured runs, and saying where each constant came
from.

``--fit`` takes either benchmark's JSON, told apart by its shape:

- ``bench/crosshost.py``'s (a list of layouts): the fixed cost per allreduce, the latency per ring step and the link's
  efficiency (:func:`horovod.tools.scaling.fit`);
- ``examples/pytorch_synthetic_benchmark.py --json``'s (one record): the packing bandwidth and the overlap. Packing is
  measured there directly (the model's gradients into one buffer and back, as the engine's fusion copies them). The
  overlap is the share of the compute that hid communication in that run: the step with Horovod against compute
  alone (an unwrapped copy of the model) plus communication alone (one fused allreduce of every gradient),
  ``o = (T + C - step) / T``, kept within [0, 1].

:class:`Sources` records, for every constant, whether it was fitted (and to which file), given on the command line or
guessed, so that the planner's assumptions and its ``--published`` rows can say which is which.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Sources", "is_synthetic", "fit_synthetic", "fit_files", "measure_copy_bytes_s", "CONSTANTS"]

# Every constant the planner assumes, by the name its lines and rows use.
CONSTANTS = ("link bandwidth", "fixed cost per allreduce", "latency per ring step", "link efficiency",
             "local reduce", "packing", "overlap", "fusion buffer", "compute time", "control plane", "start-up")


class Sources(dict):
    """Constant name -> where its value came from: "fitted to FILE", "given (--flag)" or "guessed"."""

    def __init__(self):
        super().__init__({name: "guessed" for name in CONSTANTS})
        self["control plane"] = self["start-up"] = "the simulation's costs"
        self["fusion buffer"] = "Horovod's default (HOROVOD_FUSION_THRESHOLD)"

    def of(self, name: str) -> str:
        """Where ``name`` came from."""
        return self.get(name, "guessed")

    def given(self, argv: Sequence[str]) -> None:
        """Mark what the command line gave (an explicit --overlap wins over a fitted one)."""
        flags = {a.split("=")[0] for a in argv}
        self["compute time"] = "given (--compute-ms, --params)"
        for flag, name in (("--link-gbit", "link bandwidth"), ("--overlap", "overlap")):
            if flag in flags:
                self[name] = f"given ({flag})"

    def split(self, names: Sequence[str] = CONSTANTS) -> Tuple[List[str], List[str]]:
        """(fitted, guessed) among ``names``; given ones are in neither."""
        fitted = [n for n in names if self.of(n).startswith("fitted")]
        return fitted, [n for n in names if self.of(n) == "guessed"]


def is_synthetic(saved) -> bool:
    """Whether ``saved`` is the synthetic benchmark's record (else the cross-host benchmark's layouts)."""
    return isinstance(saved, dict) and "compute_s" in saved and "pack_bytes_s" in saved


def fit_synthetic(record: Dict[str, float], fusion_bytes: int = 64 << 20) -> Tuple[float, Optional[float]]:
    """(packing bytes per second, overlap) from the synthetic benchmark's record (see the module docstring). The
    overlap is None where every gradient fits one fusion buffer of ``fusion_bytes``: the planner's step is then
    ``T + C`` whatever the overlap, so such a run cannot show it."""
    compute, communication, step = record["compute_s"], record["allreduce_s"], record["step_s"]
    if record.get("gradient_bytes", fusion_bytes + 1) <= fusion_bytes:
        return float(record["pack_bytes_s"]), None
    overlap = (compute + communication - step) / compute if compute > 0 else 0.0
    return float(record["pack_bytes_s"]), min(1.0, max(0.0, overlap))


def fit_files(paths: Sequence[str], link, fit_crosshost) -> Tuple[object, Optional[float], Sources, List[str]]:
    """The planner's ``link`` with every file of ``paths`` fitted in (``fit_crosshost``: the cross-host fit), the
    overlap (None: not fitted), the sources, and a line per file saying what it set."""
    sources, overlap, said = Sources(), None, []
    for path in paths:
        with open(path) as handle:
            saved = json.load(handle)
        if is_synthetic(saved):
            copy, fitted_overlap = fit_synthetic(saved, link.fusion_bytes)
            link = dataclasses.replace(link, copy_bytes_s=copy)
            sources["packing"] = f"fitted to {path}"
            if fitted_overlap is None:
                shown = (f"overlap not fitted: its {saved['gradient_bytes'] / 2 ** 20:.0f} MiB of gradients fit one "
                         f"{link.fusion_bytes >> 20} MiB fusion buffer, where the step is T + C whatever the overlap")
            else:
                overlap, sources["overlap"] = fitted_overlap, f"fitted to {path}"
                shown = (f"overlap {overlap:.0%} (step {saved['step_s'] * 1e3:.1f} ms against compute "
                         f"{saved['compute_s'] * 1e3:.1f} ms and allreduce {saved['allreduce_s'] * 1e3:.1f} ms apart)")
            said.append(f"fitted to {path} ({saved.get('model')} at np {saved.get('np')}, {saved.get('date')}): "
                        f"packing {copy / 1e9:.2f} GB/s; {shown}")
        else:
            fitted = fit_crosshost(saved)
            link = dataclasses.replace(link, fixed_s=fitted.fixed_s, hop_s=fitted.hop_s,
                                       efficiency=fitted.efficiency)
            for name in ("fixed cost per allreduce", "latency per ring step", "link efficiency"):
                sources[name] = f"fitted to {path}"
            said.append(f"fitted to {path}: c = {fitted.fixed_s * 1e3:.2f} ms, a = {fitted.hop_s * 1e6:.0f} us, "
                        f"e = {fitted.efficiency:.0%}")
    return link, overlap, sources, said


def measure_copy_bytes_s(sizes: Sequence[int], repeats: int = 20) -> float:
    """This machine's rate of packing tensors of ``sizes`` float32 elements into a fusion buffer (numpy, as the
    engine packs), in bytes per second."""
    tensors = [np.ones(n, np.float32) for n in sizes]
    buf = np.empty(sum(sizes), np.float32)
    np.concatenate(tensors, out=buf)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.concatenate(tensors, out=buf)
        best = min(best, time.perf_counter() - start)
    return buf.nbytes / best
