"""`tests.oracles.nqm` against float64 brute force: the second-moment recursion iterated step by step, the first
crossing found by scanning every step, the lr tuned by scanning every lr of the grid. (test_quadratic.py: the closed
form against simulated runs; this file: every public function's documented output, shapes and edge cases.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.fits.pareto import fit_pareto
from tests.oracles import nqm as q

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


# --- known answers at the edges the tests above do not reach (issue 13's surviving mutants) -----------------------
def _affine_power(r: np.ndarray, qq: np.ndarray, m0: np.ndarray, log2_t: int) -> np.ndarray:
    """m(2**log2_t) of m' = r m + q by repeated squaring of the affine map (exact recursion, no closed form)."""
    for _ in range(log2_t):
        r, qq = r * r, r * qq + qq
    return r * m0 + qq


def test_loss_at_nearly_flat_coordinates_follow_the_recursion_not_the_linear_growth() -> None:
    # 1 - r = 2e-6 and 2e-9: not r = 1 (where m grows as m0 + t q); after t ~ 2/(1-r) steps m has decayed to ~1.4%
    for lr, log2_t in ((1e-6, 21), (1e-9, 31)):
        r, qq = np.array([(1 - lr) ** 2]), np.array([lr**2])
        want = 0.5 * _affine_power(r, qq, np.array([1.0]), log2_t)[0]
        got = q._loss_at(np.ones(1), np.ones(1), np.ones(1), np.array([lr]), 1.0, np.array([2.0**log2_t]))[0, 0]
        assert 0.005 < want < 0.01
        assert got == pytest.approx(want, rel=1e-4)


def test_steps_to_target_equal_to_a_flat_stationary_loss_is_step_zero() -> None:
    lr, B = 0.3, 4.0
    floor = lr**2 * C / B / (1.0 - (1.0 - lr * H) ** 2)  # m* = q / (1 - r): started there, E L(t) stays there
    target = q.expected_loss_curve(H, C, floor, lr, B, 0)[0]
    assert q.expected_steps_to_target(H, C, floor, lr, B, target, 100) == 0.0  # <= target, not < target


def test_simulate_integer_inputs_and_one_eval_per_step() -> None:
    st, loss = q.simulate(np.array([1, 2]), np.array([1, 1]), np.array([3, 1]), 0.5, 4, 5, seed=0)
    np.testing.assert_array_equal(st, np.arange(6))
    assert loss.shape == (6,) and loss[0] == 0.5 * (1 * 9 + 2 * 1)
    np.testing.assert_array_equal(loss, q.simulate([1.0, 2.0], [1.0, 1.0], [3.0, 1.0], 0.5, 4.0, 5, seed=0)[1])


def test_closed_form_b_crit_default_budget_is_20000_steps() -> None:
    h = c = m0 = np.ones(1)
    lr, bs = 1e-4, [1, 2, 4, 8]  # integer batch sizes
    r = (1 - lr) ** 2
    star = lambda b: lr / (b * (2 - lr))  # noqa: E731
    target = 0.5 * (star(1) + r**20000.5 * (1 - star(1)))  # B = 1 crosses half a step after the default budget
    res = q.closed_form_b_crit(h, c, m0, target, bs, lrs=[lr])
    assert res.batch_sizes.dtype == np.float64
    assert res.steps[0] == np.inf
    for b, s in zip(bs[1:], res.steps[1:], strict=True):
        exact = math.log((2 * target - star(b)) / (1 - star(b))) / math.log(r)
        assert s == pytest.approx(exact, abs=1e-3) and s < 20000


def test_branch_losses_count_repeated_coordinates_and_default_to_the_linear_rule() -> None:
    lr0, b0, k, delta = 0.1, 2.0, 2.0, 8.0  # the k = 2 branch: lr 0.2 (linear), batch 4, evaluated at step 8/4 = 2
    h, c, m0 = np.array([1.0, 1.0, 0.5]), np.array([1.0, 1.0, 2.0]), np.array([2.0, 2.0, 1.0])
    mm = m0.copy()
    for _ in range(2):
        mm = (1 - 0.2 * h) ** 2 * mm + 0.2**2 * c / 4.0
    want = 0.5 * float((h * mm).sum())
    got = q.branch_losses(h, c, m0, lr0, b0, np.array([k]), delta, np.array([1.0]))
    assert got[0] == pytest.approx(want, rel=1e-12)


HB = np.arange(1, 21, dtype=np.float64) ** -0.5  # the branched tests' spectrum


