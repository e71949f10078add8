"""Gaussian-process regression and expected improvement with numpy alone, for autotune's Bayesian search.

The model: ``amplitude * Matern 5/2`` (one length scale per input dimension) plus white noise, on targets normalised
to mean 0 and variance 1, as scikit-learn's ``GaussianProcessRegressor(normalize_y=True)`` fits it. The
hyperparameters maximise the log marginal likelihood plus a weak log-normal prior on each length scale (centred on
0.3 of the input range, one e-fold wide). Without the prior, a handful of noisy points is often explained best by
a length scale at its bound (0.03: the model sees noise where the curve is smooth, 10: a setting seems not to
matter), and the search then settles early on a lucky sample; with it, on noisy objectives the kept point is as good
as the grid's best far more often (the figures are in ``docs/engine.md``). Written as
``amplitude * (Matern + ratio * I)``, the best amplitude for given length scales and noise ratio has a closed form,
so only those are searched: a grid over their log ranges (every point solved at once, batched), then a pattern
search around the best that halves its step. No random restarts: the same data give the same model. Autotune fits
at most a few dozen points, so this takes a few milliseconds on the engine's thread, and a plain install (numpy,
cloudpickle) has everything it needs.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

__all__ = ["GaussianProcess", "expected_improvement"]

_JITTER = 1e-10                 # added to the diagonal, as scikit-learn's default ``alpha``
_SQRT5 = math.sqrt(5.0)


def _matern52(distance: np.ndarray) -> np.ndarray:
    scaled = _SQRT5 * distance
    return (1.0 + scaled + scaled * scaled / 3.0) * np.exp(-scaled)


def _points(x) -> np.ndarray:
    """``x`` as a (points, dimensions) float array; a flat sequence is points of one dimension."""
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(-1, 1) if x.ndim < 2 else x


def _squared_differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b), dims): the squared difference of every pair, per dimension."""
    return (a[:, None, :] - b[None, :, :]) ** 2


