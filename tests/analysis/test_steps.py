"""Steps-to-target: interpolation against hand-computed float64 values, censoring, exclusion, best per B."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core import metrics as m
from analysis.fits import flags as fl
from analysis.fits.steps import (
    aggregate_seeds,
    best_per_batch,
    crossing_jitter,
    excluded_counts,
    final_losses,
    settings_of,
    steps_to_target,
    trial_extent,
    usable,
)
from analysis.sources.loaders import Series, runs_from_tables
from analysis.sources.schema import metrics_table, trials_table


def _series(rows):
    t, s, v = (np.array(c) for c in zip(*rows, strict=True))
    return Series(t.astype(np.int64), s.astype(np.int64), v.astype(np.float64))


def test_interpolated_crossings_by_hand():
    # trial 0: 1.0@0, 0.6@10, 0.3@20 ; trial 1: 0.9@0, 0.8@5 (never below 0.5) ; trial 2: 0.2@0
    s = _series([(0, 0, 1.0), (0, 10, 0.6), (0, 20, 0.3), (1, 0, 0.9), (1, 5, 0.8), (2, 0, 0.2)])
    got = steps_to_target(s, 4, [0.5, 0.7, 0.3, 0.95])
    # 0.5: between (10, 0.6) and (20, 0.3): 10 + (0.6-0.5)/(0.6-0.3)*10 = 13.333...
    assert got[0, 0] == pytest.approx(10 + 10 * 0.1 / 0.3, rel=1e-14)
    assert got[0, 1] == np.inf  # censored
    assert got[0, 2] == 0.0  # below the target at its first evaluation
    assert got[0, 3] == np.inf  # no rows at all
    assert got[1, 0] == pytest.approx(0 + 10 * 0.3 / 0.4, rel=1e-14)  # 7.5
    assert got[2, 0] == 20.0  # exactly at the target: the evaluation's own step
    assert got[3, 1] == pytest.approx(0.0)  # 0.9 <= 0.95 at its first row
    assert got[3, 0] == pytest.approx(10 * 0.05 / 0.4, rel=1e-14)


def test_nan_evaluations_never_count_and_do_not_poison_interpolation():
    s = _series([(0, 0, 1.0), (0, 10, np.nan), (0, 20, 0.4), (1, 0, 1.0), (1, 10, np.nan)])
    got = steps_to_target(s, 2, [0.5])
    assert got[0, 0] == 20.0  # the previous evaluation is NaN: take the crossing evaluation's step
    assert got[0, 1] == np.inf


def test_first_crossing_not_a_later_one():
    s = _series([(0, 0, 1.0), (0, 10, 0.4), (0, 20, 0.8), (0, 30, 0.2)])
    assert steps_to_target(s, 1, [0.5])[0, 0] == pytest.approx(10 * 0.5 / 0.6)


def _runs(spec):
    """Runs from ``[(batch_size, lr, seed, status, [(step, value), ...]), ...]`` (trial ids t0, t1, ...)."""
    n = len(spec)
    trials = trials_table(
        {
            "trial_id": [f"t{i}" for i in range(n)], "batch_size": [r[0] for r in spec],
            "micro_batch_size": [r[0] for r in spec], "grad_accum": [1] * n, "num_workers": [1] * n,
            "lr": [float(r[1]) for r in spec], "seed": [r[2] for r in spec], "status": [r[3] for r in spec],
        }
    )  # fmt: skip
    rows = [(f"t{i}", st, r[0] * st, m.EVAL_LOSS, v) for i, r in enumerate(spec) for st, v in r[4]]
    metrics = metrics_table({k: [row[j] for row in rows] for j, k in enumerate(metrics_table_keys)})
    return runs_from_tables(trials, metrics)


metrics_table_keys = ("trial_id", "step", "examples", "metric", "value")
R, B, D = m.STATUS_REACHED_TARGET, m.STATUS_BUDGET_SPENT, m.STATUS_DIVERGED


def _line(stop: int, cross: float, every: int = 10):
    """Evaluations every ``every`` steps up to ``stop`` of a line that is 0.5 at step ``cross`` (slope -0.01)."""
    return [(s, 0.5 - 0.01 * (s - cross)) for s in range(0, stop + 1, every)]


def _best(runs, y=0.5):
    series = runs.series(m.EVAL_LOSS)
    n = len(runs.trial_ids)
    steps = steps_to_target(series, n, [y], local=False)[0]  # the lines' crossings exactly
    last, _ = trial_extent(series, n)
    ok = usable(runs)
    steps[~ok] = np.nan
    st = settings_of(runs, ok)
    val, low = aggregate_seeds(steps, last, st)
    return st, val, low, best_per_batch(val, low, st)


def test_best_per_batch_censoring_by_hand():
    runs = _runs(
        [
            (8, 0.1, 0, B, _line(100, 40)),  # reaches 0.5 at step 40
            (8, 0.2, 0, R, _line(30, 25)[:-1]),  # stopped at step 20 (global target) before 0.5: faster? unknown
            (16, 0.1, 0, B, _line(100, 50)),  # 50
            (16, 0.2, 0, R, _line(60, 70)),  # stopped at 60 >= 50 without reaching: cannot beat 50
            (16, 0.4, 0, D, _line(20, 5)),  # diverged: excluded even though it "reached" at 5
            (32, 0.1, 0, B, _line(50, 90)),  # never reaches: nothing known at 32
            (64, 0.1, 0, B, _line(200, 30)),
            (64, 0.2, 0, B, _line(200, 20)),
        ]
    )
    st, _, _, best = _best(runs)
    np.testing.assert_array_equal(best.batch_sizes, [8, 16, 32, 64])
    np.testing.assert_allclose(best.steps, [np.inf, 50.0, np.inf, 20.0])  # 8 censored, 32 unreached
    np.testing.assert_array_equal(best.censored, [True, False, False, False])
    np.testing.assert_allclose(best.candidate, [40.0, 50.0, np.inf, 20.0])  # 40 at B=8 is an upper bound at most
    assert st.lr[best.blocker[0]] == 0.2 and best.blocker[1] == -1
    np.testing.assert_array_equal(st.lr[best.setting[[1, 3]]], [0.1, 0.2])
    assert best.setting[2] == -1


def test_a_lower_bound_equal_to_the_best_does_not_censor():
    # lr 0.1 reaches 0.5 exactly at its evaluation at step 50; lr 0.2 was stopped at step 50 without reaching it, so
    # it needs at least 50 steps: it cannot be faster, and 50 is the known best (both are exp(log 50), bit-equal)
    runs = _runs([(8, 0.1, 0, B, _line(100, 50)), (8, 0.2, 0, B, _line(50, 70))])
    st, val, low, best = _best(runs)
    assert val[1] == np.inf and low[1] == val[0]
    assert not best.censored[0] and best.steps[0] == pytest.approx(50.0, rel=1e-12) and best.blocker[0] == -1


def test_seeds_averaged_geometric_mean_before_the_best_setting():
    runs = _runs(
        [
            (8, 0.1, 0, B, _line(300, 40)),  # lr 0.1: seeds 40 and 90 -> 60 (the min over all trials would be 40)
            (8, 0.1, 1, B, _line(300, 90)),
            (8, 0.2, 0, B, _line(300, 50)),  # lr 0.2: 50 and 70 -> sqrt(3500) = 59.16: the best setting
            (8, 0.2, 1, B, _line(300, 70)),
            (8, 0.4, 0, B, _line(300, 30)),  # lr 0.4: one seed never reaches by 200: >= sqrt(30·200) = 77.5
            (8, 0.4, 1, B, _line(200, 250)),
            (16, 0.1, 0, B, _line(300, 40)),
            (16, 0.1, 1, B, _line(300, 60)),
            (16, 0.4, 0, B, _line(300, 20)),  # lr 0.4 at 16: one seed stopped at 50 -> >= sqrt(20·50) = 31.6 < 49
            (16, 0.4, 1, R, _line(50, 250)),
        ]
    )
    st, val, low, best = _best(runs)
    np.testing.assert_array_equal(st.n_seeds, [2, 2, 2, 2, 2])
    np.testing.assert_allclose(val, [60.0, np.sqrt(50 * 70), np.inf, np.sqrt(40 * 60), np.inf], rtol=1e-12)
    np.testing.assert_allclose(low[[2, 4]], [np.sqrt(30 * 200), np.sqrt(20 * 50)], rtol=1e-12)
    np.testing.assert_allclose(best.steps, [np.sqrt(50 * 70), np.inf], rtol=1e-12)
    np.testing.assert_array_equal(best.censored, [False, True])
    assert st.lr[best.setting[0]] == 0.2


def test_settings_group_by_nuisance_columns_not_seed():
    runs = _runs([(8, 0.1, s, B, _line(100, 40)) for s in range(3)] + [(8, 0.2, 0, B, _line(100, 40))])
    st = settings_of(runs, usable(runs))
    assert [len(x) for x in st.members] == [3, 1] and list(st.lr) == [0.1, 0.2] and st.lr_only.all()


def test_settings_also_split_by_the_other_nuisance_and_split_columns():
    # B = 8: weight_decay 0.0 (seeds 0, 1), weight_decay 0.1 and warmup_steps 10 are three settings of the same lr;
    # B = 16: the same lr on two splits (micro 8 x accum 2, micro 16 x accum 1) are two settings; B = 32: two lrs
    # only, and a diverged trial that belongs to no setting (-1). Only at B = 32 do the settings differ in lr alone
    # (where analysis.fits.lr_grid.refined_optima may interpolate the optimum in lr).
    trials = trials_table(
        {
            "trial_id": [f"t{i}" for i in range(9)], "batch_size": [8, 8, 8, 8, 16, 16, 32, 32, 32],
            "micro_batch_size": [8, 8, 8, 8, 8, 16, 32, 32, 32], "grad_accum": [1, 1, 1, 1, 2, 1, 1, 1, 1],
            "num_workers": [1] * 9, "lr": [0.1] * 7 + [0.2, 0.4], "seed": [0, 1, 0, 0, 0, 0, 0, 0, 0],
            "status": [B] * 8 + [D], "weight_decay": [0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            "warmup_steps": [0, 0, 0, 10, 0, 0, 0, 0, 0],
        }
    )  # fmt: skip
    runs = runs_from_tables(trials, metrics_table({k: [] for k in metrics_table_keys}))
    st = settings_of(runs, usable(runs))
    g = np.full(9, -1)  # each trial's setting, -1 where not usable
    for k, rows in enumerate(st.members):
        g[rows] = k
    assert g[0] == g[1] and len(set(g[[0, 2, 3, 4, 5, 6, 7]])) == 7 and g[8] == -1
    assert st.batch_size.dtype.kind == "i"  # batch sizes stay integers (the report prints them)
    np.testing.assert_array_equal(st.batch_size, [8, 8, 8, 16, 16, 32, 32])
    np.testing.assert_array_equal(sorted(st.n_seeds), [1, 1, 1, 1, 1, 1, 2])
    np.testing.assert_array_equal(st.lr_only, [False, False, True])


def test_settings_members_in_ascending_trial_order():
    # 40 trials alternating between two lrs (20 seeds each): each setting lists its trials in ascending row order
    runs = _runs([(8, (0.1, 0.2)[i % 2], i // 2, B, _line(100, 40)) for i in range(40)])
    st = settings_of(runs, usable(runs))
    np.testing.assert_array_equal(st.members[0], np.arange(0, 40, 2))
    np.testing.assert_array_equal(st.members[1], np.arange(1, 40, 2))


def test_trial_extent():
    # trial 0: 3 rows from 0 to 30 (spacing 30/2); trial 2: one row; trial 3: two rows 5 and 15, first one not at 0
    s = _series([(0, 0, 1.0), (0, 10, 0.6), (0, 30, 0.3), (2, 5, 0.9), (3, 5, 0.9), (3, 15, 0.8)])
    last, spacing = trial_extent(s, 4)
    np.testing.assert_array_equal(last, [30.0, -1.0, 5.0, 15.0])
    np.testing.assert_array_equal(spacing, [15.0, np.nan, np.nan, 10.0])


def test_crossing_jitter_small_on_a_steep_clean_descent_large_on_a_noisy_plateau():
    rng = np.random.default_rng(0)
    t = np.arange(0, 400, 2)
    steep = 0.1 + 0.9 / (1 + t / 50)  # crosses 0.3 at 175
    plateau = 0.3 + 0.2 * np.exp(-t / 30) + rng.normal(0, 0.005, len(t))  # hovers at the target
    s = _series(
        [(0, a, v) for a, v in zip(t, steep, strict=True)] + [(1, a, v) for a, v in zip(t, plateau, strict=True)]
    )
    n = len(t)
    assert crossing_jitter(s, (0, n), 175.0) < 0.01
    first = steps_to_target(s, 2, [0.3])[0, 1]
    assert crossing_jitter(s, (n, 2 * n), first) > 2 * fl.NEAR_FLOOR_FRAC / fl.NEAR_FLOOR_Z  # flagged


def test_usable_and_counts_and_final_losses():
    trials = trials_table(
        {
            "trial_id": ["a", "b", "c", "d", "e"],
            "batch_size": [8] * 5,
            "micro_batch_size": [8] * 5,
            "grad_accum": [1] * 5,
            "num_workers": [1] * 5,
            "lr": [0.1] * 5,
            "seed": [0] * 5,
            "status": [m.STATUS_DIVERGED, m.STATUS_FAILED, m.STATUS_RUNNING, m.STATUS_DIVERGED, m.STATUS_ENDED],
        }
    )
    metrics = metrics_table(
        {
            "trial_id": ["c", "a", "c"],
            "step": [5, 0, 0],
            "examples": [40, 0, 0],
            "metric": [m.EVAL_LOSS] * 3,
            "value": [0.5, 2.0, 0.9],
        }
    )
    runs = runs_from_tables(trials, metrics)
    np.testing.assert_array_equal(usable(runs), [False, False, True, False, False])
    assert excluded_counts(runs) == {m.STATUS_DIVERGED: 2, m.STATUS_FAILED: 1, m.STATUS_ENDED: 1}
    s = runs.series(m.EVAL_LOSS)  # unsorted rows come back sorted by (trial, step)
    np.testing.assert_array_equal(s.trial, [0, 2, 2])
    np.testing.assert_array_equal(s.step, [0, 0, 5])
    first, low = final_losses(s, 4)
    np.testing.assert_array_equal(first, [2.0, np.nan, 0.9, np.nan])
    np.testing.assert_array_equal(low, [2.0, np.nan, 0.5, np.nan])


def test_dense_and_sparse_paths_agree():
    from analysis.fits.steps import _dense, _sparse

    rng = np.random.default_rng(0)
    n, rows = 50, []
    for i in range(n):
        k = int(rng.integers(1, 30))
        vals = np.cumsum(rng.normal(-0.05, 0.1, k)) + 1.0
        vals[rng.random(k) < 0.1] = np.nan
        steps = np.cumsum(rng.integers(1, 5, k))
        rows += [(i, st, va) for st, va in zip(steps, vals, strict=True)]
    s = _series(rows)
    targets = np.array([1.2, 1.0, 0.8, 0.5, -3.0])
    starts = np.flatnonzero(np.r_[True, s.trial[1:] != s.trial[:-1]])
    np.testing.assert_array_equal(_dense(s, n + 2, targets, starts, 30), _sparse(s, n + 2, targets))


def test_seed_bootstrap_redraws_seeds_and_respects_censoring():
    from analysis.fits.pareto import bootstrap_best

    runs = _runs(
        [
            (8, 0.1, 0, B, _line(300, 100)),  # setting A: 100, 100 -> 100 in every replicate
            (8, 0.1, 1, B, _line(300, 100)),
            (8, 0.2, 0, B, _line(300, 50)),  # setting B: 50 and a seed stopped at 30 without reaching
            (8, 0.2, 1, R, _line(30, 200)),
        ]
    )
    series = runs.series(m.EVAL_LOSS)
    steps = steps_to_target(series, 4, [0.5], local=False)
    last, _ = trial_extent(series, 4)
    st = settings_of(runs, usable(runs))
    _, reps = bootstrap_best(steps, last, st, 4000, np.random.default_rng(0))
    r = reps[0, :, 0]
    # B draws (50, 50) with probability 1/4: known, adjusted residual 0 -> 50 is the best; otherwise B holds a
    # censored seed with a lower bound below 100 -> the batch size is censored in that replicate (nan)
    np.testing.assert_allclose(r[np.isfinite(r)], 50.0, rtol=1e-12)
    assert np.mean(np.isnan(r)) == pytest.approx(0.75, abs=0.03)


# crossing_jitter known answers. Each series is a smooth curve v = c0 + c1·x + c2·x² in x = (step - t_cross)/t_cross
# plus a residual r that is orthogonal to 1, x and x² over the rows the fit must use: the least-squares quadratic
# through those rows is then exactly the smooth curve, its slope at the crossing is c1, its residuals are r, and the
# jitter is sqrt(sum r² / (n - 3)) / -c1, with n the number of rows used. Rows the fit must not use are put off the
# curve, so that using them (or leaving out a row it must use) changes the answer.
C0, C1, C2 = 0.5, -0.4, 0.15


def _jitter_series(steps, values):
    steps = np.asarray(steps)
    return Series(np.zeros(len(steps), np.int64), steps.astype(np.int64), np.asarray(values, np.float64))


def _smooth(steps, t_cross, c2=C2):
    x = (np.asarray(steps, np.float64) - t_cross) / t_cross
    return C0 + C1 * x + c2 * x**2


def _assert_orthogonal(steps, t_cross, r):
    """The test's own construction: r has no component along 1, x, x² over these rows."""
    x = (np.asarray(steps, np.float64) - t_cross) / t_cross
    np.testing.assert_allclose(np.vander(x, 3).T @ r, 0.0, atol=1e-15)


