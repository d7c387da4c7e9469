"""Pareto fit: exact recovery without noise, the batched fit equals scipy's, bootstrap accuracy/coverage."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits import flags, pareto
from analysis.fits.sweep_fit import analyze_metric
from analysis.fits.trust import headline
from tests.oracles.synth_runs import coverage_draws, synth_runs, u_of

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
    r = coverage_draws(draws=80, bootstrap=200, processes=2)
    assert 0.8 <= r["coverage"] <= 0.97
    assert 0.85 <= r["width_ratio"] <= 1.3
    assert r["median_error"] <= 0.06 and abs(r["bias"]) <= 0.03
    assert not r["flagged"].any()  # these targets are trustworthy: the headline holds all of them


@pytest.mark.slow
def test_bootstrap_interval_two_sided_coverage_and_width_large():
    r = coverage_draws(draws=300, bootstrap=1000, processes=2)
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


def test_docs_flag_table_is_current():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "analysis.md").read_text()
    assert flags.markdown_table() in page, "docs/analysis.md flag table is stale: paste `python -m analysis.fits.flags`"


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
    from analysis.fits.steps import Settings

    b = np.asarray(batch_size, dtype=np.int64)
    return Settings(b, np.asarray(lr, float), [np.array([i]) for i in range(len(b))], None)


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


# --- known answers of the fit's parts, the batched LM, the seeds bootstrap and the refusal message ---


def _wls_by_hand(x, s):
    """argmin over (a, b) of Σ((a + b x - S)/S)²: the 2x2 normal equations with weights 1/S², solved by Cramer."""
    w = 1.0 / s**2
    sw, swx, swxx, sws, swxs = w.sum(), (w * x).sum(), (w * x * x).sum(), (w * s).sum(), (w * x * s).sum()
    det = sw * swxx - swx**2
    return (sws * swxx - swx * swxs) / det, (sw * swxs - swx * sws) / det


def test_init_solves_relative_least_squares_and_clips_at_the_floor():
    """Exact hyperbola: the start is (S_min, E_min) itself. Noisy data: the hand-solved relative least squares.
    A negative coefficient is clipped to 1e-3 of the smallest S (S_min) or of the smallest S·B (E_min)."""
    x = 1.0 / BS
    for s_min, e_min in [(1000.0, 5.12e5), (5.0, 1.0e6), (3000.0, 100.0)]:
        p = pareto._init(x, s_min + e_min * x)
        assert np.exp(p) == pytest.approx([s_min, e_min], rel=1e-10)
    s = (200 + 51200 * x) * np.exp(0.2 * np.sin(np.arange(len(x))))
    assert np.exp(pareto._init(x, s)) == pytest.approx(_wls_by_hand(x, s), rel=1e-10)
    s_rising = 100.0 + 0.05 * BS  # S grows with B: the E_min coefficient is negative
    a, b = _wls_by_hand(x, s_rising)
    assert b < 0
    assert np.exp(pareto._init(x, s_rising)) == pytest.approx([a, 1e-3 * s_rising.min() * BS.min()], rel=1e-10)
    s_pure = 51200 * x - 10.0  # below the pure E_min/B hyperbola: the S_min coefficient is negative
    a, b = _wls_by_hand(x, s_pure)
    assert a < 0
    assert np.exp(pareto._init(x, s_pure)) == pytest.approx([1e-3 * s_pure.min(), b], rel=1e-10)


def _grad(b, s, p):
    """Gradient of Σ(log(S_min + E_min/B) - log S)² in (log S_min, log E_min), by hand."""
    s_min, e_min = np.exp(p)
    model = s_min + e_min / b
    r = np.log(model) - np.log(s)
    return np.array([2 * np.sum(r * s_min / model), 2 * np.sum(r * (e_min / b) / model)])


def test_fit_pareto_is_the_least_squares_optimum_on_noisy_data():
    """Multiplicative noise: the returned point zeroes the gradient of Σ(log S - log(S_min + E_min/B))² (by
    hand), beats every point of a grid around it, and rms_log is the residual rms at that point."""
    rng = np.random.default_rng(3)
    for s_min, e_min, sd in [(200.0, 51200.0, 0.3), (1000.0, 2e4, 0.2), (20.0, 2e6, 0.2)]:
        s = (s_min + e_min / BS) * rng.lognormal(0, sd, len(BS))
        fit = pareto.fit_pareto(BS, s)
        p = np.log([fit.s_min, fit.e_min])
        assert _grad(BS, s, p) == pytest.approx([0, 0], abs=1e-7)  # scipy stops at gtol=1e-8
        r = np.log(fit.s_min + fit.e_min / BS) - np.log(s)
        assert fit.rms_log == pytest.approx(np.sqrt(np.mean(r**2)), rel=1e-9)
        d = np.linspace(-0.01, 0.01, 11)
        grid = p[None, :] + np.stack(np.meshgrid(d, d), -1).reshape(-1, 2)
        costs = [np.sum((np.logaddexp(g[0], g[1] - np.log(BS)) - np.log(s)) ** 2) for g in grid]
        assert np.sum(r**2) <= min(costs) + 1e-15


def test_fit_pareto_known_residual_and_dropped_points():
    """Log residuals ±0.1 alternating on 4 points of an exact hyperbola, symmetric in 1/B... rms_log is the
    residual rms at the optimum; steps <= 0, nan or inf are dropped; steps below 1 (any unit) are kept."""
    b = np.array([16.0, 64.0, 256.0, 1024.0])
    s = 100 + 25600 / b
    fit = pareto.fit_pareto(np.r_[b, 32, 128, 512], np.r_[s, 0.0, np.nan, -5.0])
    assert (fit.s_min, fit.e_min) == pytest.approx((100.0, 25600.0), rel=1e-10)
    small = pareto.fit_pareto(b, s * 1e-3)  # steps in thousands: the same fit, scaled
    assert (small.s_min, small.e_min) == pytest.approx((0.1, 25.6), rel=1e-10)
    with pytest.raises(pareto.TooFewBatchSizesError) as err:
        pareto.fit_pareto(b, np.r_[s[:2], 0.0, np.inf])
    assert str(err.value) == "need >= 3 batch sizes with finite steps, got 2"


def test_fit_pareto_float32_and_integer_inputs_are_fitted_in_float64():
    """Exactly representable float32 / int inputs give the float64 fit to 1e-12 (float32 logs would lose 1e-7)."""
    s = 1000 + 2.0**20 / BS  # integers below 2**24: exact in float32
    ref = pareto.fit_pareto(BS, s)
    for b_in, s_in in [(BS.astype(np.float32), s), (BS, s.astype(np.float32)), (BS.astype(np.int64), s)]:
        fit = pareto.fit_pareto(b_in, s_in)
        assert (fit.s_min, fit.e_min) == pytest.approx((ref.s_min, ref.e_min), rel=1e-12)
        assert (fit.s_min, fit.e_min) == pytest.approx((1000.0, 2.0**20), rel=1e-12)


def _hard_replicates(rng):
    """Replicates of every shape the bootstrap meets, far from the common start: S_min or E_min dominating
    (B_crit far outside the batch sizes), heavy noise, few points, nan/inf/zero/negative entries."""
    rows = []
    for s_min, e_min, sd in [
        (200.0, 51200.0, 0.2),
        (1e4, 1e3, 0.05),  # S_min dominates: B_crit 0.1
        (1.0, 1e7, 0.05),  # E_min dominates: B_crit 1e7
        (50.0, 5e4, 0.6),
        (3.0, 300.0, 0.1),
    ]:
        for _ in range(8):
            rows.append((s_min + e_min / BS) * rng.lognormal(0, sd, len(BS)))
    steps = np.array(rows)
    steps[1, [0, 7]] = np.inf
    steps[2, [2, 3, 4]] = np.nan
    steps[3, 5] = 0.0
    steps[4, 1] = -3.0
    steps[9, 3:] = np.inf  # three points left
    steps[17, :5] = np.nan  # three points left, at the large batch sizes
    steps[25, [0, 1, 2, 3, 4, 6]] = np.inf  # two points left -> nan
    steps[33, :] = np.nan
    return steps


def test_batched_fit_equals_scipy_on_hard_replicates():
    """fit_pareto_batched (60 LM iterations from one start) equals fit_pareto (to 2e-6 where E_min is
    barely determined; scipy stops at gtol 1e-8) and reaches a cost no higher than scipy's on every replicate with
    >= 3 usable points; nan for the others."""
    steps = _hard_replicates(np.random.default_rng(7))
    for p0 in (np.log([150.0, 6e4]), np.log([2e3, 1e5])):
        s_min, e_min = pareto.fit_pareto_batched(BS, steps, p0)
        for r in range(len(steps)):
            keep = np.isfinite(steps[r]) & (steps[r] > 0)
            if keep.sum() < 3:
                assert np.isnan(s_min[r]) and np.isnan(e_min[r]), r
                continue
            ref = pareto.fit_pareto(BS, steps[r])
            # at an optimum on the boundary (S_min or E_min -> 0) compare against the other term's scale
            assert s_min[r] == pytest.approx(ref.s_min, rel=2e-6, abs=1e-9 * ref.e_min / BS[-1]), (r, p0)
            assert e_min[r] == pytest.approx(ref.e_min, rel=2e-6, abs=1e-9 * ref.s_min * BS[0]), (r, p0)
            y = np.log(np.where(keep, steps[r], 1.0))
            cost = np.sum(np.where(keep, np.log(s_min[r] + e_min[r] / BS) - y, 0) ** 2)
            assert cost <= ref.rms_log**2 * keep.sum() * (1 + 1e-9), (r, p0)


def test_batched_fit_exact_data_with_gaps_float32_batch_sizes_and_small_steps():
    """Noise-free replicates with missing entries are recovered to 1e-12; float32 batch sizes (exact powers of two)
    give the float64 answer; a start 20x off converges within
    the 60 iterations; steps below 1 and exactly 3 points are fitted, not dropped."""
    steps = np.tile(1000 + 2.0**20 / BS, (4, 1))
    steps[1, [0, 3]] = np.nan
    steps[2, [1, 2, 5, 6, 7]] = np.inf
    steps[3] *= 1e-5  # every step below 1
    want_s, want_e = np.array([1e3, 1e3, 1e3, 0.01]), np.array([2.0**20] * 3 + [2.0**20 * 1e-5])
    for b, off in [(BS, [0.5, 0.5]), (BS.astype(np.float32), [0.5, 0.5]), (BS, [3.0, -3.0])]:
        s_min, e_min = pareto.fit_pareto_batched(b, steps, np.log([1e3, 2.0**20]) + off)
        assert s_min == pytest.approx(want_s, rel=1e-12) and e_min == pytest.approx(want_e, rel=1e-12)


def _seed_settings(groups):
    """Settings whose members are consecutive trial rows; groups: [(batch size, n_seeds), ...]."""
    from analysis.fits.steps import Settings

    members, start = [], 0
    for _, k in groups:
        members.append(np.arange(start, start + k))
        start += k
    b = np.array([g[0] for g in groups], dtype=np.int64)
    return Settings(b, np.arange(len(b), dtype=float), members, None)


def test_ci_resamples_seeds_from_two_seeds_per_setting():
    assert pareto.ci_resamples(_seed_settings([(4, 2), (8, 2), (16, 2)])) == flags.CI_SEEDS
    assert pareto.ci_resamples(_seed_settings([(4, 1), (8, 1), (16, 2)])) == flags.CI_TRIALS


def test_bootstrap_seeds_adjusted_residuals_variance_and_support():
    """One setting per batch size: 3 seeds at B=4, 2 at B=8, 1 at B=16. A replicate is exp(xbar + c·mean of k
    drawn residuals) with c = sqrt(k/(k-1)): its values lie on that finite support, and its log-variance is the
    seeds' sample variance / k (the plain bootstrap gives (k-1)/k of it). One seed: always that seed."""
    st = _seed_settings([(4, 3), (8, 2), (16, 1)])
    logs = np.array([0.0, 0.1, 0.5, 1.0, 1.4, 0.0]) + np.log(100.0)  # skewed residuals at B=4
    steps = np.exp(logs)[None, :]
    bs, out = pareto.bootstrap_best(steps, np.zeros(6), st, 20000, np.random.default_rng(0), pareto.CI_SEEDS)
    assert bs.tolist() == [4, 8, 16] and out.shape == (1, 20000, 3)
    lo = np.log(out[0])
    for col, x in [(0, logs[:3]), (1, logs[3:5])]:
        k = len(x)
        e = x - x.mean()
        support = [x.mean() + np.sqrt(k / (k - 1)) * e[list(c)].mean() for c in np.ndindex(*(k,) * k)]
        assert np.min(np.abs(lo[:, col, None] - np.array(support)[None, :]), axis=1).max() < 1e-12
        assert np.var(lo[:, col]) == pytest.approx(np.var(x, ddof=1) / k, rel=0.04)
    assert np.allclose(out[0, :, 2], steps[0, 5], rtol=1e-13)


