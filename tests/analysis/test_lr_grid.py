"""The coarse-lr-grid check (analysis.fits.lr_grid, the ``coarse_lr_grid`` flag): its pieces against float64 closed
forms on points drawn exactly from the model ``S = C (1 + kappa (x - x_v)²)``, and the flag on simulated sweeps
whose only difference is the spacing of the learning-rate grid."""

import numpy as np
import pytest
from synth_sweeps import Sweep, simulate, truth

from analysis.core import metrics as m
from analysis.fits import flags as fl
from analysis.fits import lr_grid
from analysis.fits.steps import BestPerBatch, Settings
from analysis.fits.sweep_fit import analyze_metric

KAPPA, C = 0.6, 200.0


def _model(x, xv, kappa=KAPPA, c=C):
    return c * (1 + kappa * (np.asarray(x, dtype=np.float64) - xv) ** 2)


def test_relative_curvature_is_the_parabolas_own():
    x = np.log([1e-3, 2e-3, 4e-3])
    for xv in (x[1] - 0.3, x[1], x[1] + 0.5):
        assert lr_grid.relative_curvature(x, _model(x, xv)) == pytest.approx(KAPPA, rel=1e-9)
    assert np.isnan(lr_grid.relative_curvature(x, -_model(x, x[1])))  # concave: no curvature


@pytest.mark.parametrize("offset", [-0.2, 0.0, 0.25])
def test_vertex_fit_recovers_the_optimum_between_three_points(offset):
    """Three exact points around the optimum: the vertex to 1e-4 (the brute force's second stage is 3·width/(n-1)²
    fine), the gap ``log(S_best / C)`` to 1e-5."""
    x = np.log([1e-3, 2e-3, 4e-3])
    xv = x[1] + offset
    y = np.log(_model(x, xv))
    order = [1, 0, 2]  # best first
    gap, got = lr_grid.vertex_fit(x[order], y[order], x[0], x[2], KAPPA)
    assert got == pytest.approx(xv, abs=1e-4)
    assert gap == pytest.approx(np.log(1 + KAPPA * offset**2), abs=1e-5)


def test_vertex_fit_one_sided_matches_the_closed_form():
    """Best and its lower neighbour only (the upper one diverged): with ``kappa`` known, the ratio of the two steps
    fixes the vertex (the near root of ``S_n/S_b = (1 + kappa (x_n - x_v)²) / (1 + kappa (x_b - x_v)²)``), found
    here in closed form; inside the bracket the gap is the model's, beyond it the vertex is reported and the gap is
    that of the fit with its vertex at the bracket's end."""
    xb, xn, hi = np.log(2e-3), np.log(1e-3), np.log(4e-3)
    for xv in (xb + 0.3, hi + 0.2):
        y = np.log(_model([xb, xn], xv))
        r = np.exp(y[1] - y[0])
        # (r - 1) kappa xv² - 2 kappa (r xb - xn) xv + (r - 1) + kappa (r xb² - xn²) = 0
        qa, qb, qc = (r - 1) * KAPPA, -2 * KAPPA * (r * xb - xn), (r - 1) + KAPPA * (r * xb**2 - xn**2)
        roots = np.roots([qa, qb, qc]).real
        want = roots[np.argmin(np.abs(roots - xb))]
        assert want == pytest.approx(xv, rel=1e-9)
        gap, got = lr_grid.vertex_fit(np.array([xb, xn]), y, xn, hi, KAPPA)
        assert got == pytest.approx(want, abs=1e-4)
        # inside: the model's own gap; beyond: the least-squares fit with its vertex at the bracket's end
        want_gap = (
            np.log(_model(xb, xv) / C) if xv <= hi else y[0] - np.mean(y - np.log1p(KAPPA * (np.r_[xb, xn] - hi) ** 2))
        )
        assert gap == pytest.approx(want_gap, abs=1e-5)


def _settings(batch_sizes, lrs, steps):
    """Settings and best points of an lr-only grid: ``steps`` (n_b, n_lr) with NaN where a trial diverged."""
    bs, lr, val = [], [], []
    for i, b in enumerate(batch_sizes):
        for j, q in enumerate(lrs):
            if np.isfinite(steps[i, j]):
                bs.append(b), lr.append(q), val.append(steps[i, j])
    bs, lr, val = np.array(bs), np.array(lr), np.array(val)
    st = Settings(np.arange(len(bs)), bs, lr, [np.array([k]) for k in range(len(bs))], np.ones(len(batch_sizes), bool))
    arg = np.array([np.flatnonzero(bs == b)[np.argmin(val[bs == b])] for b in batch_sizes])
    none = np.full(len(batch_sizes), -1)
    best = BestPerBatch(np.array(batch_sizes), val[arg], arg, np.zeros(len(batch_sizes), bool), none, val[arg])
    return val, st, best, {b: np.array(lrs) for b in batch_sizes}