def test_crossing_jitter_known_answer_uses_exactly_the_rows_within_the_window():
    # t_cross = 100, width 0.25: the window is [75, 125], both ends included (|125 - 100| = 25.0 exactly). Rows
    # every 5 steps from 0 to 200: 11 rows inside (k = -5..5, k = (step - 100)/5), 30 outside whose values are off
    # the curve by ±0.02 (a fit over them, or over fewer than the 11, gives a different answer).
    steps = np.arange(0, 205, 5)
    k = (steps - 100) // 5
    inside = np.abs(k) <= 5
    eps = 0.003
    p = {1: 1.0, 2: 2.0, 3: 0.0, 4: 0.0, 5: -1.0}  # odd in k and sum_k k·p(k) = 2·(1 + 4 - 5) = 0
    r = np.array([np.sign(j) * p[abs(j)] if j else 0.0 for j in k[inside]]) * eps
    _assert_orthogonal(steps[inside], 100.0, r)
    v = _smooth(steps, 100.0) + np.where(k % 2 == 0, 0.02, -0.02)
    v[inside] = _smooth(steps[inside], 100.0) + r
    want = np.sqrt((r**2).sum() / (11 - 3)) / 0.4  # sum r² = 12·eps², n = 11 rows -> eps·sqrt(1.5)/0.4
    assert want == pytest.approx(eps * np.sqrt(1.5) / 0.4, rel=1e-12)
    got = crossing_jitter(_jitter_series(steps, v), (0, len(steps)), 100.0)
    assert got == pytest.approx(want, rel=1e-9)
    # the row range [a, b) selects the trial's rows: 3 more rows of another trial before it change nothing
    other = Series(
        np.r_[np.zeros(3, np.int64), np.ones(len(steps), np.int64)], np.r_[[0, 10, 20], steps], np.r_[[9.0] * 3, v]
    )
    assert crossing_jitter(other, (3, 3 + len(steps)), 100.0) == pytest.approx(want, rel=1e-9)


