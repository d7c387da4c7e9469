"""The B_crit interval's lack-of-fit term (analysis.fits.pareto.lack_of_fit_var): references for its formula, and the
coverage it restores at the trusted targets of a second, independent simulator (synth_sweeps)."""

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits import pareto
from tests.oracles.coverage_sims import coverage_records, summary
from tests.oracles.synth_sweeps import BIN_CURVES, Curve, Sweep, simulate, truth

BS = np.array([16, 32, 64, 128, 256, 512, 1024, 2048], dtype=np.float64)


def test_leverages_equal_the_brute_force_derivative_of_the_fitted_values():
    """On exact data the hat matrix's diagonal is d(fitted log S_i)/d(log S_i): refit with one point moved."""
    fit = pareto.fit_pareto(BS, 150.0 + 150.0 * 300.0 / BS)
    h = pareto.leverages(BS, fit)
    eps = 1e-6
    brute = []
    for i in range(len(BS)):
        s = 150.0 + 150.0 * 300.0 / BS
        s[i] *= np.exp(eps)
        f = pareto.fit_pareto(BS, s)
        brute.append((np.log(f.s_min + f.e_min / BS[i]) - np.log(fit.s_min + fit.e_min / BS[i])) / eps)
    np.testing.assert_allclose(h, brute, atol=1e-4)
    assert h.sum() == pytest.approx(2.0, abs=1e-9)  # two parameters


def test_lack_of_fit_var_is_zero_on_the_curve_and_ignores_unknown_replicates():
    s = 100.0 + 100.0 * 256.0 / BS
    fit = pareto.fit_pareto(BS, s)
    rng = np.random.default_rng(0)
    reps = s * np.exp(0.05 * rng.standard_normal((500, len(BS))))
    assert pareto.lack_of_fit_var(BS, s, fit, reps) == 0.0
    bumpy = s * np.exp(0.1 * np.array([1, -1, 1, -1, 1, -1, 1, -1]))
    fit = pareto.fit_pareto(BS, bumpy)
    reps[:, 2] = np.nan
    reps[::2, 3] = np.inf  # censored replicates: left out of v_3
    reps[:, 5] = np.inf  # never known: v_5 = 0
    lr = np.log(reps)
    v = np.array([np.var(c[np.isfinite(c)], ddof=1) if np.isfinite(c).sum() > 1 else 0.0 for c in lr.T])
    r = np.log(bumpy) - np.log(fit.s_min + fit.e_min / BS)
    want = ((r**2).sum() - ((1 - pareto.leverages(BS, fit)) * v).sum()) / (len(BS) - 2)
    assert want > 0
    assert pareto.lack_of_fit_var(BS, bumpy, fit, reps) == pytest.approx(want, rel=1e-12)


def test_lack_of_fit_var_is_unbiased_monte_carlo():
    """Points scatter about the hyperbola with known per-point variances v_i (which the replicates show) plus
    tau² = 0.01 (which they do not): the estimate's mean over 300 sweeps is tau² (truncation at 0 is negligible)."""
    rng = np.random.default_rng(1)
    v = np.linspace(0.001, 0.006, len(BS))
    true = 80.0 + 80.0 * 200.0 / BS
    got = []
    for _ in range(300):
        s = true * np.exp(rng.standard_normal(len(BS)) * np.sqrt(v + 0.01))
        fit = pareto.fit_pareto(BS, s)
        reps = s * np.exp(rng.standard_normal((2000, len(BS))) * np.sqrt(v))
        got.append(pareto.lack_of_fit_var(BS, s, fit, reps))
    assert np.mean(got) == pytest.approx(0.01, rel=0.12)  # 300 draws: SE of the mean ~6%


def test_with_lack_of_fit_adds_lognormal_scatter_and_keeps_unknowns():
    reps = np.full((20000, 3), 50.0)
    reps[:, 1] = np.inf
    reps[:, 2] = np.nan
    out = pareto.with_lack_of_fit(reps, 0.04, np.random.default_rng(2))
    assert np.std(np.log(out[:, 0])) == pytest.approx(0.2, rel=0.02)
    assert np.isinf(out[:, 1]).all() and np.isnan(out[:, 2]).all()
    assert pareto.with_lack_of_fit(reps, 0.0, np.random.default_rng(2)) is reps


