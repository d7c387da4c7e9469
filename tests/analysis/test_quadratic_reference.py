"""`analysis.quadratic` against float64 brute force: the second-moment recursion iterated step by step, the first
crossing found by scanning every step, the lr tuned by scanning every lr of the grid. (test_quadratic.py: the closed
form against simulated runs; this file: every public function's documented output, shapes and edge cases.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import quadratic as q
from analysis.pareto import fit_pareto

H = np.array([2.0, 1.0, 0.5, 0.25, 0.25])  # a repeated coordinate exercises the merge of equal coordinates
C = H.copy()
M0 = np.array([1.0, 0.5, 2.0, 1.0, 1.0])


def brute_curve(lr: float, B: float, steps: int) -> np.ndarray:
    """E L(t), t = 0..steps, by iterating m' = (1 - lr h)^2 m + lr^2 c / B."""
    m, out = M0.copy(), []
    for _ in range(steps + 1):
        out.append(0.5 * float((H * m).sum()))
        m = (1 - lr * H) ** 2 * m + lr**2 * C / B
    return np.array(out)


def brute_steps(lr: float, B: float, target: float, max_steps: int) -> float:
    curve = brute_curve(lr, B, max_steps)
    below = np.flatnonzero(curve <= target)
    if not below.size:
        return np.inf
    t = int(below[0])
    if t == 0:
        return 0.0
    a, b = curve[t - 1], curve[t]
    return t - 1 + (a - target) / (a - b)  # linear interpolation between the two integer steps


@settings(max_examples=40, deadline=None)
@given(lr=st.floats(0.01, 0.99), B=st.sampled_from([1.0, 4.0, 64.0, 1000.0]))
def test_expected_loss_curve_is_the_recursion(lr: float, B: float) -> None:
    curve = q.expected_loss_curve(H, C, M0, lr, B, 60)
    assert curve.shape == (61,)
    np.testing.assert_allclose(curve, brute_curve(lr, B, 60), rtol=1e-10)


def test_expected_loss_curve_array_lr_and_divergence() -> None:
    lrs = np.array([0.1, 0.5, 1.1])  # 1.1 x h_max = 2.2 > 2: diverges
    curves = q.expected_loss_curve(H, C, M0, lrs, 8.0, 3000)
    assert curves.shape == (3, 3001)
    for lr, curve in zip(lrs[:2], curves[:2], strict=True):
        np.testing.assert_allclose(curve, brute_curve(lr, 8.0, 3000), rtol=1e-9)
    assert curves[2, 0] == pytest.approx(brute_curve(1.1, 8.0, 0)[0]) and curves[2, -1] == np.inf
    assert q.expected_loss_curve(H, C, M0, np.array([0.3]), 8.0, 5).shape == (1, 6)  # an array lr stays 2-D
    curve = q.expected_loss_curve(H, C, M0, 1, 8.0, 5)  # an int lr is a learning rate of 1.0, not integer maths
    np.testing.assert_allclose(curve, brute_curve(1.0, 8.0, 5), rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    lr=st.floats(0.02, 0.95),
    B=st.sampled_from([2.0, 16.0, 256.0]),
    frac=st.floats(0.05, 0.95),
)
def test_expected_steps_to_target_is_the_first_interpolated_crossing(lr: float, B: float, frac: float) -> None:
    floor = float(brute_curve(lr, B, 2000)[-1])  # ~ the stationary loss
    start = 0.5 * float((H * M0).sum())
    target = floor + frac * (start - floor)
    got = q.expected_steps_to_target(H, C, M0, lr, B, target, 2000)
    assert isinstance(got, float)
    assert got == pytest.approx(brute_steps(lr, B, target, 2000), rel=1e-9, abs=1e-9)


def test_expected_steps_edge_cases_and_arrays() -> None:
    start = 0.5 * float((H * M0).sum())
    assert q.expected_steps_to_target(H, C, M0, 0.3, 16.0, start, 100) == 0.0  # reached at step 0
    assert q.expected_steps_to_target(H, C, M0, 0.3, 16.0, 1e-9, 100) == np.inf  # below the noise floor
    assert q.expected_steps_to_target(H, C, M0, 1e-4, 16.0, 0.5 * start, 50) == np.inf  # not within max_steps
    lrs = np.array([0.1, 0.3, 1.2])
    got = q.expected_steps_to_target(H, C, M0, lrs, 16.0, 0.4 * start, 500)
    assert got.shape == (3,)
    np.testing.assert_allclose(got[:2], [brute_steps(lr, 16.0, 0.4 * start, 500) for lr in lrs[:2]], rtol=1e-9)
    assert got[2] == np.inf  # diverged


def test_default_lrs_span_the_stable_range() -> None:
    h = 4.0 * H  # h_max = 8, so that 2/h_max is not 1 (x top and / top would agree at 1)
    lrs = q.default_lrs(h)
    assert len(lrs) == 200 and len(q.default_lrs(h, 7)) == 7
    top = 2.0 / h.max()  # lr h_max < 2 is stable
    assert lrs[0] == pytest.approx(1e-4 * top, rel=1e-12) and lrs[-1] == pytest.approx(0.999 * top, rel=1e-12)
    np.testing.assert_allclose(np.diff(np.log(lrs)), np.log(lrs[1] / lrs[0]), rtol=1e-9)  # geometric


def test_closed_form_b_crit_tunes_the_lr_per_batch_size_by_brute_force() -> None:
    target, bs = 0.3 * 0.5 * float((H * M0).sum()), np.array([1.0, 4.0, 16.0, 64.0, 256.0])
    lrs = np.geomspace(0.02, 0.9, 12)
    res = q.closed_form_b_crit(H, C, M0, target, bs, lrs=lrs, max_steps=3000)
    steps = np.array([[brute_steps(lr, B, target, 3000) for lr in lrs] for B in bs])  # (n_b, n_lr)
    np.testing.assert_allclose(res.steps, steps.min(axis=1), rtol=1e-9)
    np.testing.assert_array_equal(res.best_lr, lrs[steps.argmin(axis=1)])
    assert res.best_lr.dtype == res.steps.dtype == np.float64
    np.testing.assert_array_equal(res.batch_sizes, bs)
    fit = fit_pareto(bs, steps.min(axis=1))
    assert (res.b_crit, res.s_min, res.e_min) == pytest.approx((fit.b_crit, fit.s_min, fit.e_min), rel=1e-9)
    assert res.b_crit == pytest.approx(res.e_min / res.s_min, rel=1e-12)
    default = q.closed_form_b_crit(H, C, M0, target, bs, max_steps=3000)  # lrs=None: the default grid
    assert set(default.best_lr) <= set(q.default_lrs(H)) and np.all(default.steps <= res.steps * (1 + 1e-9) + 1)
    short = q.closed_form_b_crit(H, C, M0, target, bs, lrs=lrs, max_steps=int(steps.min(axis=1).max()) - 1)
    assert np.isinf(short.steps).any()  # max_steps is the budget of the search