def test_crossing_jitter_six_finite_rows_give_a_number_five_give_nan():
    # 6 rows, all within t_cross·(1 ± 0.25) = [75, 125]: x = -0.2..0.2 in steps of 0.08. The residual is the cubic
    # orthogonal polynomial on 6 equally spaced points, (-5, 7, 4, -4, -7, 5): sum p² = 180, n - 3 = 3.
    steps = np.array([80, 88, 96, 104, 112, 120])
    eps = 0.002
    r = eps * np.array([-5.0, 7.0, 4.0, -4.0, -7.0, 5.0])
    _assert_orthogonal(steps, 100.0, r)
    v = _smooth(steps, 100.0) + r
    want = eps * np.sqrt(180 / 3) / 0.4
    assert crossing_jitter(_jitter_series(steps, v), (0, 6), 100.0) == pytest.approx(want, rel=1e-9)
    v5 = v.copy()
    v5[-1] = np.nan  # a NaN evaluation does not count: 5 finite rows < min_pts = 6
    assert np.isnan(crossing_jitter(_jitter_series(steps, v5), (0, 6), 100.0))
    assert np.isnan(crossing_jitter(_jitter_series(steps[:5], v[:5]), (0, 5), 100.0))
    # no crossing step to scale by: t_cross = 0 (and < 0) gives nan, not a division by zero
    assert np.isnan(crossing_jitter(_jitter_series(steps, v), (0, 6), 0.0))
    assert np.isnan(crossing_jitter(_jitter_series(steps, v), (0, 6), -1.0))