def test_vertex_gaps_shares_the_curvature_and_sees_past_a_diverged_neighbour():
    """Four batch sizes on a 3-point grid; the largest lr diverged at the last two. The first two (both neighbours)
    give kappa; the third's optimum lies between its best and the diverged lr (gap as in the closed form), the
    fourth's beyond the diverged lr (``beyond``)."""
    lrs = np.array([1e-3, 2e-3, 4e-3])
    x = np.log(lrs)
    xv = [x[1] - 0.2, x[1] + 0.1, x[1] + 0.5, x[2] + 0.3]
    steps = np.array([_model(x, v, c=C * (1 + 4 / (i + 1))) for i, v in enumerate(xv)])
    steps[2:, 2] = np.nan
    gaps, beyond, kappa = lr_grid.vertex_gaps(*_settings([32, 64, 128, 256], lrs, steps))
    assert kappa == pytest.approx(KAPPA, rel=1e-9)
    assert gaps[2] == pytest.approx(np.log(1 + KAPPA * 0.5**2), abs=1e-5)
    y3 = np.log(steps[3, :2])
    assert gaps[3] == pytest.approx(y3[1] - np.mean(y3 - np.log1p(KAPPA * (x[:2] - x[2]) ** 2)), abs=1e-5)
    assert beyond.tolist() == [False, False, False, True]


def test_exceeds_measures_against_the_intervals_own_side():
    assert lr_grid.exceeds(100.0, 112.0, (90.0, 120.0), 0.5)  # log 1.12 > 0.5 log 1.2
    assert not lr_grid.exceeds(100.0, 108.0, (90.0, 120.0), 0.5)
    assert lr_grid.exceeds(100.0, 94.0, (90.0, 120.0), 0.5)  # below: against log(100/90)
    assert not lr_grid.exceeds(100.0, 97.0, (90.0, 120.0), 0.5)
    assert not lr_grid.exceeds(100.0, 150.0, (float("nan"), float("nan")), 0.5)  # no interval: not judged


# quiet3's sweep (synth_shapes) on two grids that span the same two octaves: 3 lrs an octave apart, or 9 a quarter
# octave apart; the largest lr diverges from B = 512 on both
QUIET = dict(seeds=2, sigma=0.005, rate_jitter=0.01, eval_noise=0.002, lr_opt_256=0.3, lr_slope=0.15, lr_opt_spread=0.3)
COARSE, FINE = Sweep(**QUIET, n_lr=3), Sweep(**QUIET, n_lr=9, lr_step=0.25)


def _global(sw: Sweep, seed: int):
    res = analyze_metric(simulate(np.random.default_rng(seed), sw), m.EVAL_LOSS, bootstrap=200, seed=seed,
                         strict=False, notes=[], calibrate=False)  # fmt: skip
    return [r for r in res if not set(r["flags"]) - {fl.COARSE_LR_GRID}]  # those no other flag takes out


def test_flag_fires_on_the_coarse_grid_and_not_on_the_fine_one():
    """Same four sweeps but the grid. Coarse: the grid's B_crit is 4-25% low; every otherwise trusted global target
    whose interval misses the truth is flagged, and at least half of them are. Fine: the intervals hold the truth and
    (almost) none is flagged."""
    for sw, name in ((COARSE, "coarse"), (FINE, "fine")):
        res = [r for s in (3, 4, 5, 6) for r in _global(sw, s)]
        assert len(res) >= 16
        t = np.array([truth(sw, m.EVAL_LOSS, r["target"]) for r in res])
        lo, hi = np.array([r["b_crit_ci"] for r in res], dtype=np.float64).T
        hit = (lo <= t) & (t <= hi)
        flagged = np.array([fl.COARSE_LR_GRID in r["flags"] for r in res])
        if name == "coarse":
            assert flagged[~hit].all() and flagged.mean() >= 0.5
        else:
            assert hit.mean() >= 0.8 and flagged.mean() <= 0.1


def test_decisions_see_the_flag_through_the_targets_flags():
    """``recommend``'s trust note (the same analyze_metric, interval included) carries ``coarse_lr_grid`` into its
    UNTRUSTED line, with no case of its own."""
    from analysis.decisions.trust_note import flags_at, untrusted_line

    runs = simulate(np.random.default_rng(4), COARSE)
    target = next(r["target"] for r in _global(COARSE, 4) if fl.COARSE_LR_GRID in r["flags"])
    flags = flags_at(runs, m.EVAL_LOSS, target)
    assert fl.COARSE_LR_GRID in flags
    assert fl.COARSE_LR_GRID in untrusted_line({target: flags}, "this recommendation")
