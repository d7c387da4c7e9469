"""The interval's calibrated level (analysis.fits.calibration, issue 30): its batched leverages against the float64
reference, the parametric double bootstrap on point sets with a known answer, and the coverage it gives on the
simulator shapes of synth_shapes."""

import numpy as np
import pytest

from analysis.fits import calibration as cal
from analysis.fits import pareto
from tests.oracles.coverage_sims import coverage_records, summary

BS = np.array([32, 64, 128, 256, 512, 1024, 2048], dtype=np.float64)


def test_batched_leverages_equal_the_float64_reference_per_fit():
    rng = np.random.default_rng(0)
    s_min, e_min = 50.0 * np.exp(rng.normal(0, 1, 6)), 50.0 * 300.0 * np.exp(rng.normal(0, 1, 6))
    got = cal._leverages_batched(BS, s_min, e_min)
    want = [pareto.leverages(BS, pareto.ParetoFit(s, e, 0.0)) for s, e in zip(s_min, e_min, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.sum(1), 2.0, rtol=1e-9)


def test_the_calibration_fits_agree_with_the_60_step_fits():
    """ITERS Levenberg-Marquardt steps from the fitted point reach the same optimum as the analysis' 60."""
    rng = np.random.default_rng(1)
    for sd, rtol in ((0.05, 1e-6), (0.2, 1e-5)):  # per-point noise in log steps: the seeds' and far beyond
        steps = (80.0 + 80.0 * 256.0 / BS) * np.exp(sd * rng.standard_normal((3000, len(BS))))
        p0 = np.log([80.0, 80.0 * 256.0])
        a = pareto.fit_pareto_batched(BS, steps, p0, iters=cal.ITERS)
        b = pareto.fit_pareto_batched(BS, steps, p0)
        np.testing.assert_allclose(a[1] / a[0], b[1] / b[0], rtol=rtol)  # a level is read at 0.01 resolution


def test_known_variances_need_no_calibration():
    """With the per-point variances known exactly and no lack of fit, the nominal percentile interval already holds
    the model's B_crit about 90% of the time: the calibrated level stays near 0.9."""
    u = cal.coverage_stats(BS, 80.0, 80.0 * 256.0, np.full(len(BS), 0.04**2), 0.0, np.inf, np.random.default_rng(2),
                           outer=600)  # fmt: skip
    assert 0.86 <= np.mean(u <= 0.9) <= 0.94  # 600 draws: SE 0.012
    assert 0.85 <= cal.level_for(u, 0.9) <= 0.95


def test_estimated_variances_widen_the_level_and_it_then_holds():
    """Three seeds (variances on 2 dof) and a lack of fit that dominates, estimated on 5 dof: the nominal 90%
    interval undercovers on fresh draws of the model (as a z-interval with an estimated variance does), the
    calibrated level is higher, and the interval at that level covers ~90% on draws independent of those it was
    calibrated on."""
    v, tau2 = np.full(len(BS), 0.01**2), 0.04**2
    u = cal.coverage_stats(BS, 80.0, 80.0 * 256.0, v, tau2, 2.0, np.random.default_rng(3), outer=800)
    fresh = cal.coverage_stats(BS, 80.0, 80.0 * 256.0, v, tau2, 2.0, np.random.default_rng(4), outer=800)
    a = cal.level_for(u, 0.9)
    assert np.mean(fresh <= 0.9) < 0.87
    assert a > 0.93
    assert 0.87 <= np.mean(fresh <= a) <= 0.94  # 800 draws: SE 0.011


def test_level_for_clips_and_ignores_failed_draws():
    assert cal.level_for(np.array([np.nan, np.nan]), 0.9) == 0.9
    assert cal.level_for(np.ones(50), 0.9) == cal.MAX_LEVEL
    assert cal.level_for(np.zeros(50), 0.9) == cal.MIN_LEVEL
    u = np.r_[np.linspace(0, 1, 101), np.nan]
    assert cal.level_for(u, 0.9) == pytest.approx(0.9)


def _coverage(shape: str, draws: int, bootstrap: int, first_seed: int, calibrate: bool = True) -> dict:
    rec = coverage_records(f"shape:{shape}", draws, bootstrap, first_seed, calibrate=calibrate, processes=2)
    return rec, summary(rec, rec["trusted"])


def test_calibrated_coverage_on_two_shapes():
    """2 sweeps each of two shapes (the issue's description, and t(3)-tailed jitter with the optimum off centre),
    every target trusted but for ``lr_at_divergence`` (global and per bin): the calibrated 90% interval holds the
    truth in [0.85, 0.95] of them pooled (about 80 targets: SE about 0.035), >= 0.8 on each shape, and is taken above
    the nominal level. The targets that flag takes out miss more often than those left (here: 6 of its 13 missed,
    none of the 68 left did)."""
    hits, levels, flagged = [], [], []
    for shape in ("issue", "t3"):
        rec, s = _coverage(shape, draws=2, bootstrap=100, first_seed=900)
        assert s["n"] >= 25 and s["coverage"] >= 0.8
        sel = rec["trusted"] | rec["at_divergence_only"]
        hits.append((rec["lo"][sel] <= rec["truth"][sel]) & (rec["truth"][sel] <= rec["hi"][sel]))
        levels.append(rec["ci_level"][sel])
        flagged.append(rec["at_divergence_only"][sel])
    hits, flagged = np.concatenate(hits), np.concatenate(flagged)
    assert 0.85 <= hits.mean() <= 0.95
    assert np.median(np.concatenate(levels)) > 0.9
    assert flagged.any() and hits[flagged].mean() < hits[~flagged].mean()


@pytest.mark.slow
def test_quiet3_bias_is_flagged_slow():
    """``quiet3`` (3 lrs an octave apart, the largest diverging from B = 512 while the optimum moves towards it): the
    grid's estimate is biased low (RESULTS.md). ``lr_at_divergence`` takes most targets; those it takes cover less than
    half the time, and the few left hold the truth >= 0.85."""
    rec, _ = _coverage("quiet3", draws=10, bootstrap=400, first_seed=1200)
    hit = (rec["lo"] <= rec["truth"]) & (rec["truth"] <= rec["hi"])
    took = rec["at_divergence_only"]
    assert took.sum() >= 4 * rec["trusted"].sum() and hit[took].mean() < 0.5
    assert hit[rec["trusted"]].mean() >= 0.85


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["issue", "budget7", "t3", "sweeps17"])
def test_calibrated_coverage_per_shape_slow(shape):
    """10 sweeps per shape: the calibrated interval holds the truth >= 0.85 globally and per bin (SE about 0.03)."""
    rec, _ = _coverage(shape, draws=10, bootstrap=400, first_seed=1200)
    for which in (rec["trusted"] & ~rec["is_bin"], rec["trusted"] & rec["is_bin"]):
        s = summary(rec, which)
        assert s["n"] >= 30
        assert s["coverage"] >= 0.85