def test_bootstrap_seeds_censored_seed_with_no_evaluation():
    """B=4: setting A's seeds reached at 100 and 100; setting B has one seed at 40000 and one stopped before any
    evaluation (last step 0): its lower bound is 0, so B=4 is censored (nan) whenever... always, since B's
    draws contain the unreached seed or not: with it, lower bound 0 < 100 -> nan; without, B = 40000 > 100 -> 100
    (a floor of 1 on the last step would give sqrt(40000) = 200 > 100: never censored).
    B=8: seeds 50, 60 and 40, 45 (known, no censoring)."""
    st = _seed_settings([(4, 2), (4, 2), (8, 2), (8, 2)])
    steps = np.array([[100.0, 100.0, 4e4, np.inf, 50.0, 60.0, 40.0, 45.0]])
    last = np.array([100.0, 100.0, 4e4, 0.0, 50.0, 60.0, 40.0, 45.0])
    _, out = pareto.bootstrap_best(steps, last, st, 4000, np.random.default_rng(1), pareto.CI_SEEDS)
    b4 = out[0, :, 0]
    assert np.mean(np.isnan(b4)) == pytest.approx(0.75, abs=0.03)  # the stopped seed drawn at least once
    assert np.allclose(b4[~np.isnan(b4)], 100.0, rtol=1e-13)
    assert np.isfinite(out[0, :, 1]).all() and (out[0, :, 1] < 60).all()


