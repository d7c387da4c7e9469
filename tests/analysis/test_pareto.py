"""Pareto fit: exact recovery without noise, the batched fit equals scipy's, bootstrap accuracy/coverage."""

from __future__ import annotations

import numpy as np
import pytest
from synth_runs import coverage_draws, synth_runs, u_of

from analysis import flags, pareto
from analysis import metrics as m
from analysis.report import analyze_metric, headline

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
    with pytest.raises(pareto.TooFewBatchSizesError, match=r"\[16\] do not; \[64\] are censored .*target_loss"):
        pareto.check_enough(
            0.3, "eval/loss", np.array([8, 16, 32, 64]), np.array([5.0, np.inf, 3.0, np.inf]), np.arange(4) == 3
        )


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


def test_bootstrap_interval_two_sided_coverage_and_width():
    """90% interval over 80 simulated 3-seed sweeps (global stop, a diverging lr): coverage within a band around
    nominal AND width matching the spread of the estimates (an interval 1.5x too wide covers ~99%)."""
    r = coverage_draws(draws=80, bootstrap=200)
    assert 0.8 <= r["coverage"] <= 0.97
    assert 0.85 <= r["width_ratio"] <= 1.3
    assert r["median_error"] <= 0.06 and abs(r["bias"]) <= 0.03
    assert not r["flagged"].any()  # these targets are trustworthy: the headline holds all of them


@pytest.mark.slow
def test_bootstrap_interval_two_sided_coverage_and_width_large():
    r = coverage_draws(draws=300, bootstrap=1000)
    assert 0.85 <= r["coverage"] <= 0.95
    assert 0.85 <= r["width_ratio"] <= 1.2
    assert r["median_error"] <= 0.05 and abs(r["bias"]) <= 0.02


def _errors(draws: int, metric: str, target: float, truth: float, **kw) -> tuple[np.ndarray, list[dict]]:
    res = []
    for d in range(draws):
        runs = synth_runs(np.random.default_rng(1000 + d), **kw)
        res += analyze_metric(runs, metric, [target], bootstrap=0, strict=False, notes=[])
    return np.array([r["b_crit"] / truth - 1 for r in res]), res


def test_censoring_per_bin_target_after_a_global_stop():
    """Trials stop when eval/loss reaches 0.3; bin 0 has B_crit 1024 and prefers a 2x smaller lr, so at small batch
    sizes its best lr stops before the bin target and a slower lr that ran longer looks best (+47% B_crit when
    censoring is ignored). Censored batch sizes are left out of the fit and listed with the reason."""
    kw = dict(seeds=1, sigma=0.05, bins=1, stop_at=0.3, bin_e_min=(200 * 1024,), bin_lr_opt=(-1.0,))
    err, res = _errors(10, m.per_bin(m.EVAL_LOSS_BIN, 0), 0.4 * 1.5, 1024, diverge_factor=8, **kw)
    assert len(res) == 10 and abs(np.median(err)) < 0.1
    for r in res:
        assert flags.CENSORED_BATCH_SIZES in r["flags"]
        cens = r["censored_batch_sizes"]
        assert 16 in {c["batch_size"] for c in cens} | set(r["unreached_batch_sizes"])  # the smallest is out
        assert all("stopped at step" in c["reason"] and "reached_target" in c["reason"] for c in cens)
        assert not {c["batch_size"] for c in cens} & {p["batch_size"] for p in r["points"]}
        assert all(np.isfinite(c["steps_at_most"]) for c in cens)  # the slower lr's steps: an upper bound at most


def test_seeds_averaged_before_the_best_setting():
    """3 seeds, seed scatter larger at small batch sizes: the minimum over all trials is best-of-15 there and
    biased B_crit by -15%; seeds averaged per setting first leave the selection among 5 lrs only (-4%)."""
    err, res = _errors(20, m.EVAL_LOSS, 0.25, 256, seeds=3, sigma=0.1, sigma_power=0.25)
    assert abs(err.mean()) < 0.06
    assert all(r["ci_resamples"] == flags.CI_SEEDS and all(p["seeds"] == 3 for p in r["points"]) for r in res)


def test_one_seed_interval_says_it_resamples_trials():
    res = analyze_metric(synth_runs(np.random.default_rng(0), seeds=1), m.EVAL_LOSS, [0.3], bootstrap=20)
    assert res[0]["ci_resamples"] == flags.CI_TRIALS and res[0]["flags"] == []


def test_coarse_lr_grid_refined_between_grid_points():
    """The best lr drifts with B from a grid point (B=16) to half-way between two (B=4096): the plain minimum
    moves B_crit by -7%; the parabola in log-lr through the best point and its neighbours recovers it."""
    kw = dict(seeds=1, sigma=0.0, lr_factors=(0.125, 0.25, 0.5, 1, 2, 4), lr_opt=0.25, lr_drift=0.0625)
    r = analyze_metric(synth_runs(np.random.default_rng(0), diverge_factor=8, **kw), m.EVAL_LOSS, [0.3], bootstrap=0)
    assert r[0]["b_crit"] / 256 - 1 < -0.05
    assert r[0]["b_crit_refined"] == pytest.approx(256, rel=0.025)
    assert r[0]["flags"] == []


