"""The refined B_crit's own bootstrap (analysis.fits.refined_boot): its vectorised pieces against the scalar float64
references of analysis.fits.lr_grid, a replicate equal to the sweep refines to the point estimate, and exact points
give the exact optimum in every replicate."""

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits import lr_grid, pareto, refined_boot
from analysis.fits.steps import aggregate_seeds, best_per_batch, final_losses, pooled_steps, usable
from analysis.fits.trust import PointChecks
from tests.oracles.synth_shapes import SHAPES
from tests.oracles.synth_sweeps import simulate


def test_vertex_fit_batched_is_the_scalar_fit_per_replicate():
    rng = np.random.default_rng(0)
    for p in (2, 3):
        x = np.log([2e-3, 1e-3, 4e-3][:p])
        y = np.log(200.0) + rng.normal(0, 0.1, (60, p))
        kappa = rng.uniform(0.05, 1.0, 60)
        kappa[:3] = (np.nan, 0.0, -0.1)  # not judged: (0, x_best)
        gap, xv = lr_grid.vertex_fit_batched(x, y, np.log(1e-3), np.log(4e-3), kappa)
        for r in range(60):
            g, v = lr_grid.vertex_fit(x, y[r], np.log(1e-3), np.log(4e-3), kappa[r])
            assert (gap[r], xv[r]) == pytest.approx((g, v), abs=1e-12)


def test_curvatures_batched_is_the_least_squares_parabolas():
    """Against the float64 reference ``np.polyfit`` (degree 2 through the three points): ``kappa = a / (c - b²/4a)``
    where convex, ``nan`` in both where not; the scalar ``relative_curvature`` is one replicate of it."""
    rng = np.random.default_rng(1)
    x = np.log([2e-3, 1e-3, 4e-3])  # best first, as the brackets give them
    s = 200.0 * np.exp(rng.normal(0, 0.15, (200, 3)))
    got = lr_grid.curvatures_batched(x, s)
    want = []
    for row in s:
        a, b, c = np.polyfit(x, row, 2)
        want.append(a / (c - b * b / (4 * a)) if a > 0 and c - b * b / (4 * a) > 0 else np.nan)
    want = np.array(want)
    assert np.isnan(got).sum() > 10 and (np.isnan(got) == np.isnan(want)).all()  # concave ones: nan in both
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-9)
    np.testing.assert_array_equal([lr_grid.relative_curvature(x, row) for row in s], got)


def _one_target(shape: str, seed: int, k: int = 2):
    """A simulated sweep's settings at its k-th automatic target: (steps, last, st, value, lower, best, tried)."""
    runs = simulate(np.random.default_rng(seed), SHAPES[shape])
    series = runs.series(m.EVAL_LOSS)
    n = len(runs.trial_ids)
    targets = pareto.auto_targets(runs.batch_size, usable(runs), *final_losses(series, n))
    p = pooled_steps(runs, series, [float(targets[k])])
    val, low = aggregate_seeds(p.steps[0], p.last, p.st)
    tried = PointChecks(p.runs, series, p.st, p.last, p.spacing).tried
    return p.steps, p.last, p.st, val, low, best_per_batch(val, low, p.st), tried


@pytest.mark.parametrize("shape,seed", [("t3", 700), ("issue", 701), ("budget7", 702)])
def test_a_replicate_equal_to_the_sweep_refines_to_the_point_estimate(shape, seed):
    """The replicate that drew every seed once (the sweep itself) refines exactly as ``refined_optima`` does, its
    curvature re-estimated from its own parabolas (the point's shared curvature)."""
    _, _, st, val, low, best, tried = _one_target(shape, seed)
    kappa = lr_grid.shared_curvature(lr_grid.brackets(val, st, best, tried))
    assert np.isfinite(kappa)
    want = lr_grid.refined_optima(val, st, best, tried, kappa)[0]
    got = refined_boot.refined_replicates(val[None], low[None], st, tried, kappa)[0]
    fitted = np.isfinite(best.steps)
    np.testing.assert_allclose(got[fitted], want[fitted], rtol=1e-12)
    assert (got[fitted] < best.steps[fitted] * (1 + 1e-12)).all() and (got[fitted] < best.steps[fitted]).any()


def test_exact_points_refine_to_the_exact_optimum_in_every_replicate():
    """Every seed of a setting exact on ``S = S(B) (1 + kappa (x - x_v(B))²)`` with the optimum between grid points
    (moving with B): every replicate's refined steps are S(B) to 1e-5, where the best grid setting misses by > 1%."""
    from analysis.fits.steps import Settings

    bs, lrs, kappa = [32, 64, 128, 256, 512], np.array([1e-3, 2e-3, 4e-3, 8e-3]), 0.4
    s_true = 100.0 + 100.0 * 200.0 / np.array(bs)
    xv = np.log(1.4e-3) + 0.35 * np.log2(np.array(bs) / 32) * np.log(2)
    rows, val = [], []
    for i, b in enumerate(bs):
        for q in lrs:
            rows.append((b, q))
            val.append(s_true[i] * (1 + kappa * (np.log(q) - xv[i]) ** 2))
    val = np.array(val)
    st = Settings(np.arange(len(rows)), np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                  [np.array([j]) for j in range(len(rows))], np.ones(len(bs), bool))  # fmt: skip
    reps = np.tile(val, (5, 1))
    got = refined_boot.refined_replicates(reps, reps, st, {b: lrs for b in bs}, kappa)
    np.testing.assert_allclose(got, np.tile(s_true, (5, 1)), rtol=1e-5)
    plain = pareto.best_of_settings(reps, reps, st)[1]
    assert (plain[0] / s_true - 1).max() > 0.01


def test_the_refined_interval_is_opt_in_and_leaves_the_plain_one_unchanged():
    """``refined_interval=True`` adds a finite interval around ``b_crit_refined``; every other number of the result
    is the same as without it (its own random stream), and without it there is no refined interval."""
    from analysis.fits.sweep_fit import analyze_metric

    runs = simulate(np.random.default_rng(705), SHAPES["t3"])
    plain = analyze_metric(runs, m.EVAL_LOSS, bootstrap=200, strict=False, notes=[])
    both = analyze_metric(runs, m.EVAL_LOSS, bootstrap=200, strict=False, notes=[], refined_interval=True)
    assert len(plain) == len(both) > 3
    for p, b in zip(plain, both, strict=True):
        assert "b_crit_refined_ci" not in p
        lo, hi = b["b_crit_refined_ci"]
        assert lo < b["b_crit_refined"] < hi
        assert 0.5 <= b["b_crit_refined_ci_level"] <= 0.99
        same = {k: v for k, v in b.items() if not k.startswith("b_crit_refined_ci")}
        assert same == {k: v for k, v in p.items() if not k.startswith("b_crit_refined_ci")}