def test_check_enough_full_messages():
    b = np.array([8, 16, 32, 64])
    best = np.array([5.0, np.inf, 3.0, np.inf])
    with pytest.raises(pareto.TooFewBatchSizesError) as err:
        pareto.check_enough(0.3, "eval/loss", b, best)
    assert str(err.value) == (
        "target 0.3 on eval/loss: only batch sizes [8, 32] reach it, [16, 64] do not (need >= 3); pick a higher target"
    )
    with pytest.raises(pareto.TooFewBatchSizesError) as err:
        pareto.check_enough(0.25, "eval/loss", b, best, [0, 1, 0, 1])  # 0/1 flags
    assert str(err.value) == (
        "target 0.25 on eval/loss: only batch sizes [8, 32] reach it, [] do not; [16, 64] are censored (trials "
        "stopped before reaching it: lower the sweep's stopping.target_loss or raise max_steps) (need >= 3); "
        "pick a higher target"
    )
    pareto.check_enough(0.3, "eval/loss", b, np.array([5.0, 4.0, 3.0, np.inf]))  # three reach: no error


def test_fit_pareto_converges_tightly_where_e_min_dominates():
    """B_crit ~ 1.5e5, far above the largest batch size, with noise: S_min is weakly determined. The fit lands within
    1e-6 (relative) of the optimum that Newton's method finds in extended precision (np.longdouble: gradient ~1e-17),
    where double-precision LM stalls: the cost no longer changes in float64, at a hand gradient of ~4e-11 and 1.3e-7
    away in S_min on one CPU, closer on another (the bound is on the distance, not on the CPU's rounding). The batched
    LM of the bootstrap, started from its own start, lands there too."""
    s = np.array([421810.37737908, 204918.87947173, 110224.37889922, 53482.68706569])
    s = np.r_[s, 25603.64782807, 12872.5515389, 6447.05449666, 3380.03973874]
    fit = pareto.fit_pareto(BS, s)
    p = np.log([fit.s_min, fit.e_min])
    assert np.abs(_grad(BS, s, p)).max() < 1e-10
    q = _newton_longdouble(BS, s, p)
    assert np.abs(_grad_longdouble(BS, s, q)).max() < 1e-15
    best = np.exp(q.astype(np.float64))
    assert (fit.s_min, fit.e_min, fit.b_crit) == pytest.approx((best[0], best[1], best[1] / best[0]), rel=1e-6)
    s_min, e_min = pareto.fit_pareto_batched(BS, s[None, :], pareto._init(1.0 / BS, s))
    assert (s_min[0], e_min[0]) == pytest.approx((best[0], best[1]), rel=1e-6)