def test_crossing_jitter_at_step_one_takes_the_nearest_rows():
    # t_cross = 1: the window [0.75, 1.25] holds one row, so the 6 nearest are used: steps 1; 0, 2; 3; 4; 5 (step 6
    # is farther than all of them). x = step - 1 = -1..4; rows 6..9 are off the curve.
    steps = np.arange(10)
    eps = 0.002
    r = eps * np.array([-5.0, 7.0, 4.0, -4.0, -7.0, 5.0])
    _assert_orthogonal(steps[:6], 1.0, r)
    v = _smooth(steps, 1.0, c2=0.02) + 0.05  # c2 = 0.02: still descending at x = 4
    v[:6] = _smooth(steps[:6], 1.0, c2=0.02) + r
    want = eps * np.sqrt(180 / 3) / 0.4
    assert crossing_jitter(_jitter_series(steps, v), (0, 10), 1.0) == pytest.approx(want, rel=1e-9)


def test_crossing_jitter_nearest_rows_tie_broken_towards_the_earlier_row():
    # 17 rows every 100 steps from 0 to 1600, t_cross = 800: the window [600, 1000] holds 5 rows < min_pts, so the 6
    # nearest are used: 800; 700, 900; 600, 1000; and of 500 and 1100 (both 300 away) the earlier, 500 (a stable
    # sort; numpy's default quicksort picks 1100 here). x = -0.375..0.25 in steps of 0.125; every other row is off
    # the curve by 0.05.
    steps = np.arange(0, 1700, 100)
    use = (steps >= 500) & (steps <= 1000)
    eps = 0.002
    r = eps * np.array([-5.0, 7.0, 4.0, -4.0, -7.0, 5.0])
    _assert_orthogonal(steps[use], 800.0, r)
    v = _smooth(steps, 800.0) + 0.05
    v[use] = _smooth(steps[use], 800.0) + r
    want = eps * np.sqrt(180 / 3) / 0.4
    assert crossing_jitter(_jitter_series(steps, v), (0, 17), 800.0) == pytest.approx(want, rel=1e-9)