def test_synth_sweeps_truth_is_the_noise_free_optimal_lr_hyperbola():
    """With no noise, no lr penalty and fine evaluations, the simulated trials' steps are S_min + E_min/B."""
    from analysis.fits.steps import steps_to_target

    sw = Sweep(batch_sizes=(32, 256, 2048), seeds=1, kappa=0.0, sigma=0.0, lr_jitter=0.0, eval_noise=0.0,
               n_evals=2000, bins=BIN_CURVES[:1])  # fmt: skip
    runs = simulate(np.random.default_rng(3), sw)
    for name, c in [(m.EVAL_LOSS, sw.curve), (m.per_bin(m.EVAL_LOSS_BIN, 0), sw.bins[0])]:
        y = float(c.loss(2.0))
        steps = steps_to_target(runs.series(name), len(runs.trial_ids), [y])[0]
        b = runs.batch_size
        want = c.s0 * 2.0 + c.e0 * 2.0**c.q / b
        ok = np.isfinite(steps)
        np.testing.assert_allclose(steps[ok], want[ok], rtol=2e-3)
        assert ok.sum() >= 12  # every lr but the diverged ones
    assert truth(sw, m.EVAL_LOSS, float(sw.curve.loss(1.0))) == pytest.approx(256.0)
    assert Curve().b_crit(Curve().loss(4.0)) == pytest.approx(256.0 * 4.0**0.15)


def test_trusted_intervals_cover_on_the_second_simulator():
    """8 sweeps of synth_sweeps (lr penalty 30% an octave off the optimum, the optimum off the grid): the 90%
    interval of the trusted targets holds the true B_crit >= 85% of the time, globally and per bin. Without the
    lack-of-fit term the per-bin coverage is 0.76 (122 of 160) and this fails."""
    rec = coverage_records("new", draws=8, bootstrap=200, first_seed=500, calibrate=False, processes=2)  # uncalibrated
    glob = summary(rec, rec["trusted"] & ~rec["is_bin"])
    bins = summary(rec, rec["trusted"] & rec["is_bin"])
    assert glob["n"] >= 40 and bins["n"] >= 120
    assert glob["coverage"] >= 0.85
    assert 0.85 <= bins["coverage"] <= 0.97
    assert bins["width"] < 0.25  # a 90% interval of about ±10%, not an arbitrarily wide one


def test_synth_sweeps_stops_at_the_global_target_and_diverges_the_largest_lr_at_large_batch_sizes():
    sw = Sweep()
    runs = simulate(np.random.default_rng(4), sw)
    lr, b = runs.trials.column("lr").to_numpy(), runs.batch_size
    diverged = runs.status == m.STATUS_DIVERGED
    np.testing.assert_array_equal(diverged, (lr == lr.max()) & (b >= sw.diverge_from))
    g = runs.series(m.EVAL_LOSS)
    ends = np.r_[np.flatnonzero(np.diff(g.trial)), len(g.trial) - 1]
    reached = runs.status[g.trial[ends]] == m.STATUS_REACHED_TARGET
    assert reached.sum() >= 0.5 * len(ends)  # the others: diverged, or an lr far off the optimum out of budget
    assert (g.value[ends][reached] <= sw.stop_loss).all()  # a stopped trial's last evaluation is its first below
    before = g.value[ends[reached] - 1]
    assert (before > sw.stop_loss).all()
    spent = runs.status[g.trial[ends]] == m.STATUS_BUDGET_SPENT
    assert (g.value[ends][spent] > sw.stop_loss).all()
    n_evals = np.diff(np.r_[-1, ends])
    assert (n_evals[spent] == n_evals.max()).all()  # out of budget: every evaluation made
    k0 = runs.series(m.per_bin(m.EVAL_LOSS_BIN, 0))
    np.testing.assert_array_equal(k0.step, g.step)  # bins are evaluated, and stop, with eval/loss