def _grad_longdouble(b, s, p):
    """``_grad`` in extended precision (its numpy operations keep the longdouble inputs' precision)."""
    return _grad(*(np.asarray(v, dtype=np.longdouble) for v in (b, s, p)))


def _newton_longdouble(b, s, p, iters: int = 8):
    """Newton's method on the log-space least squares in extended precision (Hessian by central differences)."""
    p, h = np.asarray(p, dtype=np.longdouble), np.longdouble(1e-6)
    for _ in range(iters):
        hess = np.stack([(_grad_longdouble(b, s, p + h * e) - _grad_longdouble(b, s, p - h * e)) / (2 * h)
                         for e in np.eye(2, dtype=np.longdouble)], axis=1)  # fmt: skip
        p = p - np.linalg.solve(hess.astype(np.float64), _grad_longdouble(b, s, p).astype(np.float64))
    return p


def test_interval_at_a_target_does_not_depend_on_the_other_targets():
    """Each target's lack-of-fit draws and calibration have their own stream (sweep_fit.target_rng): the interval
    at 0.2 is the same analysed alone, after 0.3, or among the automatic targets; a different seed moves it."""
    runs = synth_runs(np.random.default_rng(3))
    alone = analyze_metric(runs, m.EVAL_LOSS, [0.2], bootstrap=200, seed=5)[0]
    pair = analyze_metric(runs, m.EVAL_LOSS, [0.3, 0.2], bootstrap=200, seed=5)[1]
    assert pair["target"] == 0.2 and alone["ci_level"] == pair["ci_level"]
    assert alone["b_crit_ci"] == pair["b_crit_ci"]
    auto = analyze_metric(runs, m.EVAL_LOSS, None, bootstrap=200, seed=5)
    again = analyze_metric(runs, m.EVAL_LOSS, [auto[-1]["target"]], bootstrap=200, seed=5)[0]
    assert again["b_crit_ci"] == auto[-1]["b_crit_ci"]
    other = analyze_metric(runs, m.EVAL_LOSS, [0.2], bootstrap=200, seed=6)[0]
    assert other["b_crit_ci"] != alone["b_crit_ci"]


