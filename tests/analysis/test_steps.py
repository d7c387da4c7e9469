"""Steps-to-target: interpolation against hand-computed float64 values, censoring, exclusion, best per B."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import metrics as m
from analysis.loaders import Series, runs_from_tables
from analysis.schema import metrics_table, trials_table
from analysis.steps import best_per_batch, excluded_counts, final_losses, steps_to_target, usable


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


def test_best_per_batch_and_exclusion():
    steps = np.array([50.0, 40.0, np.inf, 30.0, 100.0, np.inf, np.inf])
    bs = np.array([8, 8, 8, 16, 16, 32, 64])
    ok = np.array([True, True, True, False, True, True, False])
    best = best_per_batch(steps, bs, ok)
    np.testing.assert_array_equal(best.batch_sizes, [8, 16, 32])  # 64 has no usable trial at all
    np.testing.assert_array_equal(best.steps, [40.0, 100.0, np.inf])  # the excluded 30 is ignored
    np.testing.assert_array_equal(best.trial, [1, 4, -1])


def test_usable_and_counts_and_final_losses():
    trials = trials_table(
        {
            "trial_id": ["a", "b", "c", "d"],
            "batch_size": [8] * 4,
            "micro_batch_size": [8] * 4,
            "grad_accum": [1] * 4,
            "num_workers": [1] * 4,
            "lr": [0.1] * 4,
            "seed": [0] * 4,
            "status": [m.STATUS_DIVERGED, m.STATUS_FAILED, m.STATUS_RUNNING, m.STATUS_DIVERGED],
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
    np.testing.assert_array_equal(usable(runs), [False, False, True, False])
    assert excluded_counts(runs) == {m.STATUS_DIVERGED: 2, m.STATUS_FAILED: 1}
    s = runs.series(m.EVAL_LOSS)  # unsorted rows come back sorted by (trial, step)
    np.testing.assert_array_equal(s.trial, [0, 2, 2])
    np.testing.assert_array_equal(s.step, [0, 0, 5])
    first, low = final_losses(s, 4)
    np.testing.assert_array_equal(first, [2.0, np.nan, 0.9, np.nan])
    np.testing.assert_array_equal(low, [2.0, np.nan, 0.5, np.nan])


def test_dense_and_sparse_paths_agree():
    from analysis.steps import _dense, _sparse

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