def test_crossing_jitter_dof_floor_with_four_rows():
    # min_pts = 4 and 4 rows (x = -0.3, -0.1, 0.1, 0.3): a quadratic leaves one degree of freedom, the residual is the
    # cubic orthogonal polynomial (-1, 3, -3, 1) (sum p² = 20), and the scatter divides by n - 3 = 1.
    steps = np.array([70, 90, 110, 130])
    eps = 0.002
    r = eps * np.array([-1.0, 3.0, -3.0, 1.0])
    _assert_orthogonal(steps, 100.0, r)
    got = crossing_jitter(_jitter_series(steps, _smooth(steps, 100.0) + r), (0, 4), 100.0, min_pts=4)
    assert got == pytest.approx(eps * np.sqrt(20.0) / 0.4, rel=1e-9)


def test_crossing_jitter_flat_or_rising_curve_is_inf():
    steps = np.arange(0, 205, 5)
    x = (steps - 100.0) / 100.0
    rising = 0.5 + 0.3 * x + 0.002 * np.cos(steps)  # fitted slope about +0.3 (between 0 and 1)
    assert crossing_jitter(_jitter_series(steps, rising), (0, len(steps)), 100.0) == np.inf
    # an exactly flat curve: slope 0 (the fit of an all-zero series is exactly zero in any LAPACK), not descending
    assert crossing_jitter(_jitter_series(steps, np.zeros(len(steps))), (0, len(steps)), 100.0) == np.inf


