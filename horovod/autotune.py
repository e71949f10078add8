"""Autotune (``HOROVOD_AUTOTUNE=1``): Bayesian optimisation of the fusion threshold and cycle time, on rank 0.

Both knobs only matter on rank 0 here: rank 0 coordinates the global set (so it plans fusion) and starts every
cycle (so it applies the cycle time), which lets the tuner run on rank 0 alone without telling the other ranks.
(The response cache and hierarchical allreduce must switch on every rank in the same cycle, so the engine keeps
them as configured; :class:`BayesianSearch` models categorical settings like them, and the log records them.)

:class:`BayesianSearch` makes the decisions, pure and without a clock: Horovod's four seed points first, then a
Gaussian process (:class:`horovod.core.gaussian_process.GaussianProcess`, numpy alone, as on a plain install: Matern
5/2 with one length scale per setting under a weak prior, plus white noise of at most
``HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE`` times the signal's variance, targets normalised) fitted to every score so
far, and next the candidate with the largest expected improvement over the best predicted score. Candidates are a
fixed seeded set (a grid and random points), so the same scores make the same decisions. It settles when
``HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES`` candidates were scored or, after at least six, when no untried candidate is
expected to improve on the best predicted score by 1 %; it keeps the tried point with the highest predicted score
(the model averages out noisy samples) rather than the luckiest sample.

:class:`Autotuner` feeds it: each candidate is scored by bytes allreduced per second over
``HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE`` cycles that carried allreduces, counted from the first cycle after it was
chosen (the choosing is not its time), after ``HOROVOD_AUTOTUNE_WARMUP_SAMPLES`` discarded samples; the median of a
candidate's samples counts. An error in the search ends the tuning, never the job (this runs on the engine's
thread): the best point measured is kept, and the log's last row says why. Settings given explicitly
(``HOROVOD_FUSION_THRESHOLD``, ``HOROVOD_CYCLE_TIME``) stay fixed, as in Horovod. The log (``HOROVOD_AUTOTUNE_LOG``)
is Horovod's CSV, one row per candidate and the chosen one last, with a ``note`` column saying why each point was
tried and why the search settled (the same sentences go to the ``horovod.autotune`` logger at INFO).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from horovod.common.safe_files import open_for_writing
from horovod.core.gaussian_process import GaussianProcess, expected_improvement

__all__ = ["MIB", "SEEDS", "SAMPLES_PER_CANDIDATE", "CSV_HEADER", "FUSION", "CYCLE", "Dimension", "Decision",
           "BayesianSearch", "Autotuner"]

MIB = 1024 * 1024
SEEDS: Tuple[Tuple[float, float], ...] = ((4, 5), (32, 50), (16, 25), (8, 10))   # (fusion MiB, cycle ms)
SAMPLES_PER_CANDIDATE = 3
CSV_HEADER = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
              "tensor_fusion_threshold,score,note")

_log = logging.getLogger("horovod.autotune")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One tuned setting: ``low``..``high`` (``log``: on a log scale of ``value + offset``) or ``choices``."""

    name: str
    low: float = 0.0
    high: float = 1.0
    log: bool = False
    offset: float = 0.0
    choices: Tuple = ()

    def to_unit(self, value) -> float:
        """``value`` mapped to [0, 1]."""
        if self.choices:
            return self.choices.index(value) / max(1, len(self.choices) - 1)
        if self.log:
            lo, hi = math.log(self.low + self.offset), math.log(self.high + self.offset)
            return (math.log(value + self.offset) - lo) / (hi - lo)
        return (value - self.low) / (self.high - self.low)

    def from_unit(self, unit: float):
        """The setting at ``unit`` in [0, 1] (categorical: the nearest choice)."""
        unit = min(1.0, max(0.0, unit))
        if self.choices:
            return self.choices[int(round(unit * (len(self.choices) - 1)))]
        if self.log:
            lo, hi = math.log(self.low + self.offset), math.log(self.high + self.offset)
            return math.exp(lo + unit * (hi - lo)) - self.offset
        return self.low + unit * (self.high - self.low)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the search does next: try ``point`` (or, when ``settled``, keep it), and why."""

    point: Dict[str, object]
    settled: bool
    reason: str


class BayesianSearch:
    """Suggests settings to score, models the scores with a Gaussian process, and settles on the best."""

    def __init__(self, dims: Sequence[Dimension], seeds: Sequence[Dict[str, object]], max_samples: int,
                 noise: float = 0.8, min_samples: int = 6, settle_fraction: float = 0.01, candidates: int = 256,
                 seed: int = 0):
        self.dims = list(dims)
        self.max_samples = max(1, max_samples)
        self.noise = noise
        self.min_samples = min_samples
        self.settle_fraction = settle_fraction
        self._seeds = [{d.name: s[d.name] for d in self.dims} for s in seeds][:self.max_samples]
        self._candidates = self._make_candidates(candidates, seed)
        self.tried: List[Tuple[Dict[str, object], float]] = []

    # -- points ------------------------------------------------------------------------------------------------------

    def _unit(self, point: Dict[str, object]) -> np.ndarray:
        return np.array([d.to_unit(point[d.name]) for d in self.dims], dtype=np.float64)

    def _make_candidates(self, count: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        steps = [np.linspace(0, 1, len(d.choices) if d.choices else 9) for d in self.dims]
        grid = np.array(np.meshgrid(*steps)).reshape(len(self.dims), -1).T if self.dims else np.zeros((1, 0))
        randoms = rng.random((count, len(self.dims)))
        for i, d in enumerate(self.dims):       # categorical dimensions take their exact positions
            if d.choices:
                k = max(1, len(d.choices) - 1)
                randoms[:, i] = np.round(randoms[:, i] * k) / k
        return np.unique(np.vstack([grid, randoms]), axis=0)

    def _point(self, unit: np.ndarray) -> Dict[str, object]:
        return {d.name: d.from_unit(float(u)) for d, u in zip(self.dims, unit)}

    # -- the model ---------------------------------------------------------------------------------------------------

    def _fit(self) -> GaussianProcess:
        x = np.array([self._unit(p) for p, _ in self.tried])
        y = np.array([s for _, s in self.tried], dtype=np.float64)
        return GaussianProcess(noise_bounds=(1e-6, max(1e-4, self.noise))).fit(x, y)

    # -- decisions ---------------------------------------------------------------------------------------------------

    def observe(self, point: Dict[str, object], score: float) -> None:
        """Record the score of a point this search suggested."""
        self.tried.append((dict(point), float(score)))

    def next(self) -> Decision:
        """The next point to score, or the point to keep once settled."""
        n = len(self.tried)
        if n < len(self._seeds):
            return Decision(self._seeds[n], False, f"seed {n + 1} of {len(self._seeds)}")
        if not self.dims:
            return self._settle("nothing to tune: every setting is fixed")
        model = self._fit()
        seen = np.array([self._unit(p) for p, _ in self.tried])
        best_mean = float(np.max(model.predict(seen)))
        if n >= self.max_samples:
            return self._settle(f"the budget of {self.max_samples} samples is spent", model, seen)
        mean, std = model.predict(self._candidates, return_std=True)
        improvement = expected_improvement(mean, std, best_mean)
        fresh = np.abs(self._candidates[:, None, :] - seen[None, :, :]).max(axis=2).min(axis=1) > 1e-9
        improvement = np.where(fresh, improvement, -1.0)
        k = int(np.argmax(improvement))
        if n >= self.min_samples and improvement[k] < self.settle_fraction * abs(best_mean):
            return self._settle(f"no untried point is expected to improve on the best predicted score "
                                f"{best_mean:.4g} by {self.settle_fraction:.0%} (at most {improvement[k]:.3g})",
                                model, seen)
        return Decision(self._point(self._candidates[k]), False,
                        f"largest expected improvement {improvement[k]:.3g} (predicted {mean[k]:.4g} "
                        f"+- {std[k]:.3g}, best predicted so far {best_mean:.4g})")

    def _settle(self, why: str, model=None, seen: Optional[np.ndarray] = None) -> Decision:
        if model is None:
            point, score = max(self.tried, key=lambda t: t[1])
            return Decision(point, True, f"settled: {why}; keeping the best score {score:.4g}")
        predicted = model.predict(seen)
        k = int(np.argmax(predicted))
        return Decision(self.tried[k][0], True, f"settled: {why}; keeping the tried point with the highest "
                                                f"predicted score {predicted[k]:.4g} (measured {self.tried[k][1]:.4g})")


def _say(text: str) -> None:
    """One line for the person running the job (rank 0's stderr): what autotune does, each phase and its choice."""
    print(f"horovod autotune: {text}", file=sys.stderr, flush=True)


def _describe(point: Dict[str, object]) -> str:
    parts = [f"{point['fusion_mb']:.3g} MiB" if "fusion_mb" in point else "",
             f"{point['cycle_ms']:.3g} ms" if "cycle_ms" in point else ""]
    return ", ".join(p for p in parts if p) or "the fixed settings"


# The tuned settings: fusion threshold 0-64 MiB (log scale of MiB + 1), cycle time 1-100 ms (log scale).
FUSION = Dimension("fusion_mb", 0.0, 64.0, log=True, offset=1.0)
CYCLE = Dimension("cycle_ms", 1.0, 100.0, log=True)


class Autotuner:
    """Runs on rank 0: fed the bytes each cycle allreduced, it sets fusion threshold and cycle time."""

    def __init__(self, config, apply: Callable[[int, float], None], clock: Callable[[], float] = time.monotonic):
        self.apply = apply
        self.clock = clock
        self.steps_per_sample = max(1, config.autotune_steps_per_sample)
        self.warmup = config.autotune_warmup_samples
        self.log_path = config.autotune_log
        self.cache_enabled = config.cache_capacity > 0
        self.hierarchical = bool(config.hierarchical_allreduce)
        self.fixed_fusion = config.fusion_threshold if config.is_explicit("HOROVOD_FUSION_THRESHOLD") else None
        self.fixed_cycle = config.cycle_time if config.is_explicit("HOROVOD_CYCLE_TIME") else None
        dims = [d for d, fixed in ((FUSION, self.fixed_fusion), (CYCLE, self.fixed_cycle)) if fixed is None]
        seeds = [{"fusion_mb": f, "cycle_ms": c} for f, c in SEEDS]
        self.search = BayesianSearch(dims, seeds, config.autotune_bayes_opt_max_samples,
                                     noise=config.autotune_gaussian_process_noise)
        self._scores: List[float] = []
        self._cycles = 0
        self._bytes = 0
        self._start: Optional[float] = None
        self.done = False
        self._log_rows: List[str] = []
        self._announce(config)
        self._decide()

    def _announce(self, config) -> None:
        fixed = [f"{name} fixed at {value}" for name, value in (("fusion threshold", self.fixed_fusion),
                                                                 ("cycle time", self.fixed_cycle)) if value is not None]
        names = {"fusion_mb": "the fusion threshold", "cycle_ms": "the cycle time"}
        _say(f"tuning {' and '.join(names.get(d.name, d.name) for d in self.search.dims) or 'nothing'} on rank 0"
             f"{' (' + ', '.join(fixed) + ')' if fixed else ''}: {len(self.search._seeds)} seed points, then a "
             f"Bayesian search, at most {self.search.max_samples} candidates, each the median of "
             f"{SAMPLES_PER_CANDIDATE} samples of {self.steps_per_sample} cycles with allreduces (after {self.warmup} "
             f"warm-up samples); log: {config.autotune_log or 'none (--autotune-log-file)'}")

    def _decide(self) -> None:
        decision = self.search.next()
        self._point = decision.point
        self._apply(decision.point)
        self._reason = decision.reason
        _log.info("autotune: %s %.3g MiB, %.3g ms: %s", "keeps" if decision.settled else "tries",
                  self.current[0], self.current[1], decision.reason)
        if decision.settled:
            best = max((s for p, s in self.search.tried if p == decision.point), default=0.0)
            self._log(self.current, best, decision.reason)
            self.done = True
            _say(f"chose {self.current[0]:.3g} MiB, {self.current[1]:.3g} ms after {len(self.search.tried)} "
                 f"candidates ({decision.reason})")
        elif self.search.tried and len(self.search.tried) == len(self.search._seeds):
            point, score = max(self.search.tried, key=lambda t: t[1])
            _say(f"the {len(self.search.tried)} seed points are scored (best {_describe(point)}: {score:.4g} "
                 f"bytes/s); searching with a Gaussian process")

    def finish(self) -> None:
        """The job ends: when the search had not settled, say so once, in the log's last row too, with the best
        point measured (the job ran with the one being scored)."""
        if self.done:
            return
        self.done = True
        scored, most = len(self.search.tried), self.search.max_samples
        best = max(self.search.tried, key=lambda t: t[1]) if self.search.tried else None
        kept = f"the best measured was {_describe(best[0])} ({best[1]:.4g} bytes/s)" if best else "nothing was scored"
        why = (f"stopped: the job ended before the search settled, after {scored} of at most {most} candidates "
               f"(each needs {SAMPLES_PER_CANDIDATE} samples of {self.steps_per_sample} cycles with allreduces); "
               f"{kept}")
        fusion, cycle = self._values(best[0]) if best else (int(self.current[0] * MIB), self.current[1])
        self._log((fusion / MIB, cycle), best[1] if best else 0.0, why)
        _say(f"the search did not finish: {why[len('stopped: '):]}; a longer run, fewer "
             f"--autotune-bayes-opt-max-samples or --autotune-steps-per-sample finish it")

    def _values(self, point: Dict[str, object]) -> Tuple[int, float]:
        """``point`` as (fusion threshold in bytes, cycle time in ms), the fixed settings kept."""
        fusion_mb = point.get("fusion_mb", SEEDS[0][0])
        cycle_ms = point.get("cycle_ms", SEEDS[0][1])
        fusion = self.fixed_fusion if self.fixed_fusion is not None else int(round(fusion_mb * MIB))
        cycle = self.fixed_cycle if self.fixed_cycle is not None else round(cycle_ms, 3)
        return fusion, cycle

    def _apply(self, point: Dict[str, object]) -> None:
        fusion, cycle = self._values(point)
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
            score = float(np.median(self._scores))
            self._scores = []
            try:
                self.search.observe(self._point, score)
                self._log(self.current, score, self._reason)
                self._decide()
            except Exception as error:      # this runs on the engine's thread: tuning may end, the job must not
                self._stop(error)
            # The next point's first sample starts at the next cycle: the decision's own time (a Gaussian-process
            # fit on this thread, a few milliseconds) is not the point's. Charged to it, that cost the first sample
            # of every point after the seeds 15-25 % when the fit took 30-60 ms, and through the median of three,
            # the points themselves (the seeds, decided at no cost, were always kept).
            self._start = None

    def _stop(self, error: Exception) -> None:
        """End the search after ``error``, keeping the best point measured so far."""
        _log.warning("autotune: the search failed, so tuning stops here", exc_info=True)
        self.done = True
        if self.search.tried:
            self._point, score = max(self.search.tried, key=lambda t: t[1])
        else:
            score = 0.0
        self._apply(self._point)
        self._log(self.current, score, f"stopped: the search failed ({type(error).__name__}: {error}); keeping "
                                       f"the best point measured")

    def _log(self, point: Tuple[float, float], score: float, note: str) -> None:
        fusion_mb, cycle_ms = point
        note = note.replace('"', "'")
        self._log_rows.append(f"{int(self.hierarchical)},0,0,{int(self.cache_enabled)},{cycle_ms:g},"
                              f"{int(round(fusion_mb * MIB))},{score:.1f},\"{note}\"")
        if self.log_path:
            try:
                with open_for_writing(self.log_path, "the autotune log") as handle:
                    handle.write("\n".join([CSV_HEADER] + self._log_rows) + "\n")
            except OSError as error:        # the log is for people: tuning goes on without it
                _log.warning("autotune: cannot write the log %s (%s); tuning goes on without it", self.log_path, error)
                self.log_path = None
