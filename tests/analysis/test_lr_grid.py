"""The divergence-edge check (analysis.fits.lr_grid, the ``lr_at_divergence`` flag): its pieces against float64 closed
forms on points drawn exactly from the model ``S = C (1 + kappa (x - x_v)²)``, and the flag on simulated sweeps whose
only difference is the spacing of the learning-rate grid."""

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits import flags as fl
from analysis.fits import lr_grid
from analysis.fits.steps import BestPerBatch, Settings
from analysis.fits.sweep_fit import analyze_metric
from tests.oracles.synth_shapes import SHAPES
from tests.oracles.synth_sweeps import Sweep, simulate, truth

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
    """Settings and best points of an lr-only grid: ``steps`` (n_b, n_lr) with NaN where a trial gave no point."""
    bs, lr, val = [], [], []
    for i, b in enumerate(batch_sizes):
        for j, q in enumerate(lrs):
            if np.isfinite(steps[i, j]):
                bs.append(b), lr.append(q), val.append(steps[i, j])
    bs, lr, val = np.array(bs), np.array(lr), np.array(val)
    st = Settings(bs, lr, [np.array([k]) for k in range(len(bs))], np.ones(len(batch_sizes), bool))
    arg = np.array([np.flatnonzero(bs == b)[np.argmin(val[bs == b])] for b in batch_sizes])
    none = np.full(len(batch_sizes), -1)
    best = BestPerBatch(np.array(batch_sizes), val[arg], arg, np.zeros(len(batch_sizes), bool), none, val[arg])
    return val, st, best, {b: np.array(lrs) for b in batch_sizes}


def _kappa(val, st, best, tried) -> float:
    """The curvature the points share, as analyze_metric passes it (the model's here: see the first test below)."""
    return lr_grid.shared_curvature(lr_grid.brackets(val, st, best, tried))


LRS = np.array([1e-3, 2e-3, 4e-3])
X = np.log(LRS)
# four batch sizes; the first two have both neighbours (they give kappa), the last three lose the largest lr (see each
# test); the third's optimum lies between its best and the largest lr, the fourth's beyond the largest lr, the
# fifth's below its best
XV = [X[1] - 0.2, X[1] + 0.1, X[1] + 0.5, X[2] + 0.3, X[1] - 0.3]
BS = [32, 64, 128, 256, 512]


def _grid():
    steps = np.array([_model(X, v, c=C * (1 + 4 / (i + 1))) for i, v in enumerate(XV)])
    steps[2:, 2] = np.nan
    return steps


def test_divergence_gaps_against_the_closed_form():
    """The largest lr diverged at the last three batch sizes. The shared curvature is the model's; the third's gap is
    the model's ``log(1 + kappa d²)``; the fourth's (optimum past the diverged lr) that of the fit with its vertex at
    the diverged lr; the fifth's optimum lies below its best, away from the diverged lr: no gap; the first two have
    both neighbours: no gap."""
    val, st, best, tried = _settings(BS, LRS, _grid())
    diverged = {b: LRS[2:] if b >= 128 else LRS[:0] for b in BS}
    assert lr_grid.shared_curvature(lr_grid.brackets(val, st, best, tried)) == pytest.approx(KAPPA, rel=1e-9)
    gaps = lr_grid.divergence_gaps(val, val, st, best, tried, diverged, _kappa(val, st, best, tried))
    y3 = np.log(_grid()[3, :2])
    want3 = y3[1] - np.mean(y3 - np.log1p(KAPPA * (X[:2] - X[2]) ** 2))
    assert gaps == pytest.approx([0.0, 0.0, np.log(1 + KAPPA * 0.5**2), want3, 0.0], abs=1e-5)


def test_divergence_gaps_need_a_diverged_neighbour():
    """The same points, but the largest lr stopped short of the target (censored) instead of diverging: the optimum is
    not known to lie past the grid's measurements there, so no gap (``lr_at_edge``'s and the censoring's business)."""
    val, st, best, tried = _settings(BS, LRS, _grid())
    none = {b: LRS[:0] for b in BS}
    assert (lr_grid.divergence_gaps(val, val, st, best, tried, none, _kappa(val, st, best, tried)) == 0).all()


