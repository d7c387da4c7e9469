"""The noisy quadratic model: closed form vs explicit recursion vs Monte Carlo, and B_crit end to end."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import metrics as m
from analysis import quadratic as q
from analysis.loaders import Series, runs_from_tables
from analysis.report import analyze_metric
from analysis.schema import metrics_table, trials_table
from analysis.steps import steps_to_target

H = np.array([1.0, 0.3, 0.1, 0.03])


def _recursion(h, c, m0, lr, B, steps):
    """The second-moment recursion written out step by step (float64)."""
    mm, out = m0.astype(np.float64).copy(), []
    for _ in range(steps + 1):
        out.append(0.5 * (h * mm).sum())
        mm = (1 - lr * h) ** 2 * mm + lr**2 * c / B
    return np.array(out)


@pytest.mark.parametrize(("lr", "B"), [(0.5, 1.0), (1.0, 4.0), (1.9, 16.0), (0.05, 2.0)])
def test_closed_form_equals_recursion(lr, B):
    m0 = np.array([1.0, 2.0, 0.5, 3.0])
    got = q.expected_loss_curve(H, 0.7 * H, m0, lr, B, 200)
    np.testing.assert_allclose(got, _recursion(H, 0.7 * H, m0, lr, B, 200), rtol=1e-10, atol=0)


def test_lr_h_equal_one_and_two_edge_cases():
    h = np.array([1.0, 0.5])
    for lr in (1.0, 2.0, 4.0):  # r = 0 for h=1; r = 1 for h=0.5 at lr=4 (flat, grows linearly)
        np.testing.assert_allclose(
            q.expected_loss_curve(h, h, np.ones(2), lr, 8.0, 30), _recursion(h, h, np.ones(2), lr, 8.0, 30), rtol=1e-10
        )


def test_recursion_matches_monte_carlo_average_of_simulate():
    reps, lr, B, steps = 20_000, 0.6, 2.0, 40
    theta0 = np.tile(np.array([1.0, -1.0, 2.0, 1.5]), (reps, 1))
    st, loss = q.simulate(H, H, theta0, lr, B, steps, seed=0, eval_every=4)
    np.testing.assert_array_equal(st, np.arange(0, steps + 1, 4))
    expected = q.expected_loss_curve(H, H, theta0[0] ** 2, lr, B, steps)[st]
    se = loss.std(axis=0) / np.sqrt(reps)
    assert loss.dtype == np.float64
    assert np.all(np.abs(loss.mean(axis=0) - expected) <= 4 * se + 1e-12)
    assert np.abs(loss.mean(axis=0)[-1] / expected[-1] - 1) < 0.05


def test_simulate_reproducible_and_diverges_to_inf():
    a = q.simulate(H, H, np.ones(4), 0.5, 4, 20, seed=3)[1]
    np.testing.assert_array_equal(a, q.simulate(H, H, np.ones(4), 0.5, 4, 20, seed=3)[1])
    assert not np.array_equal(a, q.simulate(H, H, np.ones(4), 0.5, 4, 20, seed=4)[1])
    _, bad = q.simulate(H, H, np.ones(4), 5.0, 4, 2000, seed=0, eval_every=100)
    assert bad[-1] == np.inf


def test_expected_steps_match_full_curve_interpolation():
    m0 = 1 / H
    lrs = np.array([0.05, 0.3, 1.0, 1.9, 2.5])
    got = q.expected_steps_to_target(H, H, m0, lrs, 4.0, 0.5, 3000)
    full = q.expected_loss_curve(H, H, m0, lrs, 4.0, 3000)
    T = full.shape[1]
    ref = steps_to_target(Series(np.repeat(np.arange(5), T), np.tile(np.arange(T), 5), full.ravel()), 5, [0.5])
    np.testing.assert_allclose(got, ref[0], rtol=1e-12)
    assert got[-1] == np.inf  # lr above 2/h_max diverges
    assert q.expected_steps_to_target(H, H, m0, 0.3, 4.0, 0.5, 3000) == pytest.approx(ref[0, 1], rel=1e-12)


H_E2E = np.repeat(np.geomspace(1.0, 1e-2, 8), 128)  # a repeated spectrum: runs average over many coordinates
BS = np.array([1, 2, 4, 8, 16, 32, 64, 128])


def test_closed_form_b_crit_recovered_from_simulated_runs():
    """Simulated SGD runs → steps.py → pareto.py recover the closed-form B_crit within 25%."""
    h, m0 = H_E2E, 1.0 / H_E2E
    target = 0.1 * 0.5 * (h * m0).sum()
    truth = q.closed_form_b_crit(h, h, m0, target, BS, max_steps=5000)
    assert 2 < truth.b_crit < 60  # inside the sampled batch sizes
    assert np.all(np.diff(truth.steps) < 0) and np.all(np.diff(truth.best_lr) >= 0)
    lrs = np.geomspace(0.1, 1.95, 16)
    b, lr = (g.ravel() for g in np.meshgrid(BS, lrs, indexing="ij"))
    n = len(b)
    signs = np.random.default_rng(5).choice([-1.0, 1.0], (n, len(h)))
    st, loss = q.simulate(h, h, signs * np.sqrt(m0), lr, b, int(2 * truth.steps.max()), seed=1)
    ids = [f"q{i}" for i in range(n)]
    ones = np.ones(n, np.int64)
    trials = trials_table(
        {
            "trial_id": ids, "batch_size": b, "micro_batch_size": b, "grad_accum": ones, "num_workers": ones,
            "lr": lr, "seed": 0 * ones, "status": [m.STATUS_BUDGET_SPENT] * n,
        }
    )  # fmt: skip
    steps = np.tile(st, n)
    metrics = metrics_table(
        {
            "trial_id": np.repeat(ids, len(st)), "step": steps, "examples": steps * np.repeat(b, len(st)),
            "metric": [m.EVAL_LOSS] * steps.size, "value": loss.ravel(),
        }
    )  # fmt: skip
    res = analyze_metric(runs_from_tables(trials, metrics), m.EVAL_LOSS, [target], bootstrap=0)[0]
    assert res["b_crit"] == pytest.approx(truth.b_crit, rel=0.25)