def test_flags_extrapolated_coarse_lr_at_edge_and_trustworthy_default():
    rng = np.random.default_rng
    ok = analyze_metric(synth_runs(rng(0), seeds=1), m.EVAL_LOSS, [0.3], bootstrap=0)[0]
    assert ok["flags"] == [] and headline([ok]) == [ok]
    ext = analyze_metric(synth_runs(rng(0), seeds=1, batch_sizes=(1024, 2048, 4096, 8192)), m.EVAL_LOSS, [0.3], 0)
    assert flags.EXTRAPOLATED in ext[0]["flags"] and headline(ext) == []
    coarse = analyze_metric(synth_runs(rng(0), seeds=1, n_evals=8), m.EVAL_LOSS, [0.3], bootstrap=0)[0]
    assert flags.COARSE_STEPS in coarse["flags"]
    assert all(flags.COARSE_STEPS in p["flags"] for p in coarse["points"])
    edge = analyze_metric(synth_runs(rng(0), seeds=1, lr_opt=-2.0), m.EVAL_LOSS, [0.3], bootstrap=0)[0]
    assert flags.LR_AT_EDGE in edge["flags"]
    assert all(flags.LR_AT_EDGE in p["flags"] for p in edge["points"])
    # the top lr diverges in the default sweep: a best lr just below it is not at the edge of what was tried
    assert not any(flags.LR_AT_EDGE in p["flags"] for p in ok["points"])


def test_near_floor_flagged_where_single_runs_cross_by_fluctuation():
    kw = dict(seeds=1, sigma=0.05, eval_noise=0.003, n_evals=200, budget_u=40)
    runs = synth_runs(np.random.default_rng(0), **kw)
    high, low = analyze_metric(runs, m.EVAL_LOSS, [0.3, 0.13], bootstrap=0)
    assert flags.NEAR_FLOOR not in high["flags"]
    assert flags.NEAR_FLOOR in low["flags"]


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


def test_readme_flag_table_is_current():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert flags.markdown_table() in readme, "README flag table is stale: paste `python -m analysis.flags`"


# --- auto_targets and the "trials" bootstrap against hand-computed answers (mutation testing, docs/testing.md) ---
def _auto(lowest, first=None, batch_size=(4, 4, 8, 8, 16, 16), ok=None, n=3):
    b = np.asarray(batch_size)
    first = np.ones(len(b)) if first is None else np.asarray(first, dtype=np.float64)
    ok = np.ones(len(b), bool) if ok is None else np.asarray(ok, dtype=bool)
    return pareto.auto_targets(b, ok, first, np.asarray(lowest, dtype=np.float64), n=n)


def test_auto_targets_known_answer():
    """Best loss per batch size 0.2 (B=4), 0.25 (B=8), 0.28 (B=16): the low end is the largest, 0.28, moved 0.1%
    of the way to the start 1.0 (0.28072); targets are geometric over the lower half of [0.28072, 1]: lo^(1 - q)
    for q = 0, 0.25, 0.5, rounded to 4 digits, descending."""
    want = [0.5298, 0.3857, 0.2807]  # 0.28072**0.5, 0.28072**0.75, 0.28072
    assert list(_auto([0.3, 0.2, 0.25, 0.35, 0.28, np.nan])) == want
    # a trial that is not usable (diverged, failed) counts neither for the low end nor for the start
    assert list(_auto([0.3, 0.2, 0.25, 0.35, 0.28, 0.01], first=[1, 1, 1, 1, 1, 50], ok=[1, 1, 1, 1, 1, 0])) == want
    # the start is the median first evaluation of the usable trials; a NaN first evaluation is left out
    assert list(_auto([0.3, 0.2, 0.25, 0.35, 0.28, 0.5], first=[1, 1, 1, 9, 9, np.nan])) == want
    assert len(_auto([0.3, 0.2, 0.25, 0.35, 0.28, 0.5], n=5)) == 5
    b, on = np.array([4, 4, 8, 8, 16, 16]), np.ones(6, bool)
    assert len(pareto.auto_targets(b, on, np.ones(6), np.array([0.3, 0.2, 0.25, 0.35, 0.28, 0.5]))) == 8  # default
    # a batch size whose every trial has no finite evaluation (all NaN) is left out, without a warning
    got = _auto([0.3, 0.2, 0.25, 0.35, 0.28, 0.5, np.nan, np.nan], batch_size=(4, 4, 8, 8, 16, 16, 32, 32))
    assert list(got) == want