def test_a_censored_neighbour_enters_with_its_lower_bound():
    """The third batch size's smaller lr stopped short of the target: known only as a lower bound, 5% below its true
    steps. Its gap is then that of the fit through the bound (closed form as above: the near root of the two-point
    ratio), smaller than the model's: a lower bound on the gap. Without a bound above the best, no gap."""
    steps = _grid()
    true_lo = steps[2, 0]
    steps[2, 0] = np.inf
    val, st, best, tried = _settings(BS, LRS, np.where(np.isinf(steps), 1e12, steps))  # never the best
    val = np.where(val == 1e12, np.inf, val)
    diverged = {b: LRS[2:] if b >= 128 else LRS[:0] for b in BS}
    for bound, expect_gap in ((true_lo / 1.05, True), (best.steps[2] * 0.9, False)):
        lower = np.where(np.isinf(val), bound, val)
        gaps = lr_grid.divergence_gaps(val, lower, st, best, tried, diverged, _kappa(val, st, best, tried))
        if not expect_gap:
            assert gaps[2] == 0.0
            continue
        r = bound / best.steps[2]
        xb, xn = X[1], X[0]
        qa, qb, qc = (r - 1) * KAPPA, -2 * KAPPA * (r * xb - xn), (r - 1) + KAPPA * (r * xb**2 - xn**2)
        roots = np.roots([qa, qb, qc]).real
        xv = roots[np.argmin(np.abs(roots - xb))]
        assert gaps[2] == pytest.approx(np.log(1 + KAPPA * (xv - xb) ** 2), abs=1e-4)  # the vertex to 1e-4
        assert 0 < gaps[2] < np.log(1 + KAPPA * 0.5**2)


# quiet3's sweep (synth_shapes) on two grids that span the same two octaves: 3 lrs an octave apart, or 9 a quarter
# octave apart; the largest lr diverges from B = 512 on both
COARSE, FINE = SHAPES["quiet3"], SHAPES["quiet9"]


def _global(sw: Sweep, seed: int):
    res = analyze_metric(simulate(np.random.default_rng(seed), sw), m.EVAL_LOSS, bootstrap=200, seed=seed,
                         strict=False, notes=[], calibrate=False)  # fmt: skip
    return [r for r in res if not set(r["flags"]) - {fl.LR_AT_DIVERGENCE}]  # those no other flag takes out


def test_flag_fires_on_the_coarse_grid_and_not_on_the_fine_one():
    """Same four sweeps but the grid. Coarse: the grid's B_crit is biased low; every otherwise trusted global target
    whose interval misses the truth is flagged. Fine: the intervals hold the truth and (almost) none is flagged."""
    for sw, name in ((COARSE, "coarse"), (FINE, "fine")):
        res = [r for s in (3, 4, 5, 6) for r in _global(sw, s)]
        assert len(res) >= 16
        t = np.array([truth(sw, m.EVAL_LOSS, r["target"]) for r in res])
        lo, hi = np.array([r["b_crit_ci"] for r in res], dtype=np.float64).T
        hit = (lo <= t) & (t <= hi)
        flagged = np.array([fl.LR_AT_DIVERGENCE in r["flags"] for r in res])
        if name == "coarse":
            assert (~hit).sum() >= 8 and flagged[~hit].all()
        else:
            assert hit.mean() >= 0.8 and flagged.mean() <= 0.1


def test_points_carry_their_gap_and_the_decisions_see_the_flag():
    """A flagged target's points say which batch size is at the divergence edge and by how much (flagged where the gap
    exceeds 1% and a quarter of the interval's log half-width); ``recommend``'s
    trust note (the same analyze_metric) carries the flag into its UNTRUSTED line, with no case of its own."""
    from analysis.reporting.trust_note import flags_at, untrusted_line

    runs = simulate(np.random.default_rng(4), COARSE)
    r = next(r for r in _global(COARSE, 4) if fl.LR_AT_DIVERGENCE in r["flags"])
    lo, hi = r["b_crit_ci"]
    limit = max(fl.LR_DIVERGENCE_GAP, fl.LR_DIVERGENCE_FRAC * np.log(hi / lo) / 2)
    edge = [p for p in r["points"] if fl.LR_AT_DIVERGENCE in p["flags"]]
    assert edge and all(p["divergence_gap"] > limit and p["batch_size"] >= 512 for p in edge)
    assert all(p["divergence_gap"] <= limit for p in r["points"] if p not in edge)
    flags = flags_at(runs, m.EVAL_LOSS, r["target"])
    assert fl.LR_AT_DIVERGENCE in flags
    assert fl.LR_AT_DIVERGENCE in untrusted_line({r["target"]: flags}, "this recommendation")


