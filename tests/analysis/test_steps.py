"""Steps-to-target: interpolation against hand-computed float64 values, censoring, exclusion, best per B."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import flags as fl
from analysis import metrics as m
from analysis.loaders import Series, runs_from_tables
from analysis.schema import metrics_table, trials_table
from analysis.steps import (
    aggregate_seeds,
    best_per_batch,
    crossing_jitter,
    excluded_counts,
    final_losses,
    refine_lr,
    settings_of,
    steps_to_target,
    trial_extent,
    usable,
)


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
    steps = steps_to_target(series, n, [y])[0]
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


def test_trial_extent():
    s = _series([(0, 0, 1.0), (0, 10, 0.6), (0, 30, 0.3), (2, 5, 0.9)])
    last, spacing = trial_extent(s, 3)
    np.testing.assert_array_equal(last, [30.0, -1.0, 5.0])
    np.testing.assert_array_equal(spacing, [15.0, np.nan, np.nan])


def test_refine_lr_recovers_the_vertex_of_a_parabola_in_log_lr():
    lrs = np.array([0.1, 0.2, 0.4, 0.8, 1.6])
    true_lr, s0 = 0.3, 100.0  # log S = log s0 + 0.5·(log2 lr - log2 0.3)²
    steps = s0 * np.exp(0.5 * np.log2(lrs / true_lr) ** 2)
    runs = _runs([(8, lr, 0, B, _line(1000, s)) for lr, s in zip(lrs, steps, strict=True)])
    st, val, low, best = _best(runs)
    ref, ref_lr = refine_lr(val, st, best)
    assert best.steps[0] == pytest.approx(steps.min(), rel=1e-9) and steps.min() > s0 * 1.05  # grid misses by > 5%
    assert ref[0] == pytest.approx(s0, rel=1e-9) and ref_lr[0] == pytest.approx(true_lr, rel=1e-9)


def test_refine_lr_keeps_the_plain_minimum_at_the_edge():
    runs = _runs([(8, lr, 0, B, _line(1000, s)) for lr, s in [(0.1, 50.0), (0.2, 60.0), (0.4, 90.0)]])
    st, val, low, best = _best(runs)
    ref, ref_lr = refine_lr(val, st, best)
    assert ref[0] == best.steps[0] == pytest.approx(50.0) and ref_lr[0] == 0.1


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


def test_seed_bootstrap_redraws_seeds_and_respects_censoring():
    from analysis.pareto import bootstrap_best

    runs = _runs(
        [
            (8, 0.1, 0, B, _line(300, 100)),  # setting A: 100, 100 -> 100 in every replicate
            (8, 0.1, 1, B, _line(300, 100)),
            (8, 0.2, 0, B, _line(300, 50)),  # setting B: 50 and a seed stopped at 30 without reaching
            (8, 0.2, 1, R, _line(30, 200)),
        ]
    )
    series = runs.series(m.EVAL_LOSS)
    steps = steps_to_target(series, 4, [0.5])
    last, _ = trial_extent(series, 4)
    st = settings_of(runs, usable(runs))
    _, reps = bootstrap_best(steps, last, st, 4000, np.random.default_rng(0))
    r = reps[0, :, 0]
    # B draws (50, 50) with probability 1/4: known, adjusted residual 0 -> 50 is the best; otherwise B holds a
    # censored seed with a lower bound below 100 -> the batch size is censored in that replicate (nan)
    np.testing.assert_allclose(r[np.isfinite(r)], 50.0, rtol=1e-12)
    assert np.mean(np.isnan(r)) == pytest.approx(0.75, abs=0.03)
