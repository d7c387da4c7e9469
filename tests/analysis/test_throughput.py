"""Step time per split, measured and modelled (analysis.features.recommend.throughput), against float64 references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.features.recommend import throughput as th
from tests.oracles.synth_splits import SPLITS, TRUE_STEP, synth_split_runs, true_step_time


def brute_nnls_relative(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """float64 brute force: least squares on every subset of free coefficients (the others 0), the feasible
    (all >= 0) solution of least relative squared error."""
    xw, y = x / t[:, None], np.ones_like(t)
    best, best_c = np.inf, None
    for k in range(x.shape[1] + 1):
        for free in itertools.combinations(range(x.shape[1]), k):
            c = np.zeros(x.shape[1])
            if free:
                c[list(free)] = np.linalg.lstsq(xw[:, list(free)], y, rcond=None)[0]
            if (c >= -1e-12).all():
                err = ((xw @ c - y) ** 2).sum()
                if err < best - 1e-15:
                    best, best_c = err, c
    return best_c


@pytest.mark.parametrize("seed", range(6))
def test_nnls_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    splits = np.array(SPLITS)
    x = th.design(splits)
    t = true_step_time(splits) * np.exp(0.4 * rng.standard_normal(len(splits)))  # noisy: some bounds bind
    np.testing.assert_allclose(th.nnls_relative(x, t), brute_nnls_relative(x, t), rtol=1e-7, atol=1e-10)


def test_unconstrained_fit_is_the_normal_equations_solution():
    splits = np.array(SPLITS)
    t = true_step_time(splits) * np.exp(0.02 * np.random.default_rng(1).standard_normal(len(splits)))
    x = th.design(splits) / t[:, None]
    ref = np.linalg.solve(x.T @ x, x.T @ np.ones(len(t)))  # float64 normal equations of the relative error
    assert (ref > 0).all()
    np.testing.assert_allclose(th.fit_step_time(splits, t).coef, ref, rtol=1e-8)


def test_noise_free_step_times_give_the_true_coefficients():
    model = th.fit_step_time(np.array(SPLITS), true_step_time(SPLITS))
    np.testing.assert_allclose(model.coef, [TRUE_STEP[k] for k in ("gamma", "alpha", "beta", "kappa")], rtol=1e-9)
    assert model.rank == 4 and model.rms_log < 1e-12
    np.testing.assert_allclose(model.predict(np.array([[48, 3, 8]])), true_step_time([[48, 3, 8]]), rtol=1e-9)


def test_estimable_only_what_the_measured_splits_vary():
    no_accum_no_dp = np.array([[16, 1, 1], [32, 1, 1], [64, 1, 1]])
    model = th.fit_step_time(no_accum_no_dp, true_step_time(no_accum_no_dp))
    assert model.rank == 2
    ok = model.estimable(np.array([[128, 1, 1], [8, 1, 1], [32, 2, 1], [32, 1, 2]]))
    assert ok.tolist() == [True, True, False, False]
    np.testing.assert_allclose(model.predict(np.array([[128, 1, 1]])), true_step_time([[128, 1, 1]]), rtol=1e-9)


def test_measured_split_times_from_sys_metrics():
    runs = synth_split_runs(np.random.default_rng(0), sigma_t=0.0)
    times = th.measured_splits(runs)
    assert sorted(map(tuple, times.splits.tolist())) == sorted(SPLITS)
    np.testing.assert_allclose(times.step_s, true_step_time(times.splits), rtol=1e-12)
    assert (times.n_trials == 6).all()  # 3 learning rates x 2 seeds
    np.testing.assert_allclose(times.peak_gb, 1.0 + 0.01 * times.splits[:, 0], rtol=1e-12)
    mem = th.fit_memory(times)
    assert mem.m0 == pytest.approx(1.0) and mem.m1 == pytest.approx(0.01)


def test_no_sys_metrics_is_a_clear_error():
    runs = synth_split_runs(np.random.default_rng(0), sys_metrics=False)
    with pytest.raises(th.NoThroughputError, match="sys/examples_per_s"):
        th.measured_splits(runs)