def _excess(rule: str, m0: np.ndarray, ks) -> np.ndarray:
    fr = np.array([0.5, 1.0])
    base = q.branch_losses(HB, 2 * HB, m0, 0.01, 4.0, np.array([1.0]), 4096.0, fr, rule)[0]
    return q.branch_losses(HB, 2 * HB, m0, 0.01, 4.0, np.asarray(ks, float), 4096.0, fr, rule) / base - 1.0


def _k_star(rule: str, m0: np.ndarray, eps: float, **kw) -> float:
    return q.branched_critical_k(HB, 2 * HB, m0, 0.01, 4.0, 4096.0, eps, np.array([0.5, 1.0]), rule, **kw)


def test_branched_critical_k_solves_its_own_rule_between_the_first_grid_points() -> None:
    m0 = np.full(len(HB), 0.5)  # far above the noise floor: a sqrt-rule branch at k > 1 makes less progress
    ks = np.array([1.01, 1.5, 40.0])
    exc = _excess("sqrt", m0, ks)
    assert np.all(np.diff(np.r_[0.0, exc]) > 0)
    for k, e in zip(ks, exc, strict=True):  # 1.01 lies below the scan's second point 1024**(1/399) = 1.0175
        assert _k_star("sqrt", m0, e) == pytest.approx(k, rel=1e-9)
    assert _k_star("sqrt", m0, -0.01) == 1.0  # the k = 1 branch already exceeds a negative tolerance
    e = _excess("sqrt", m0, [1024.5])[0]  # just past the default k_max = 1024
    assert _k_star("sqrt", m0, e) == float("inf") and _k_star("sqrt", m0, e, k_max=1100.0) == pytest.approx(1024.5)
    lin = q.branched_critical_k(HB, 2 * HB, m0, 0.01, 4.0, 4096.0, exc[1], np.array([0.5, 1.0]))  # default: linear
    assert lin == _k_star("linear", m0, exc[1]) and lin != pytest.approx(1.5, rel=1e-3)


def test_branched_critical_k_zero_tolerance_at_the_noise_floor() -> None:
    lr0, b0, c = 0.01, 4.0, 2 * HB
    floor = lr0 * c / (b0 * HB * (2 - lr0 * HB))  # m* of the k = 1 branch: it stays at its loss
    assert np.all(_excess("constant", floor, [2.0, 64.0, 1024.0]) < 0)  # bigger batches only lower the noise
    assert _k_star("constant", floor, 0.0) == float("inf")  # excess > 0 is never reached (0 at k = 1 is not > 0)


def test_a_coordinate_at_rest_without_noise_stays_at_rest_at_any_lr() -> None:
    # lr h = 4 > 2 for the first coordinate, but E[θ²] = 0 and c = 0 there: the recursion keeps it at 0 (was inf)
    h, c, m0 = np.array([4.0, 0.1]), np.array([0.0, 0.1]), np.array([0.0, 1.0])
    mm, want = m0.copy(), []
    for _ in range(401):  # 9**t overflows float64 from t = 323 on
        want.append(0.5 * float((h * mm).sum()))
        mm = (1 - h) ** 2 * mm + c / 2.0
    np.testing.assert_allclose(q.expected_loss_curve(h, c, m0, 1.0, 2.0, 400), want, rtol=1e-12)


def test_steps_to_target_finds_a_narrow_dip_on_the_256_point_grid() -> None:
    # a fast coordinate decays (tau ~ 50 steps) while a noisy slow one fills up (tau ~ 5000): E L dips near t = 312 and
    # rises again; a target 1e-4 above the minimum is below E L only at steps 311..314, which the 256-point geometric
    # grid of 1..10000 hits (grids of 50 or 257 points, or from 2, would not: the crossing would be missed, inf)
    h, c, m0, lr = np.array([1.0, 0.01]), np.array([0.0, 40.0]), np.array([1.0, 0.0]), 0.01
    mm, curve = m0.copy(), []
    for _ in range(10_001):
        curve.append(0.5 * float((h * mm).sum()))
        mm = (1 - lr * h) ** 2 * mm + lr**2 * c
    curve = np.array(curve)
    target = curve.min() * (1 + 1e-4)
    below = np.flatnonzero(curve <= target)
    assert (below[0], below[-1]) == (311, 314)
    assert min(curve[310], curve[315]) > curve.min() * (1 + 1.5e-4)  # clear of the target
    t = below[0]
    want = t - 1 + (curve[t - 1] - target) / (curve[t - 1] - curve[t])
    assert q.expected_steps_to_target(h, c, m0, lr, 1.0, target, 10_000) == pytest.approx(want, rel=1e-9)