def test_auto_targets_low_end_falls_back_to_the_third_batch_size():
    """B=32's best (1.5) never goes below the start (1.0): the low end is the third smallest best loss, 0.28."""
    got = _auto([0.2, 0.3, 0.25, 0.3, 0.28, 0.3, 1.5, 2.0], batch_size=(4, 4, 8, 8, 16, 16, 32, 32))
    assert list(got) == [0.5298, 0.3857, 0.2807]
    # the same when B=32 ends exactly at the start: it does not reach below it
    got = _auto([0.2, 0.3, 0.25, 0.3, 0.28, 0.3, 1.0, 2.0], batch_size=(4, 4, 8, 8, 16, 16, 32, 32))
    assert list(got) == [0.5298, 0.3857, 0.2807]


def test_auto_targets_linear_for_non_positive_losses():
    """Best per batch size -0.9, -0.7, -0.8: lo = -0.7 + 0.001·1.7 = -0.6983; linear over the lower half of
    [-0.6983, 1]: -0.6983, -0.2737, 0.1509. A low end of exactly 0 (-1 + 0.001·1000) is linear too."""
    got = _auto([-0.9, -0.5, -0.6, -0.7, -0.55, -0.8], n=3)
    assert list(got) == [0.1509, -0.2737, -0.6983]
    got = _auto([-1.0, -0.5, -1.2, -1.1, -1.3, -1.4], first=[999.0] * 6, n=3)
    assert list(got) == [499.5, 249.8, 0.0]


def test_auto_targets_refuses_what_no_three_batch_sizes_reach():
    with pytest.raises(pareto.TooFewBatchSizesError, match=r"fewer than 3 batch sizes .*have \[4, 8\]"):
        _auto([0.3, 0.2, 0.25, 0.35], batch_size=(4, 4, 8, 8))
    with pytest.raises(pareto.TooFewBatchSizesError, match="fewer than 3"):  # no usable first evaluation
        _auto([0.3, 0.2, 0.25, 0.35, 0.28, 0.3], first=[np.nan] * 6)
    with pytest.raises(pareto.TooFewBatchSizesError, match="no target below the starting loss 1 is reached"):
        _auto([1.2, 1.3, 1.1, 1.4, 1.5, 1.6])
    with pytest.raises(pareto.TooFewBatchSizesError, match="no target below the starting loss 1 is reached"):
        _auto([0.5, 0.6, 0.8, 0.9, 1.0, 1.2, 1.0, 1.1], batch_size=(4, 4, 8, 8, 16, 16, 32, 32))  # third = start


def _one_seed_settings(batch_size, lr):
    """Settings of one seed each (trial i is setting i), as settings_of builds them for a one-seed sweep."""
    from analysis.steps import Settings

    b = np.asarray(batch_size, dtype=np.int64)
    return Settings(np.arange(len(b)), b, np.asarray(lr, float), [np.array([i]) for i in range(len(b))], None)


def test_bootstrap_trials_draws_settings_within_each_batch_size():
    """One seed per setting: a replicate re-draws the settings of each batch size with replacement and takes the
    censoring-aware best. B=4: steps 10 or 12. B=8: 100 or 120. B=16: 50 (reached) and a setting stopped at 30
    without reaching (it might be faster): a replicate holding both is censored (nan), only the stopped one inf,
    only the reached one 50. B=32: 70 reached, another stopped exactly at 70 (it cannot be faster): never nan."""
    st = _one_seed_settings([4, 4, 8, 8, 16, 16, 32, 32], [1, 2, 1, 2, 1, 2, 1, 2])
    steps = np.array([[10.0, 12.0, 100.0, 120.0, 50.0, np.inf, 70.0, np.inf]])
    last = np.array([20.0, 20.0, 200.0, 200.0, 60.0, 30.0, 80.0, 70.0])
    bs, out = pareto.bootstrap_best(steps, last, st, 4000, np.random.default_rng(0), pareto.CI_TRIALS)
    assert bs.tolist() == [4, 8, 16, 32] and out.shape == (1, 4000, 4)
    r = np.round(out[0], 9)  # geometric means of one seed: exp(log(x)) within an ulp of x
    assert set(np.unique(r[:, 0])) == {10.0, 12.0} and set(np.unique(r[:, 1])) == {100.0, 120.0}
    assert np.mean(r[:, 0] == 12.0) == pytest.approx(0.25, abs=0.03)  # both draws the slower one: 1/4
    b16 = r[:, 2]
    assert np.mean(np.isnan(b16)) == pytest.approx(0.5, abs=0.03)  # one of each
    assert np.mean(b16 == 50.0) == pytest.approx(0.25, abs=0.03) and np.mean(np.isinf(b16)) == pytest.approx(
        0.25, abs=0.03
    )
    assert set(np.unique(r[:, 3][np.isfinite(r[:, 3])])) == {70.0} and not np.isnan(r[:, 3]).any()