def test_bcrit_analyze_records_the_calibrated_level_and_turns_it_off(tmp_path):
    """bcrit.json's ``ci_level`` is the level the interval was taken at: calibrated by default, the nominal 0.9 with
    ``--no-calibration``; the calibrated interval of the same bootstrap is then the wider one when the level is."""
    import json

    from analysis.sources.loaders import runs_from_tables
    from orchestrator.cli.main import main
    from tests.oracles import nqm
    from tests.oracles.sweep_dir import write_sweep_dir

    h = np.arange(1, 51, dtype=np.float64) ** -0.5
    r = nqm.simulate_sweep(h, h, np.ones(50), [4, 8, 16, 32, 64], [0.3, 0.6, 1.2], seeds=2, max_steps=400,
                           target_loss=0.3, seed=1)  # fmt: skip
    write_sweep_dir(runs_from_tables(r.trials, r.metrics), tmp_path / "s")
    got = {}
    for flag in (["--no-calibration"], []):  # off first: the flag is a parameter, nothing stays switched off
        out = tmp_path / f"out{len(flag)}"
        rc = main(["analyze", str(tmp_path / "s"), "--targets", "0.35", "--no-mlflow", "--bootstrap", "300",
                   "--no-plots", "--out", str(out), *flag])  # fmt: skip
        assert rc == 0
        got[bool(flag)] = json.loads((out / "bcrit.json").read_text())["targets"][0]
    assert got[True]["ci_level"] == 0.9
    a = got[False]["ci_level"]
    assert cal.MIN_LEVEL <= a <= cal.MAX_LEVEL and a != 0.9
    (lo0, hi0), (lo1, hi1) = got[True]["b_crit_ci"], got[False]["b_crit_ci"]
    assert ((lo1 <= lo0) and (hi1 >= hi0)) == (a > 0.9)


def test_per_point_degrees_of_freedom():
    """``dof`` per point (an adaptive sweep's points hold 2 or 3 seeds): the same draws as one scalar where they are
    all equal; a level in range where they differ."""
    v, tau2 = np.full(len(BS), 0.02**2), 0.01**2
    one = cal.coverage_stats(BS, 80.0, 80.0 * 256.0, v, tau2, 2.0, np.random.default_rng(5), outer=60)
    each = cal.coverage_stats(BS, 80.0, 80.0 * 256.0, v, tau2, np.full(len(BS), 2.0), np.random.default_rng(5),
                              outer=60)  # fmt: skip
    np.testing.assert_array_equal(one, each)
    mixed = cal.coverage_stats(BS, 80.0, 80.0 * 256.0, v, tau2, np.array([1.0, 2, 1, 2, 2, 1, 2]),
                               np.random.default_rng(5), outer=60)  # fmt: skip
    assert np.isfinite(mixed).all() and not np.array_equal(one, mixed)
