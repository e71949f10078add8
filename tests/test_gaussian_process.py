"""Autotune's numpy Gaussian process against scikit-learn's (the model it replaces) and expected improvement against
scipy, where those are installed; and what it must do on its own: interpolate, admit noise, stay finite."""

import math
import warnings

import numpy as np
import pytest

from horovod.core.gaussian_process import GaussianProcess, expected_improvement

pytestmark = pytest.mark.unit


def _data(seed, n, noise=0.03):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 2))
    y = 1000 * np.exp(-3 * ((x[:, 0] - 0.6) ** 2 + (x[:, 1] - 0.3) ** 2)) * (1 + noise * rng.standard_normal(n))
    return x, y, rng.random((200, 2))


def _reference(kernels_module, length_scales=(0.3, 0.3), amplitude=1.0, noise=0.08, fixed=False):
    """scikit-learn's kernel as autotune used it (free hyperparameters), or fixed at the given values."""
    k, bounds = kernels_module, "fixed" if fixed else None
    return (k.ConstantKernel(amplitude, bounds or (1e-2, 1e2))
            * k.Matern(list(length_scales), bounds or (0.03, 10.0), nu=2.5)
            + k.WhiteKernel(noise, bounds or (1e-6, 1.0)))


@pytest.mark.parametrize("seed,n", [(1, 6), (2, 11), (3, 16), (4, 20)])
def test_maximum_likelihood_fit_reaches_scikit_learns(seed, n):
    """Without the prior, the fit is scikit-learn's: the same likelihood maximum and the same predictions."""
    gp_module = pytest.importorskip("sklearn.gaussian_process")
    kernels = pytest.importorskip("sklearn.gaussian_process.kernels")
    x, y, grid = _data(seed, n)
    reference = gp_module.GaussianProcessRegressor(_reference(kernels), normalize_y=True, n_restarts_optimizer=1,
                                                   random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference.fit(x, y)
    model = GaussianProcess(length_scale_prior=None).fit(x, y)
    assert model.log_marginal_likelihood >= reference.log_marginal_likelihood_value_ - 1e-3
    mean, std = model.predict(grid, return_std=True)
    ref_mean, ref_std = reference.predict(grid, return_std=True)
    scale = np.ptp(y)
    assert np.abs(mean - ref_mean).max() < 0.02 * scale and np.abs(std - ref_std).max() < 0.02 * scale


@pytest.mark.parametrize("seed,n", [(1, 1), (2, 6), (9, 8), (4, 20)])
def test_likelihood_and_predictions_equal_scikit_learns_at_the_fitted_hyperparameters(seed, n):
    gp_module = pytest.importorskip("sklearn.gaussian_process")
    kernels = pytest.importorskip("sklearn.gaussian_process.kernels")
    x, y, grid = _data(seed, n)
    model = GaussianProcess().fit(x, y)
    kernel = _reference(kernels, model.length_scales, model.amplitude, model.noise, fixed=True)
    reference = gp_module.GaussianProcessRegressor(kernel, normalize_y=True, optimizer=None).fit(x, y)
    assert model.log_marginal_likelihood == pytest.approx(reference.log_marginal_likelihood_value_, abs=1e-6)
    mean, std = model.predict(grid, return_std=True)
    ref_mean, ref_std = reference.predict(grid, return_std=True)
    scale = max(np.ptp(y), 1.0)
    assert np.allclose(mean, ref_mean, rtol=1e-6, atol=1e-6 * scale) and np.allclose(std, ref_std, atol=1e-6 * scale)


def test_the_prior_keeps_a_smooth_noisy_objective_smooth():
    """Eight noisy samples of a smooth bump (length scale ~0.4): plain maximum likelihood calls one setting pure noise
    (length scale at its 0.03 bound); the prior finds the bump, and predicts it better."""
    x, y, grid = _data(9, 8, noise=0.1)
    plain = GaussianProcess(length_scale_prior=None).fit(x, y)
    model = GaussianProcess().fit(x, y)
    assert plain.length_scales.min() == pytest.approx(0.03)
    assert np.all((model.length_scales > 0.2) & (model.length_scales < 0.8)), model.length_scales
    assert model.log_marginal_likelihood <= plain.log_marginal_likelihood        # the prior, not the data, moved it
    truth = 1000 * np.exp(-3 * ((grid[:, 0] - 0.6) ** 2 + (grid[:, 1] - 0.3) ** 2))
    assert np.abs(model.predict(grid) - truth).mean() < 0.5 * np.abs(plain.predict(grid) - truth).mean()


def test_expected_improvement_matches_scipy():
    norm = pytest.importorskip("scipy.stats").norm
    mean = np.array([1.0, 2.0, 0.5, -3.0, 1.2])
    std = np.array([0.5, 1e-15, 2.0, 0.1, 0.3])
    s = np.maximum(std, 1e-12)
    z = (mean - 1.2) / s
    assert np.allclose(expected_improvement(mean, std, 1.2), (mean - 1.2) * norm.cdf(z) + s * norm.pdf(z),
                       rtol=1e-12, atol=1e-300)
    assert expected_improvement(mean, std, 1.2)[4] == pytest.approx(0.3 / math.sqrt(2 * math.pi))


def test_noiseless_data_is_interpolated_and_noise_is_admitted():
    x = np.linspace(0, 1, 30)[:, None]
    smooth = np.sin(3 * x[:, 0])
    model = GaussianProcess().fit(x, smooth)
    assert np.allclose(model.predict(x), smooth, atol=1e-3) and model.noise < 1e-3
    rough = smooth + np.random.default_rng(0).normal(0, 0.3, len(smooth))
    assert GaussianProcess().fit(x, rough).noise > 100 * model.noise
    capped = GaussianProcess(noise_bounds=(1e-6, 1e-4)).fit(x, rough)
    assert capped.noise <= 1e-4 * capped.amplitude * (1 + 1e-9)


def test_flat_and_tiny_data_stay_finite():
    for x, y in (([[0.2, 0.4]], [5.0]), ([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]], [500.0, 500.0, 500.0])):
        mean, std = GaussianProcess().fit(x, y).predict(np.random.default_rng(0).random((50, 2)), return_std=True)
        assert np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.allclose(mean, y[0])
    with pytest.raises(ValueError, match="as many targets"):
        GaussianProcess().fit([[0.0], [1.0]], [1.0])
