"""Pareto fit: exact recovery without noise, the batched fit equals scipy's, bootstrap accuracy/coverage."""

from __future__ import annotations

import numpy as np
import pytest
from synth_runs import synth_runs, u_of

from analysis import metrics as m
from analysis import pareto
from analysis.report import analyze_metric

BS = np.array([16, 32, 64, 128, 256, 512, 1024, 2048], dtype=np.float64)


@pytest.mark.parametrize(("s_min", "e_min"), [(1000.0, 5.12e5), (37.0, 1.0e3), (5.0, 1.0e6)])
def test_exact_recovery_noise_free(s_min, e_min):
    fit = pareto.fit_pareto(BS, s_min + e_min / BS)
    assert fit.s_min == pytest.approx(s_min, rel=1e-8)
    assert fit.e_min == pytest.approx(e_min, rel=1e-8)
    assert fit.b_crit == pytest.approx(e_min / s_min, rel=1e-8)
    assert fit.rms_log < 1e-9


def test_fit_ignores_censored_and_needs_three():
    s = 100 + 25600 / BS
    s[[0, 3]] = np.inf
    assert pareto.fit_pareto(BS, s).b_crit == pytest.approx(256, rel=1e-8)
    with pytest.raises(pareto.TooFewBatchSizesError, match="need >= 3"):
        pareto.fit_pareto(BS[:2], s[1:3])


def test_batched_fit_matches_scipy():
    rng = np.random.default_rng(1)
    steps = (200 + 51200 / BS) * rng.lognormal(0, 0.2, (50, len(BS)))
    steps[3, [1, 5]] = np.inf  # censored entries are ignored
    steps[4, 2:] = np.inf  # too few points left -> nan
    s_min, e_min = pareto.fit_pareto_batched(BS, steps, p0=np.log([150.0, 6e4]))
    for r in [0, 1, 2, 3, 10, 49]:
        ref = pareto.fit_pareto(BS, steps[r])
        assert s_min[r] == pytest.approx(ref.s_min, rel=1e-6)
        assert e_min[r] == pytest.approx(ref.e_min, rel=1e-6)
    assert np.isnan(s_min[4]) and np.isnan(e_min[4])


def test_check_enough_names_missing_batch_sizes():
    with pytest.raises(pareto.TooFewBatchSizesError, match=r"only batch sizes \[8, 32\] reach it, \[16, 64\]"):
        pareto.check_enough(0.3, "eval/loss", np.array([8, 16, 32, 64]), np.array([5.0, np.inf, 3.0, np.inf]))


def test_percentile_ci():
    assert pareto.percentile_ci(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0))
    assert np.isnan(pareto.percentile_ci(np.array([np.nan]), 0.9)[0])


def _truth_and_fit(seed: int, bootstrap: int, targets=(0.3, 0.2)):
    runs = synth_runs(np.random.default_rng(seed), seeds=3, sigma=0.05)
    return analyze_metric(runs, m.EVAL_LOSS, list(targets), bootstrap=bootstrap, seed=seed), runs


def test_recovers_b_crit_within_10pct_with_bad_lrs_and_divergence():
    res, runs = _truth_and_fit(0, bootstrap=100)
    assert (runs.status == m.STATUS_DIVERGED).sum() > 0  # diverged trials present ...
    diverged = set(np.array(runs.trial_ids)[runs.status == m.STATUS_DIVERGED])
    for r in res:
        assert r["b_crit"] == pytest.approx(256, rel=0.10)
        assert r["s_min"] == pytest.approx(200 * u_of(r["target"]), rel=0.25)
        assert not diverged & {p["trial_id"] for p in r["points"]}  # ... and never a data point
        assert not diverged & set(r["censored"])
        lo, hi = r["b_crit_ci"]
        assert lo < r["b_crit"] < hi


def _coverage(draws: int, bootstrap: int) -> float:
    hits = []
    for d in range(draws):
        res, _ = _truth_and_fit(100 + d, bootstrap, targets=(0.25,))
        lo, hi = res[0]["b_crit_ci"]
        hits.append(lo <= 256 <= hi)
    return float(np.mean(hits))


def test_bootstrap_90pct_interval_coverage():
    assert _coverage(draws=40, bootstrap=100) >= 0.85


@pytest.mark.slow
def test_bootstrap_90pct_interval_coverage_large():
    assert _coverage(draws=300, bootstrap=500) >= 0.85


def test_auto_targets_reachable_by_all_batch_sizes():
    runs = synth_runs(np.random.default_rng(3), seeds=1)
    res = analyze_metric(runs, m.EVAL_LOSS, None, bootstrap=0, n_targets=5)
    targets = [r["target"] for r in res]
    assert len(targets) == 5 and targets == sorted(targets, reverse=True)
    n_bs = len(np.unique(runs.batch_size))
    assert all(len(r["points"]) == n_bs for r in res)
    assert all(r["b_crit_ci"] == [None, None] for r in res)  # no bootstrap asked for


def test_unreachable_target_error_names_batch_sizes():
    runs = synth_runs(np.random.default_rng(0), seeds=1, budget_u=3.0)
    with pytest.raises(pareto.TooFewBatchSizesError, match=r"target 0.1 on eval/loss: only batch sizes \[\]"):
        analyze_metric(runs, m.EVAL_LOSS, [0.1], bootstrap=0)