def test_ci_resamples_judged_on_the_fitted_points():
    """An adaptive sweep's shape: 3 seeds at each batch size's best setting, 1 at two neighbours. Over every setting
    the median is 1 seed; over the points the fit stands on, 3: the points' seeds are what the interval resamples."""
    st = _seed_settings([(4, 3), (4, 1), (4, 1), (8, 3), (8, 1), (8, 1), (16, 1), (16, 3), (16, 1)])
    assert pareto.ci_resamples(st) == flags.CI_TRIALS
    assert pareto.ci_resamples(st, np.array([0, 3, 7, -1])) == flags.CI_SEEDS  # -1: a batch size without a best
    assert pareto.ci_resamples(st, np.array([1, 4, 7])) == flags.CI_TRIALS
    assert pareto.ci_resamples(st, np.array([0, -1, -1])) == flags.CI_SEEDS  # -1 is no setting (not the last one)


def _only(runs, keep):
    """The runs restricted to the trials where ``keep`` (one bool per trial) holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from analysis.sources.loaders import runs_from_tables

    ids = pa.array([t for t, k in zip(runs.trial_ids, keep, strict=True) if k])
    pick = [pc.is_in(pc.cast(t.column("trial_id"), pa.string()), ids) for t in (runs.trials, runs.metrics)]
    return runs_from_tables(runs.trials.filter(pick[0]), runs.metrics.filter(pick[1]), source="synthetic")


def test_one_seed_neighbours_that_never_win_leave_the_interval_unchanged():
    """The interval is the bootstrap of the best setting per batch size. Add, at every batch size, one-seed trials
    at learning rates 1.3x-2.2x slower than the best (the neighbours an adaptive sweep tries once): with 3% seed
    scatter no replicate picks them, so the replicates, the lack of fit, each point's degrees of freedom and hence
    the interval are exactly those of the best settings alone. (Judged over every setting, the median of 1 seed
    had turned this into a bootstrap of learning rates, and the interval into another.)"""
    full = synth_runs(np.random.default_rng(7), seeds=3, sigma=0.03, batch_sizes=(16, 64, 256, 1024, 4096))
    lr = full.trials.column("lr").to_numpy()
    seed = full.trials.column("seed").to_numpy()
    best = np.isclose(lr, 1e-3 * np.sqrt(full.batch_size / 256))  # lr factor 1: the optimum
    alone = _only(full, best)
    shaped = _only(full, best | (seed == 0))  # + 4 one-seed lrs per batch size (the largest diverges)
    a = analyze_metric(alone, m.EVAL_LOSS, [0.3], bootstrap=400)[0]
    b = analyze_metric(shaped, m.EVAL_LOSS, [0.3], bootstrap=400)[0]
    assert all(p["lr"] == q["lr"] and p["seeds"] == 3 for p, q in zip(a["points"], b["points"], strict=True))
    assert a["ci_resamples"] == b["ci_resamples"] == flags.CI_SEEDS
    # equal up to float rounding: the crossing fit (analysis.fits.crossing) sums over slabs as wide as the widest trial
    assert b["b_crit_ci"] == pytest.approx(a["b_crit_ci"], rel=1e-9) and b["ci_level"] == a["ci_level"]
    assert b["b_crit_ci"][0] < b["b_crit"] < b["b_crit_ci"][1]


def test_variance_dof_per_fitted_point():
    """Each fitted point's variance rests on its best setting's seeds - 1 (at least 1), whatever the other settings
    hold; resampling trials, on the settings per batch size - 1. Batch sizes without a finite point are left out."""
    from analysis.fits.steps import BestPerBatch
    from analysis.fits.sweep_fit import _variance_dof

    st = _seed_settings([(4, 3), (4, 1), (8, 2), (8, 1), (16, 1), (16, 3), (32, 1)])
    best = BestPerBatch(np.array([4, 8, 16, 32]), np.array([10.0, 8.0, 7.0, np.inf]), np.array([0, 2, 4, 6]),
                        np.zeros(4, bool), np.full(4, -1), np.array([10.0, 8.0, 7.0, np.inf]))  # fmt: skip
    np.testing.assert_array_equal(_variance_dof(st, flags.CI_SEEDS, best), [2.0, 1.0, 1.0])
    np.testing.assert_array_equal(_variance_dof(st, flags.CI_TRIALS, best), [1.0, 1.0, 1.0])  # median 2 per B