@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_exact_hit_single_hitter_and_unreachable_target_on_both_paths(path):
    from analysis.fits.steps import _dense, _sparse

    # trial 0: 1.0@0, 0.6@10, 0.5@20 ; trial 1: 0.9@0, 0.8@10
    s = _series([(0, 0, 1.0), (0, 10, 0.6), (0, 20, 0.5), (1, 0, 0.9), (1, 10, 0.8)])
    # 0.1 is reached by no row (and comes first: the later targets must still be computed); 0.5 is reached by one row
    # of one trial, trial 0's last, whose value equals it exactly (at or below counts: step 20, no interpolation
    # past it); 0.85: trial 0 between (0, 1.0) and (10, 0.6): 10·0.15/0.4 = 3.75, trial 1 between (0, 0.9) and
    # (10, 0.8): 10·0.05/0.1 = 5.
    targets = np.array([0.1, 0.5, 0.85])
    if path == "dense":
        got = _dense(s, 3, targets, np.array([0, 3]), 3)
    else:
        got = _sparse(s, 3, targets)
    np.testing.assert_array_equal(got[:2], [[np.inf, np.inf, np.inf], [20.0, np.inf, np.inf]])
    np.testing.assert_allclose(got[2], [3.75, 5.0, np.inf], rtol=1e-12)


