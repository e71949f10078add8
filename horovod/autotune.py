"""Autotune (``HOROVOD_AUTOTUNE=1``): pick the fusion threshold and cycle time that move the most bytes per second.

Both knobs only matter on rank 0 here: rank 0 coordinates the global set (so it plans fusion) and starts every
cycle (so it applies the cycle time), which lets the tuner run on rank 0 alone without telling the other ranks.

The search is a fixed list of candidates rather than Horovod's Gaussian-process Bayesian optimisation: Horovod's four
seed points, then a coarse grid around the best so far, at most ``HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES`` candidates.
Each candidate is scored by bytes allreduced per second over ``HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE`` cycles that carried
allreduces, after ``HOROVOD_AUTOTUNE_WARMUP_SAMPLES`` discarded samples; the median of a candidate's samples counts.
Settings given explicitly (``HOROVOD_FUSION_THRESHOLD``, ``HOROVOD_CYCLE_TIME``) stay fixed, as in Horovod. The log
(``HOROVOD_AUTOTUNE_LOG``) is Horovod's CSV, one row per candidate, the last row the chosen one.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Optional, Tuple

__all__ = ["MIB", "SEEDS", "SAMPLES_PER_CANDIDATE", "CSV_HEADER", "candidates", "Autotuner"]

MIB = 1024 * 1024
SEEDS: Tuple[Tuple[float, float], ...] = ((4, 5), (32, 50), (16, 25), (8, 10))   # (fusion MiB, cycle ms)
SAMPLES_PER_CANDIDATE = 3
CSV_HEADER = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
              "tensor_fusion_threshold,score")


def candidates(limit: int, best: Optional[Tuple[float, float]] = None) -> List[Tuple[float, float]]:
    """The candidates to try: the seeds, then neighbours of ``best`` on a coarse grid (fusion × 2^k, cycle × 2^k)."""
    points = list(SEEDS)
    if best is not None:
        fusion, cycle = best
        for f, c in ((fusion * 2, cycle), (fusion / 2, cycle), (fusion, cycle * 2), (fusion, cycle / 2)):
            point = (min(64.0, max(0.0, f)), min(100.0, max(1.0, c)))
            if point not in points:
                points.append(point)
    return points[:max(1, limit)]


class Autotuner:
    """Runs on rank 0: fed the bytes each cycle allreduced, it sets fusion threshold and cycle time."""

    def __init__(self, config, apply: Callable[[int, float], None], clock: Callable[[], float] = time.monotonic):
        self.apply = apply
        self.clock = clock
        self.steps_per_sample = max(1, config.autotune_steps_per_sample)
        self.warmup = config.autotune_warmup_samples
        self.limit = max(1, config.autotune_bayes_opt_max_samples)
        self.log_path = config.autotune_log
        self.cache_enabled = config.cache_capacity > 0
        self.hierarchical = bool(config.hierarchical_allreduce)
        self.fixed_fusion = config.fusion_threshold if config.is_explicit("HOROVOD_FUSION_THRESHOLD") else None
        self.fixed_cycle = config.cycle_time if config.is_explicit("HOROVOD_CYCLE_TIME") else None
        self._queue = candidates(self.limit)
        self._tried: List[Tuple[Tuple[float, float], float]] = []
        self._scores: List[float] = []
        self._cycles = 0
        self._bytes = 0
        self._start: Optional[float] = None
        self._expanded = False
        self.done = False
        self._log_rows: List[str] = []
        self._set(self._queue[0])

    def _set(self, point: Tuple[float, float]) -> None:
        fusion_mb, cycle_ms = point
        fusion = self.fixed_fusion if self.fixed_fusion is not None else int(fusion_mb * MIB)
        cycle = self.fixed_cycle if self.fixed_cycle is not None else cycle_ms
        self.current = (fusion / MIB, cycle)
        self.apply(fusion, cycle)

    def record(self, nbytes: int) -> None:
        """Account one cycle that allreduced ``nbytes`` (cycles without allreduces are ignored)."""
        if self.done or nbytes <= 0:
            return
        now = self.clock()
        if self._start is None:
            self._start = now
            return
        self._cycles += 1
        self._bytes += nbytes
        if self._cycles < self.steps_per_sample:
            return
        score = self._bytes / max(now - self._start, 1e-9)
        self._cycles, self._bytes, self._start = 0, 0, now
        if self.warmup > 0:
            self.warmup -= 1
            return
        self._scores.append(score)
        if len(self._scores) >= SAMPLES_PER_CANDIDATE:
            self._finish_candidate(statistics.median(self._scores))

    def _finish_candidate(self, score: float) -> None:
        point = self._queue.pop(0)
        self._tried.append((point, score))
        self._log(self.current, score)
        self._scores = []
        if not self._queue and not self._expanded:
            self._expanded = True
            best = max(self._tried, key=lambda t: t[1])[0]
            tried = {p for p, _ in self._tried}
            self._queue = [p for p in candidates(self.limit + 4, best) if p not in tried][:max(0, self.limit -
                                                                                            len(self._tried))]
        if self._queue:
            self._set(self._queue[0])
            return
        best_point, best_score = max(self._tried, key=lambda t: t[1])
        self._set(best_point)
        self._log(self.current, best_score)
        self.done = True
        self._write()

    def _log(self, point: Tuple[float, float], score: float) -> None:
        fusion_mb, cycle_ms = point
        self._log_rows.append(f"{int(self.hierarchical)},0,0,{int(self.cache_enabled)},{cycle_ms:g},"
                              f"{int(fusion_mb * MIB)},{score:.1f}")
        self._write()

    def _write(self) -> None:
        if self.log_path:
            with open(self.log_path, "w") as handle:
                handle.write("\n".join([CSV_HEADER] + self._log_rows) + "\n")