def test_refined_optima_recover_each_batch_sizes_optimum_and_the_exact_b_crit():
    """Points drawn exactly from ``S_b (1 + kappa (x - x_v(b))²)`` with ``S_b = S_min + E_min/b`` and the optimum at
    a different place in the grid at every batch size (between grid points, next to the grid's lower edge with only
    one neighbour, next to a diverged (absent) largest lr): every refined point is ``S_b`` (float64, to the vertex
    search's resolution) at its optimum's lr, and the fit through them gives the exact ``B_crit``, where the grid's
    plain minima miss it by more than 1%."""
    from analysis.fits.pareto import fit_pareto

    x = np.log(1e-3 * 2.0 ** np.arange(5))
    b = np.array([16, 32, 64, 128, 256])
    s_min, e_min = 100.0, 100.0 * 60
    xv = np.array([x[0] + 0.25, x[1] + 0.45, x[2] - 0.3, x[3] + 0.1, x[3] + 0.5])
    steps = np.array([_model(x, v, c=s_min + e_min / q) for v, q in zip(xv, b, strict=True)])
    steps[-1, -1] = np.nan  # B = 256: the largest lr diverged (no point), its optimum lies towards it
    val, st, best, tried = _settings(b, np.exp(x), steps)
    kappa = lr_grid.shared_curvature(lr_grid.brackets(val, st, best, tried))
    assert kappa == pytest.approx(KAPPA, rel=1e-9)
    ref, ref_lr = lr_grid.refined_optima(val, st, best, tried, kappa)
    np.testing.assert_allclose(ref, s_min + e_min / b, rtol=1e-5)  # the vertex search resolves 1e-4 in log lr
    np.testing.assert_allclose(np.log(ref_lr), xv, atol=1e-4)
    exact = e_min / s_min
    assert fit_pareto(b, ref).b_crit == pytest.approx(exact, rel=1e-4)
    assert abs(fit_pareto(b, best.steps).b_crit / exact - 1) > 0.01


def test_refined_optima_stay_at_the_grids_edge_and_plain_where_nothing_is_judged():
    """An optimum below the grid's smallest lr: the refined lr is that edge and its steps the fit's value there (at
    most the measured best's); no shared curvature, or a batch size with one lr: the plain minimum."""
    x = np.log(1e-3 * 2.0 ** np.arange(3))
    steps = np.array([_model(x, x[0] - 0.4), _model(x, x[1]), [np.nan, 150.0, np.nan]])
    val, st, best, tried = _settings([8, 16, 32], np.exp(x), steps)
    ref, ref_lr = lr_grid.refined_optima(val, st, best, tried, KAPPA)
    y = np.log(steps[0, :2])
    assert ref_lr[0] == pytest.approx(1e-3, rel=1e-12)
    fit_at_edge = np.exp(np.mean(y - np.log1p(KAPPA * (x[:2] - x[0]) ** 2)))
    assert ref[0] == pytest.approx(min(fit_at_edge, best.steps[0]), rel=1e-9)  # never above what was measured
    assert ref[1] == pytest.approx(C, rel=1e-9) and ref_lr[1] == pytest.approx(2e-3, rel=1e-6)
    assert ref[2] == 150.0 and ref_lr[2] == pytest.approx(2e-3, rel=1e-12)  # one lr: nothing to interpolate
    plain, plain_lr = lr_grid.refined_optima(val, st, best, tried, float("nan"))
    np.testing.assert_array_equal(plain, best.steps)
    np.testing.assert_array_equal(plain_lr, st.lr[best.setting])