def test_final_losses_empty_single_row_nan_rows_and_all_nan_trial():
    empty = Series(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    for got in final_losses(empty, 2):  # no rows at all: nan for every trial
        np.testing.assert_array_equal(got, [np.nan, np.nan])
    first, low = final_losses(_series([(1, 0, 0.7)]), 2)  # a single row: it is the first and the lowest
    np.testing.assert_array_equal(first, [np.nan, 0.7])
    np.testing.assert_array_equal(low, [np.nan, 0.7])
    # trial 0: a NaN evaluation between finite ones does not hide the lowest finite value 0.4; trial 1: every
    # evaluation NaN -> nan (no finite row), not inf; trial 2: no rows
    s = _series([(0, 0, 1.0), (0, 10, np.nan), (0, 20, 0.4), (0, 30, 0.6), (1, 0, np.nan), (1, 10, np.nan)])
    first, low = final_losses(s, 3)
    np.testing.assert_array_equal(first, [1.0, np.nan, np.nan])
    np.testing.assert_array_equal(low, [0.4, np.nan, np.nan])


def test_no_usable_trial_gives_no_settings():
    runs = _runs([(8, 0.1, 0, D, _line(20, 5)), (16, 0.1, 0, D, _line(20, 5))])  # every trial diverged
    st, val, low, best = _best(runs)
    assert st.batch_size.shape == (0,) and st.lr.shape == (0,) and st.members == []
    assert st.lr_only.shape == (0,)
    for a in (val, low):  # aggregate_seeds: two empty float arrays
        assert a.shape == (0,) and a.dtype == np.float64
    assert best.batch_sizes.shape == (0,) and best.steps.shape == (0,)


def test_seed_without_evaluations_is_a_lower_bound_of_zero():
    # lr 0.1 at B = 8: seed 0 reaches 0.5 at step 40, seed 1 is still running and has no evaluation yet (last step
    # -1, counted as 0): the setting's value is unknown (inf) and its lower bound the geometric mean of 40 and 0 = 0,
    # computed without a divide-by-zero warning (warnings are errors here). So B = 8 is censored.
    runs = _runs([(8, 0.1, 0, B, _line(100, 40)), (8, 0.1, 1, m.STATUS_RUNNING, []), (8, 0.2, 0, B, _line(100, 60))])
    st, val, low, best = _best(runs)
    np.testing.assert_allclose(val, [np.inf, 60.0], rtol=1e-12)
    np.testing.assert_allclose(low, [0.0, 60.0], rtol=1e-12)
    assert best.censored[0] and best.steps[0] == np.inf and st.lr[best.blocker[0]] == 0.1


def test_no_rows_and_a_single_row():
    # a sweep analysed before any evaluation: every (target, trial) censored, no extent
    empty = Series(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    np.testing.assert_array_equal(steps_to_target(empty, 3, [0.5, 0.2]), np.full((2, 3), np.inf))
    last, spacing = trial_extent(empty, 3)
    np.testing.assert_array_equal(last, [-1.0, -1.0, -1.0])
    np.testing.assert_array_equal(spacing, [np.nan, np.nan, np.nan])
    # one evaluation in the whole sweep: trial 1 at 0.4 at step 30 reaches 0.5 there (no earlier row to interpolate
    # from), not 0.3; it ran to step 30 and has no spacing
    one = _series([(1, 30, 0.4)])
    np.testing.assert_array_equal(steps_to_target(one, 2, [0.5, 0.3]), [[np.inf, 30.0], [np.inf, np.inf]])
    last, spacing = trial_extent(one, 2)
    np.testing.assert_array_equal(last, [-1.0, 30.0])
    np.testing.assert_array_equal(spacing, [np.nan, np.nan])


def test_very_unequal_trials_take_the_sparse_path_with_the_same_answers():
    # trial 0: 6000 evaluations of v = 1 - step/10^4 (0.5 exactly at step 5000); trial 1: one row, 0.3 at step 0;
    # trial 2: 0.9@0, 0.1@10. 3 trials x 6000 > 2 x 6003 + 4096 rows: steps_to_target takes the sparse path.
    steps = np.arange(6000)
    rows = [(0, s, 1.0 - s / 10_000) for s in steps] + [(1, 0, 0.3), (2, 0, 0.9), (2, 10, 0.1)]
    got = steps_to_target(_series(rows), 4, [0.5, 0.45], local=False)
    # 0.5: 5000 (an evaluation equal to it), 0 (first row already below), 10·0.4/0.8 = 5; 0.45: 5500 (v = 0.45 there
    # up to rounding: interpolated between 5499 and 5500), 0, 10·0.45/0.8 = 5.625; trial 3 has no rows
    np.testing.assert_allclose(got, [[5000.0, 0.0, 5.0, np.inf], [5500.0, 0.0, 5.625, np.inf]], rtol=1e-12)


@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_first_row_hit_and_inf_evaluation_on_both_paths(path):
    from analysis.fits.steps import _dense, _sparse

    # trial 0 is at 0.4 <= 0.5 at its first evaluation and rises later (0.45, 0.6): step 0, nothing to interpolate
    # from (its last value 0.6 is not an earlier evaluation). Trial 1 overflows to inf at step 10, then is at 0.4 at
    # step 20: no finite interpolation from inf, so step 20, and no invalid-value warning (warnings are errors here).
    # Both trials have 3 rows (the dense path's reshape, no padding).
    s = _series([(0, 0, 0.4), (0, 10, 0.45), (0, 20, 0.6), (1, 0, 1.0), (1, 10, np.inf), (1, 20, 0.4)])
    targets = np.array([0.5])
    got = _dense(s, 2, targets, np.array([0, 3]), 3) if path == "dense" else _sparse(s, 2, targets)
    np.testing.assert_array_equal(got, [[0.0, 20.0]])