class GaussianProcess:
    """A Gaussian-process regressor (Matern 5/2 with one length scale per dimension, white noise, fitted
    hyperparameters); ``fit`` then ``predict``, as scikit-learn's.

    Args:
        length_scale_bounds: the range of each length scale, in input units.
        amplitude_bounds: the range of the kernel's variance, in units of the targets' variance.
        noise_bounds: the range of the white noise, relative to the amplitude.
        length_scale_prior: (median, standard deviation of its natural log) of the log-normal prior on each length
            scale, or None for plain maximum likelihood.
        grid: grid points per hyperparameter before the pattern search.
    """

    def __init__(self, length_scale_bounds: Tuple[float, float] = (0.03, 10.0),
                 amplitude_bounds: Tuple[float, float] = (1e-2, 1e2), noise_bounds: Tuple[float, float] = (1e-6, 1.0),
                 length_scale_prior: Optional[Tuple[float, float]] = (0.3, 1.0), grid: int = 7):
        self.length_scale_bounds = length_scale_bounds
        self.length_scale_prior = length_scale_prior
        self.amplitude_bounds = amplitude_bounds
        self.noise_bounds = noise_bounds
        self.grid = max(2, grid)

    # -- fitting -----------------------------------------------------------------------------------------------------

    def fit(self, x, y) -> "GaussianProcess":
        """Fit to inputs ``x`` (points × dimensions) and targets ``y``; returns self.

        Sets ``length_scales``, ``amplitude``, ``noise`` (absolute, in normalised units), ``log_marginal_likelihood``
        and ``log_posterior`` (the likelihood plus the prior's log density, up to a constant: what the fit maximises).
        """
        self._x = _points(x)
        y = np.asarray(y, dtype=np.float64).ravel()
        if len(y) != len(self._x) or len(y) == 0:
            raise ValueError(f"a fit needs as many targets as points, at least one: {len(self._x)} and {len(y)}")
        self._y_mean = float(y.mean())
        spread = float(y.std())
        self._y_std = spread if spread > 1e-12 * max(1.0, abs(self._y_mean)) else 1.0
        self._y = (y - self._y_mean) / self._y_std
        self._sq = _squared_differences(self._x, self._x)
        low, high = self._log_bounds()
        best, score = self._grid_search(low, high)
        best, score = self._pattern_search(best, score, low, high, step=(high - low) / (2 * (self.grid - 1)))
        self._set(best, score)
        return self

    def _log_bounds(self) -> Tuple[np.ndarray, np.ndarray]:
        dims = self._x.shape[1]
        low = np.log([self.length_scale_bounds[0]] * dims + [self.noise_bounds[0]])
        high = np.log([self.length_scale_bounds[1]] * dims + [self.noise_bounds[1]])
        return low, high

    def _objective(self, params: np.ndarray) -> np.ndarray:
        """What the fit maximises: the log marginal likelihood plus the length scales' log prior."""
        values, _ = self._likelihood(params)
        if self.length_scale_prior is None:
            return values
        median, spread = self.length_scale_prior
        logs = params[:, :self._x.shape[1]]
        return values - 0.5 * (((logs - math.log(median)) / spread) ** 2).sum(axis=1)

    def _likelihood(self, params: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Log marginal likelihoods (and the best amplitudes) of a batch of (log length scales, log noise ratio)."""
        n, dims = len(self._y), self._x.shape[1]
        inverse_scales = np.exp(-2.0 * params[:, :dims])
        distance = np.sqrt(np.einsum("ijk,bk->bij", self._sq, inverse_scales))
        a = _matern52(distance) + (np.exp(params[:, dims]) + _JITTER)[:, None, None] * np.eye(n)
        sign, logdet = np.linalg.slogdet(a)
        targets = np.broadcast_to(self._y, (len(a), n))[..., None]
        quadratic = np.einsum("i,bi->b", self._y, np.linalg.solve(a, targets)[..., 0])
        amplitude = np.clip(quadratic / n, *self.amplitude_bounds)
        value = (-0.5 * quadratic / amplitude - 0.5 * n * np.log(amplitude) - 0.5 * logdet
                 - 0.5 * n * math.log(2 * math.pi))
        return np.where(sign > 0, value, -np.inf), amplitude

    def _grid_search(self, low: np.ndarray, high: np.ndarray) -> Tuple[np.ndarray, float]:
        axes = [np.linspace(lo, hi, self.grid) for lo, hi in zip(low, high)]
        params = np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(axes), -1).T
        values = self._objective(params)
        k = int(np.argmax(values))
        return params[k], float(values[k])

    def _pattern_search(self, best: np.ndarray, score: float, low: np.ndarray, high: np.ndarray,
                        step: np.ndarray, rounds: int = 40, smallest: float = 1e-3) -> Tuple[np.ndarray, float]:
        """Move to the best neighbour one step along any axis while that improves; else halve the steps."""
        moves = np.vstack([np.eye(len(best)), -np.eye(len(best))])
        for _ in range(rounds):
            if step.max() < smallest:
                break
            neighbours = np.clip(best + moves * step, low, high)
            values = self._objective(neighbours)
            k = int(np.argmax(values))
            if values[k] > score + 1e-12:
                best, score = neighbours[k], float(values[k])
            else:
                step = step / 2
        return best, score

    def _set(self, params: np.ndarray, score: float) -> None:
        dims = self._x.shape[1]
        likelihood, amplitude = self._likelihood(params[None, :])
        self.length_scales = np.exp(params[:dims])
        self.amplitude = float(amplitude[0])
        self.noise = float(np.exp(params[dims])) * self.amplitude
        self.log_marginal_likelihood = float(likelihood[0])
        self.log_posterior = score
        k = self._kernel(self._x) + (self.noise + _JITTER * self.amplitude) * np.eye(len(self._y))
        self._cholesky = np.linalg.cholesky(k)
        self._alpha = np.linalg.solve(k, self._y)

    def _kernel(self, x: np.ndarray) -> np.ndarray:
        squared = _squared_differences(x, self._x) / self.length_scales ** 2
        return self.amplitude * _matern52(np.sqrt(squared.sum(axis=2)))

    # -- predicting --------------------------------------------------------------------------------------------------

    def predict(self, x, return_std: bool = False):
        """The predicted mean at each point of ``x`` (and, with ``return_std``, its standard deviation, the white
        noise included, as scikit-learn's)."""
        cross = self._kernel(_points(x))
        mean = cross @ self._alpha * self._y_std + self._y_mean
        if not return_std:
            return mean
        v = np.linalg.solve(self._cholesky, cross.T)
        variance = self.amplitude + self.noise - np.einsum("ij,ij->j", v, v)
        return mean, np.sqrt(np.maximum(variance, 0.0)) * self._y_std


_erfc = np.frompyfunc(math.erfc, 1, 1)


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """The expected improvement over ``best`` of normal variables with ``mean`` and ``std`` (larger is better)."""
    std = np.maximum(np.asarray(std, dtype=np.float64), 1e-12)
    z = (np.asarray(mean, dtype=np.float64) - best) / std
    cdf = 0.5 * _erfc(-z / math.sqrt(2.0)).astype(np.float64)
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (mean - best) * cdf + std * pdf
