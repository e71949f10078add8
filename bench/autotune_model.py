"""Autotune's search on simulated throughput surfaces: the numpy Gaussian process against scikit-learn's.

    python bench/autotune_model.py [--objectives 100] [--seeds 120]    # the reference needs scikit-learn and scipy

No processes and no clock: ``autotune.BayesianSearch`` is driven to its decision on noisy samples (3 % and 10 %) of
known surfaces, and the point it keeps is scored by its true throughput against the best point of a dense grid.

- ``test``: the fake objective of ``tests/test_autotune.py`` (one smooth peak at 24 MiB, 3 ms), ``--seeds`` noise
  seeds at each noise level.
- ``random``: ``--objectives`` random surfaces: a peak anywhere in the range, of random width and tilt, with up to
  two smaller bumps, one noise seed at each noise level.

Models: ``sklearn`` is the model autotune used before (scikit-learn's ``GaussianProcessRegressor``, Matern 5/2 with
free length scales, white noise, one random restart; expected improvement is the same function, which matches
scipy's to 1e-12, ``tests/test_gaussian_process.py``);
``numpy`` and ``numpy, no prior`` are ``horovod.core.gaussian_process`` with and without its length-scale prior.
Prints one Markdown row per (model, surface set): kept / best (mean, 10th percentile), runs below 0.95, points
scored, and the time the decisions took.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from horovod.autotune import CYCLE, FUSION, SEEDS, BayesianSearch  # noqa: E402
from horovod.core.gaussian_process import GaussianProcess  # noqa: E402

_DENSE = [(2 ** a - 1, 2 ** b) for a in np.linspace(0, math.log2(65), 40) for b in np.linspace(0, math.log2(100), 40)]


def _test_objective(fusion_mb, cycle_ms):
    f, c = math.log2(fusion_mb + 1) - math.log2(25), math.log2(cycle_ms) - math.log2(3)
    return 1000.0 * math.exp(-0.08 * f * f - 0.12 * c * c)


def _random_objective(k):
    r = random.Random(k)
    pf, pc = r.uniform(0, 6.5), r.uniform(0, 6.6)
    af, ac, tilt = r.uniform(0.02, 0.3), r.uniform(0.02, 0.3), r.uniform(-0.05, 0.05)
    bumps = [(r.uniform(0, 6.5), r.uniform(0, 6.6), r.uniform(0, 0.3)) for _ in range(r.randint(0, 2))]

    def objective(fusion_mb, cycle_ms):
        x, y = math.log2(fusion_mb + 1), math.log2(cycle_ms)
        value = math.exp(-af * (x - pf) ** 2 - ac * (y - pc) ** 2 - tilt * (x - pf) * (y - pc))
        return 1000.0 * (value + sum(h * math.exp(-(x - bf) ** 2 - (y - bc) ** 2) for bf, bc, h in bumps))
    return objective


class _SklearnSearch(BayesianSearch):
    """The search with the model autotune used before."""

    def _fit(self):
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
        x = np.array([self._unit(p) for p, _ in self.tried])
        y = np.array([s for _, s in self.tried], dtype=np.float64)
        kernel = (ConstantKernel(1.0, (1e-2, 1e2)) * Matern([0.3] * len(self.dims), (0.03, 10.0), nu=2.5)
                  + WhiteKernel(max(1e-4, 0.1 * self.noise), (1e-6, 1.0)))
        model = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=1, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model.fit(x, y)


class _NoPriorSearch(BayesianSearch):
    """The numpy model by plain maximum likelihood."""

    def _fit(self):
        x = np.array([self._unit(p) for p, _ in self.tried])
        y = np.array([s for _, s in self.tried], dtype=np.float64)
        return GaussianProcess(noise_bounds=(1e-6, max(1e-4, self.noise)), length_scale_prior=None).fit(x, y)


def _drive(search_class, objective, noise, seed):
    """(kept / best, points scored, seconds deciding) of one search."""
    search = search_class([FUSION, CYCLE], [{"fusion_mb": f, "cycle_ms": c} for f, c in SEEDS], 20)
    rng, spent = random.Random(seed), 0.0
    while True:
        start = time.perf_counter()
        decision = search.next()
        spent += time.perf_counter() - start
        point = decision.point
        if decision.settled:
            best = max(objective(f, c) for f, c in _DENSE)
            return objective(point["fusion_mb"], point["cycle_ms"]) / best, len(search.tried), spent
        search.observe(point, objective(point["fusion_mb"], point["cycle_ms"]) * (1 + rng.gauss(0, noise)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objectives", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=120)
    parser.add_argument("--models", default="numpy,numpy-no-prior,sklearn")
    args = parser.parse_args()
    cases = {"test": [(_test_objective, noise, s) for s in range(args.seeds) for noise in (0.03, 0.10)],
             "random": [(_random_objective(k), noise, k) for k in range(args.objectives) for noise in (0.03, 0.10)]}
    models = {"numpy": BayesianSearch, "numpy-no-prior": _NoPriorSearch, "sklearn": _SklearnSearch}
    print("| model | surfaces | runs | kept / best: mean | 10th percentile | runs < 0.95 | points scored | "
          "deciding, per search |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for surfaces, runs in cases.items():
            results = [_drive(models[name], objective, noise, seed) for objective, noise, seed in runs]
            ratios = [r[0] for r in results]
            print(f"| {name} | {surfaces} | {len(runs)} | {statistics.mean(ratios):.4f} | "
                  f"{np.percentile(ratios, 10):.3f} | {sum(r < 0.95 for r in ratios)} | "
                  f"{statistics.mean(r[1] for r in results):.1f} | "
                  f"{statistics.mean(r[2] for r in results) * 1000:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
