"""Float64 reference tests of the two-batch GNS estimators (McCandlish et al. 2018, arXiv 1812.06162, A.1).

Ground truth: a finite population of per-example gradients of a linear-regression model, so the true
gradient ``G`` (population mean) and ``tr(Sigma)`` (population per-example covariance trace) are exact;
batches are drawn iid with replacement, for which ``E|G_b|^2 = |G|^2 + tr(Sigma)/b`` holds exactly.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.core import gns
from analysis.core.gns import (
    GNSWindow,
    b_simple,
    b_simple_with_se,
    from_subbatch_grads,
    g2_unbiased,
    live_metrics,
    mean_with_se,
    trace_unbiased,
    window_b_simple,
    window_estimate,
    window_span,
)
from analysis.core.metrics import (
    GNS_B_BIG,
    GNS_B_SIMPLE,
    GNS_B_SIMPLE_SE,
    GNS_B_SMALL,
    GNS_G2,
    GNS_G2_BIG,
    GNS_G2_SMALL,
    GNS_TRACE,
    gns_names,
)

# --------------------------------------------------------------------------------------------------------
# fixtures: a finite population with known |G|^2 and tr(Sigma)
# --------------------------------------------------------------------------------------------------------

P = 16  # parameters of the linear model


def _linreg_grads(rng: np.random.Generator, n: int, x_scale: float, offset: float) -> np.ndarray:
    """Per-example gradients x_i (x_i . w - y_i) of 0.5 (x.w - y)^2, at w away from the optimum."""
    x = x_scale * rng.normal(size=(n, P))  # (n, P)
    w_star = rng.normal(size=P)
    y = x @ w_star + 0.5 * rng.normal(size=n)  # (n,)
    w = w_star + offset * rng.normal(size=P)
    return x * (x @ w - y)[:, None]  # (n, P)


def _truth(grads: np.ndarray) -> tuple[float, float]:
    """Exact (|G|^2, tr Sigma) of the population (covariance with 1/N: draws are with replacement)."""
    mean = grads.mean(axis=0)
    return float(mean @ mean), float(((grads - mean) ** 2).sum(axis=1).mean())


def _draw_two_batch(
    rng: np.random.Generator, grads: np.ndarray, b: int, m: int, reps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per repetition: m iid small batches of b (with replacement); returns (g2_small, g2_big) series."""
    idx = rng.integers(0, grads.shape[0], size=(reps, m, b))
    sub = grads[idx].mean(axis=2)  # (reps, m, P): small-batch mean gradients
    g2_small = np.einsum("rmp,rmp->r", sub, sub) / m  # mean of the m squared norms
    big = sub.mean(axis=1)  # (reps, P): big batch of B = m b
    return g2_small, np.einsum("rp,rp->r", big, big)


@pytest.fixture(scope="module")
def population() -> np.ndarray:
    return _linreg_grads(np.random.default_rng(1234), n=400, x_scale=1.0, offset=0.3)


# --------------------------------------------------------------------------------------------------------
# closed forms
# --------------------------------------------------------------------------------------------------------


def test_two_batch_closed_form_scalars() -> None:
    assert g2_unbiased(5.0, 3.0, 2, 8) == pytest.approx((8 * 3.0 - 2 * 5.0) / 6, rel=1e-15)
    assert trace_unbiased(5.0, 3.0, 2, 8) == pytest.approx(2.0 / (0.5 - 0.125), rel=1e-15)
    assert isinstance(g2_unbiased(5.0, 3.0, 2, 8), float)
    assert isinstance(trace_unbiased(5.0, 3.0, 2, 8), float)


def test_two_batch_exact_on_expectations() -> None:
    """Fed the exact expectations |G|^2 + tr/b, both estimators return |G|^2 and tr exactly."""
    g2, tr = 2.5, 40.0
    for b, B in [(1, 2), (8, 32), (100, 400), (3, 1000)]:
        small, big = g2 + tr / b, g2 + tr / B
        assert g2_unbiased(small, big, b, B) == pytest.approx(g2, rel=1e-12)
        assert trace_unbiased(small, big, b, B) == pytest.approx(tr, rel=1e-12)


def test_two_batch_broadcasts() -> None:
    small = np.array([5.0, 6.0, 7.0])
    big = np.array([3.0, 3.5, 4.0])
    b = np.array([2, 4, 8])
    out = g2_unbiased(small, big, b, 16)
    expected = [(16 * big[i] - b[i] * small[i]) / (16 - b[i]) for i in range(3)]
    np.testing.assert_allclose(out, expected, rtol=1e-15)
    expected_tr = [(small[i] - big[i]) / (1 / b[i] - 1 / 16) for i in range(3)]
    np.testing.assert_allclose(trace_unbiased(small, big, b, 16), expected_tr, rtol=1e-15)
    assert trace_unbiased(small, big, 2, 16).shape == (3,)


@pytest.mark.parametrize("fn", [g2_unbiased, trace_unbiased])
@pytest.mark.parametrize(("b", "B"), [(8, 8), (9, 8), (0, 8), (0.5, 8), (np.array([2, 8]), 8)])
def test_two_batch_rejects_bad_sizes(fn, b, B) -> None:
    with pytest.raises(ValueError):
        fn(1.0, 0.5, b, B)


def test_b_simple_ratio() -> None:
    assert b_simple(30.0, 2.0) == 15.0
    np.testing.assert_array_equal(b_simple(np.array([1.0, 4.0]), np.array([2.0, -1.0])), [0.5, -4.0])
    assert math.isnan(b_simple(1.0, 0.0))


# --------------------------------------------------------------------------------------------------------
# unbiasedness against ground truth, globally and per bin
# --------------------------------------------------------------------------------------------------------

REPS = 10_000  # MC standard error ~0.3-0.4% of the truth: a 2% tolerance is 5+ SE, yet a 2% bias fails
B_SMALL, M = 16, 4  # four small batches of 16 -> B = 64


def _assert_unbiased(grads: np.ndarray, rng: np.random.Generator, b: int = B_SMALL, reps: int = REPS) -> None:
    g2_true, tr_true = _truth(grads)
    g2_small, g2_big = _draw_two_batch(rng, grads, b, M, reps)
    for est, true in [
        (g2_unbiased(g2_small, g2_big, b, b * M), g2_true),
        (trace_unbiased(g2_small, g2_big, b, b * M), tr_true),
    ]:
        mean, se = mean_with_se(est)
        assert se < 0.005 * abs(true), (se, true)  # the MC error makes 2% a meaningful test
        assert abs(mean - true) < 0.02 * abs(true), (mean, true, se)
        assert abs(mean - true) < 4 * se, (mean, true, se)


def test_unbiased_against_population_truth(population: np.ndarray) -> None:
    _assert_unbiased(population, np.random.default_rng(7))


def test_unbiased_per_bin() -> None:
    """A population split into bins with different means and covariances (heavy-tailed noise): each
    bin's estimates are unbiased for that bin's own |G_k|^2 and tr(Sigma_k)."""
    rng = np.random.default_rng(11)
    n, noise_var = 300, np.array([0.25, 1.0, 2.5])  # per-bin noise variance per coordinate; |mean| = 1 in every bin
    bin_of = np.repeat(np.arange(3), n // 3)  # (n,): bin label of each example
    means = rng.normal(size=(3, P))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    noise = rng.standard_t(5, size=(n, P))  # heavy-tailed, then centred and scaled per bin so that, whatever the
    for k in range(3):  # seed, bin k's population has |G_k|^2 = 1 and tr(Sigma_k) = noise_var[k] P exactly
        z = noise[bin_of == k] - noise[bin_of == k].mean(axis=0)
        noise[bin_of == k] = z * math.sqrt(noise_var[k] * P / np.mean(np.sum(z * z, axis=1)))
    grads = means[bin_of] + noise  # (n, P)

    b_simples = [_truth(grads[bin_of == k])[1] / _truth(grads[bin_of == k])[0] for k in range(3)]
    np.testing.assert_allclose(b_simples, noise_var * P, rtol=1e-9)  # the bins differ 10x by construction
    for k, b in enumerate([16, 16, 32]):  # the noisiest bin measured with a bigger b, as one would
        _assert_unbiased(grads[bin_of == k], rng, b=b)


# --------------------------------------------------------------------------------------------------------
# the defects ours avoid are biased where ours is not: an unsquared |G_b| in the |G|^2 estimator, and sub-batches of
# unequal size averaged with equal weights (docs/design.md)
# --------------------------------------------------------------------------------------------------------


def test_seed_unsquared_norm_is_biased(population: np.ndarray) -> None:
    """An unsquared norm: |G_b| instead of |G_b|^2 in the |G|^2 estimator, on the very same draws as ours."""
    rng = np.random.default_rng(21)
    g2_true, _ = _truth(population)
    b, m, reps = B_SMALL, M, 4000
    idx = rng.integers(0, population.shape[0], size=(reps, m, b))
    sub = population[idx].mean(axis=2)  # (reps, m, P)
    norms_sq = np.einsum("rmp,rmp->rm", sub, sub)
    big = sub.mean(axis=1)
    g2_big = np.einsum("rp,rp->r", big, big)

    ours = g2_unbiased(norms_sq.mean(axis=1), g2_big, b, b * m)
    seed = (b * m * g2_big - b * np.sqrt(norms_sq).mean(axis=1)) / (b * m - b)
    ours_mean, ours_se = mean_with_se(ours)
    seed_mean, seed_se = mean_with_se(seed)
    assert abs(ours_mean - g2_true) < 3 * ours_se
    assert abs(seed_mean - g2_true) > 10 * seed_se


def test_seed_equal_weight_subbatches_is_biased(population: np.ndarray) -> None:
    """Unequal sub-batches: b=100 as sub-batches 32,32,32,4 averaged with equal weights (effective b ~ 46.5)."""
    rng = np.random.default_rng(22)
    g2_true, tr_true = _truth(population)
    b, w, reps = 100, 4, 2000  # four "ranks" of b = 100 -> B = 400
    bounds = np.cumsum([0, 32, 32, 32, 4])
    ours_g2, ours_tr, seed_g2, seed_tr = [], [], [], []
    for chunk in np.array_split(np.arange(reps), 4):
        idx = rng.integers(0, population.shape[0], size=(chunk.size, w, b))
        ex = population[idx]  # (r, w, b, P)
        small = ex.mean(axis=2)  # (r, w, P): correct mean over the 100 examples
        parts = [ex[:, :, lo:hi].mean(axis=2) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        seed_small = np.mean(parts, axis=0)  # (r, w, P): equal weights on 32, 32, 32, 4
        big = small.mean(axis=1)  # (r, P): the correct B = 400 gradient for both
        g2_big = np.einsum("rp,rp->r", big, big)
        for dst_g2, dst_tr, s in [(ours_g2, ours_tr, small), (seed_g2, seed_tr, seed_small)]:
            g2_small = np.einsum("rwp,rwp->r", s, s) / w
            dst_g2.append(g2_unbiased(g2_small, g2_big, b, b * w))
            dst_tr.append(trace_unbiased(g2_small, g2_big, b, b * w))

    for ours, seed, true in [(ours_g2, seed_g2, g2_true), (ours_tr, seed_tr, tr_true)]:
        ours_mean, ours_se = mean_with_se(np.concatenate(ours))
        seed_mean, seed_se = mean_with_se(np.concatenate(seed))
        assert abs(ours_mean - true) < 3 * ours_se, (ours_mean, true, ours_se)
        assert abs(seed_mean - true) > 10 * seed_se, (seed_mean, true, seed_se)
    # tr(Sigma) inflated by the closed-form factor (11/512 - 1/400) / (1/100 - 1/400) ~ 2.53
    assert mean_with_se(np.concatenate(seed_tr))[0] / tr_true == pytest.approx(2.531, rel=0.05)

    with pytest.raises(ValueError, match="equal"):
        from_subbatch_grads(np.zeros((4, P)), np.array([32, 32, 32, 4]))


def test_seed_dropping_negative_g2_draws_is_biased(population: np.ndarray) -> None:
    """Mistake 3: single-draw |G|^2 estimates below zero silently dropped. Small batches make them common."""
    rng = np.random.default_rng(23)
    g2_true, _ = _truth(population)
    g2_small, g2_big = _draw_two_batch(rng, population, 2, 2, 20_000)  # b = 2, B = 4: very noisy
    est = g2_unbiased(g2_small, g2_big, 2, 4)
    assert np.mean(est < 0) > 0.2  # negative draws are frequent, not a corner case
    kept_mean, kept_se = mean_with_se(est)
    dropped_mean, dropped_se = mean_with_se(est[est >= 0])
    assert abs(kept_mean - g2_true) < 3 * kept_se
    assert abs(dropped_mean - g2_true) > 10 * dropped_se


# --------------------------------------------------------------------------------------------------------
# from_subbatch_grads, standard errors
# --------------------------------------------------------------------------------------------------------


def test_from_subbatch_grads_brute_force() -> None:
    rng = np.random.default_rng(3)
    grads = rng.normal(size=(5, 7))
    g2_small, g2_big, b, B = from_subbatch_grads(grads, np.full(5, 12))
    assert (b, B) == (12, 60)
    assert g2_small == pytest.approx(sum(float(g @ g) for g in grads) / 5, rel=1e-14)
    mean = sum(grads) / 5
    assert g2_big == pytest.approx(float(mean @ mean), rel=1e-14)


@pytest.mark.parametrize(
    ("grads", "sizes"),
    [
        (np.zeros((1, 3)), np.array([4])),  # one sub-batch: no big batch
        (np.zeros((2, 3)), np.array([4, 5])),  # unequal
        (np.zeros((2, 3)), np.array([4])),  # sizes do not pair up
        (np.zeros(3), np.array([4, 4, 4])),  # not [m, P]
        (np.zeros((2, 3)), np.array([0, 0])),  # empty sub-batches
    ],
)
def test_from_subbatch_grads_rejects(grads: np.ndarray, sizes: np.ndarray) -> None:
    with pytest.raises(ValueError):
        from_subbatch_grads(grads, sizes)


def test_from_subbatch_grads_two_subbatches_of_one_example() -> None:
    """The smallest valid split, m = 2 sub-batches of b = 1 example (B = 2), against a brute-force float64 sum."""
    grads = np.array([[1.0, -2.0, 0.5], [3.0, 1.0, -1.5]])
    g2_small, g2_big, b, B = from_subbatch_grads(grads, np.array([1, 1]))
    assert (b, B) == (1, 2)
    assert g2_small == pytest.approx((5.25 + 12.25) / 2, rel=1e-15)
    assert g2_big == pytest.approx(2.0**2 + 0.5**2 + 0.5**2, rel=1e-15)


def test_float32_and_longdouble_inputs_are_computed_in_float64() -> None:
    """torch hands over float32 gradients: the statistics are formed in float64 from their exact values, not in
    float32 (whose rounding is ~1e-7 relative: 0.01 on a |G_b|^2 of 5e5 here). Results are float64 whatever the
    input width, longdouble included (``_out``: a python float or a float64 array)."""
    rng = np.random.default_rng(8)
    g32 = (rng.normal(size=(3, 50)) + 100.0).astype(np.float32)  # large mean, small spread: float32 sums round
    g64 = g32.astype(np.float64)  # the same numbers, exactly
    ref_small = sum(float(g @ g) for g in g64) / 3
    ref_big = float(g64.mean(axis=0) @ g64.mean(axis=0))
    g2_small, g2_big, _, _ = from_subbatch_grads(g32, np.full(3, 8))
    assert g2_small == pytest.approx(ref_small, rel=1e-14, abs=0.0)
    assert g2_big == pytest.approx(ref_big, rel=1e-14, abs=0.0)

    x32 = (rng.normal(size=7) * 1e-3 + 1e3).astype(np.float32)
    x64 = x32.astype(np.float64)
    mean, se = mean_with_se(x32)
    assert mean == pytest.approx(float(np.sum(x64) / 7), rel=1e-15, abs=0.0)
    assert se == pytest.approx(math.sqrt(float(np.sum((x64 - x64.mean()) ** 2)) / 6 / 7), rel=1e-9, abs=0.0)

    t, g = np.array([1.0, 2.0, 7.0]), np.array([3.0, 0.0, -9.0])
    expected = [1.0 / 3.0, math.nan, 7.0 / -9.0]  # float64 divisions
    ld = np.longdouble
    for tt, gg in [(t.astype(np.float32), g.astype(np.float32)), (t.astype(ld), g), (t, g.astype(ld))]:
        out = b_simple(tt, gg)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("grads", "sizes", "message"),
    [
        (np.zeros(3), np.array([4, 4, 4]), r"^grads must be \[m, P\], got shape \(3,\)$"),
        (np.zeros((1, 3)), np.array([4]), r"^need at least 2 sub-batches, got 1$"),
        (np.zeros((2, 3)), np.array([4]), r"^sizes must have shape \(2,\), got \(1,\)$"),
        (
            np.zeros((2, 3)),
            np.array([4, 5]),
            r"^sub-batch sizes must be equal positive integers, got \[4, 5\] \(equal-weight averaging of unequal "
            r"sub-batches has the wrong effective batch size\)$",
        ),
    ],
)
def test_from_subbatch_grads_messages(grads: np.ndarray, sizes: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_subbatch_grads(grads, sizes)


def test_mean_with_se_of_two_samples_and_messages() -> None:
    assert mean_with_se([1.0, 3.0]) == (2.0, 1.0)  # std(ddof=1) = sqrt(2), over sqrt(2)
    with pytest.raises(ValueError, match=r"^need at least 2 independent samples for a standard error, got 1$"):
        mean_with_se([1.0])
    with pytest.raises(ValueError, match=r"^samples contain non-finite values$"):
        mean_with_se([1.0, np.nan, 2.0])


def test_mean_with_se_keeps_negative_draws() -> None:
    x = np.array([-1.0, 3.0, 0.5, -2.0])
    mean, se = mean_with_se(x)
    assert mean == pytest.approx(0.125, rel=1e-15)
    assert se == pytest.approx(np.std(x, ddof=1) / 2, rel=1e-15)
    with pytest.raises(ValueError):
        mean_with_se([1.0])


def test_b_simple_with_se_delta_method() -> None:
    """Closed form on a small case, and the SE is calibrated against repeated experiments."""
    g = np.array([1.0, 2.0, -0.5, 1.5])
    t = np.array([10.0, 14.0, 9.0, 12.0])
    r, se = b_simple_with_se(g, t)
    assert r == pytest.approx(t.mean() / g.mean(), rel=1e-15)
    c = np.cov(t, g)
    var = (c[0, 0] - 2 * r * c[0, 1] + r * r * c[1, 1]) / (4 * g.mean() ** 2)
    assert se == pytest.approx(math.sqrt(var), rel=1e-12)

    rng = np.random.default_rng(5)
    n, experiments = 200, 2000
    cov = [[1.0, -0.6 * 1.0 * 10.0], [-0.6 * 1.0 * 10.0, 100.0]]  # correlated (g2, trace) draws
    draws = rng.multivariate_normal([2.0, 30.0], cov, size=(experiments, n))  # (e, n, 2)
    ratios = draws[..., 1].mean(axis=1) / draws[..., 0].mean(axis=1)
    ses = [b_simple_with_se(d[:, 0], d[:, 1])[1] for d in draws[:200]]
    assert np.mean(ses) == pytest.approx(ratios.std(ddof=1), rel=0.1)

    with pytest.raises(ValueError):
        b_simple_with_se([1.0, 2.0], [1.0])


# --------------------------------------------------------------------------------------------------------
# the smoothing rule: a window of the last N optimizer steps (GNSWindow, window_b_simple, live_metrics)
# --------------------------------------------------------------------------------------------------------


def _gaussian_stream(
    rng: np.random.Generator, g2_true: np.ndarray, trace: float, b: int, m: int, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact two-batch draws: per entry, ``m`` small-batch means ``G + N(0, Sigma/b)`` in ``dim`` dimensions
    with ``Sigma = trace/dim I`` and ``|G|^2 = g2_true[i]``; returns ``(|G_b|^2, |G_B|^2)`` series, B = m b."""
    n = g2_true.size
    direction = np.zeros(dim)
    direction[0] = 1.0
    g = np.sqrt(g2_true)[:, None, None] * direction  # (n, 1, dim)
    small = g + rng.normal(size=(n, m, dim)) * math.sqrt(trace / dim / b)  # (n, m, dim)
    big = small.mean(axis=1)  # (n, dim)
    return np.einsum("nmd,nmd->n", small, small) / m, np.einsum("nd,nd->n", big, big)


def _transient(steps: np.ndarray) -> np.ndarray:
    """|G|^2 that starts 1000x above its settled value 1 and decays (by step 60 to within 0.6%)."""
    return 1.0 + 999.0 * np.exp(-steps / 5.0)


SETTLED, WINDOW = 60, 50  # the stream has settled by step 60; the time constant is 50 steps


def test_window_estimate_closed_form() -> None:
    g = np.array([1.0, 2.0, -0.5, 1.5])
    t = np.array([10.0, 14.0, 9.0, 12.0])
    est = window_estimate(g, t)
    assert est.ok and est.n == 4
    assert est.value == pytest.approx(t.mean() / g.mean(), rel=1e-15)
    c = np.cov(t, g)
    r = est.value
    assert est.se == pytest.approx(math.sqrt((c[0, 0] - 2 * r * c[0, 1] + r * r * c[1, 1]) / (4 * g.mean() ** 2)))
    assert window_estimate([1.0], [3.0]).state == "warming"  # one measurement: no spread, no SE
    assert window_estimate([], []).state == "warming"
    for bad_g, bad_t in [([-1.0, 0.5], [1.0, 1.0]), ([0.0, 0.0], [1.0, 1.0]), ([1.0, 1.0], [-3.0, 1.0])]:
        est = window_estimate(bad_g, bad_t)  # mean |G|^2 <= 0, or mean tr < 0: no possible ratio
        assert est.state == "undefined" and math.isnan(est.value) and math.isnan(est.se)
    assert window_estimate([1.0, np.inf], [1.0, 1.0]).state == "undefined"


@pytest.mark.parametrize("half", [False, True])
def test_window_holds_the_last_n_steps(half: bool) -> None:
    """Brute force: after each update the estimate is that of the measurements at steps in (s - N, s]; with ``half``
    in (s - min(N, ceil(s / 2)), s]: never the first half of the steps so far."""
    rng = np.random.default_rng(0)
    steps = np.cumsum(rng.integers(1, 4, size=60))  # irregular gaps, as after skipped steps
    g2_small, g2_big = _gaussian_stream(rng, np.full(60, 1.0), 20.0, 4, 2, 8)
    w = GNSWindow(window=10, half=half)
    g2, tr = g2_unbiased(g2_small, g2_big, 4, 8), trace_unbiased(g2_small, g2_big, 4, 8)
    for i, s in enumerate(steps):
        est = w.update(int(s), g2_small[i], g2_big[i], 4, 8)
        span = min(10, math.ceil(s / 2)) if half else 10
        inside = (steps > s - span) & (steps <= s)
        inside[i + 1 :] = False
        ref = window_estimate(g2[inside], tr[inside])
        assert est.n == inside.sum() and est.state == ref.state
        if ref.ok:
            assert est.value == pytest.approx(np.mean(tr[inside]) / np.mean(g2[inside]), rel=1e-12)
            assert est.se == pytest.approx(ref.se, rel=1e-12)
    with pytest.raises(ValueError):
        w.update(int(steps[-1]), 1.0, 0.5, 4, 8)  # steps must increase
    with pytest.raises(ValueError):
        GNSWindow(window=0)


@pytest.mark.parametrize("half", [False, True])
def test_window_series_equals_live_updates(half: bool) -> None:
    rng = np.random.default_rng(1)
    steps = np.arange(5, 505, 5)  # a per-bin cadence: every 5 steps
    g2_small, g2_big = _gaussian_stream(rng, _transient(steps.astype(float)), 30.0, 8, 2, 16)
    value, se = window_b_simple(steps, g2_small, g2_big, 8, 16, window=WINDOW, half=half)
    w = GNSWindow(WINDOW, half=half)
    live = [w.update(int(s), g2_small[i], g2_big[i], 8, 16) for i, s in enumerate(steps)]
    np.testing.assert_allclose(value, [e.value for e in live], rtol=1e-12)
    np.testing.assert_allclose(se, [e.se for e in live], rtol=1e-12)
    with pytest.raises(ValueError):
        window_b_simple(steps[::-1], g2_small, g2_big, 8, 16, window=WINDOW)


def test_window_of_one_step_and_bad_windows() -> None:
    """``window = 1`` is a valid time constant (each window holds one measurement: warming, no value, as live);
    0 and 1.5 steps are not."""
    steps = np.array([1, 2, 4])
    small, big = np.array([5.0, 5.5, 6.0]), np.array([3.0, 3.2, 3.1])
    value, se = window_b_simple(steps, small, big, 2, 8, window=1)
    assert value.shape == se.shape == (3,) and np.all(np.isnan(value)) and np.all(np.isnan(se))
    w = GNSWindow(1)
    assert [w.update(int(s), small[i], big[i], 2, 8).state for i, s in enumerate(steps)] == ["warming"] * 3
    assert not np.isnan(window_b_simple(steps, small, big, 2, 8, window=2)[0][1])  # (0, 2] holds steps 1, 2
    for bad in (0, 1.5, -3):
        with pytest.raises(ValueError, match=rf"^window must be a positive number of optimizer steps, got {bad}$"):
            window_b_simple(steps, small, big, 2, 8, window=bad)


def test_window_b_simple_rejects_bad_series() -> None:
    """One clear message per malformed series: a repeated or decreasing step, step and statistics of different
    lengths, a 2-d input (any of the four), a non-finite statistic (named)."""
    steps, small, big = np.array([1, 2, 3]), np.array([5.0, 5.5, 6.0]), np.array([3.0, 3.2, 3.1])
    for bad_steps in ([1, 2, 2], [1, 3, 2]):
        with pytest.raises(ValueError, match=r"^steps must be strictly increasing$"):
            window_b_simple(bad_steps, small, big, 2, 8, window=10)
    with pytest.raises(ValueError, match=r"^step has shape \(2,\), the statistics \(3,\)$"):
        window_b_simple([1, 2], small, big, 2, 8, window=10)
    two_d = np.ones((2, 3))
    bad = [(two_d * 5, big, 2, 8), (small, two_d * 3, 2, 8), (small, big, two_d * 2, 8), (small, big, 2, two_d * 8)]
    for args in bad:
        with pytest.raises(ValueError, match=r"^expected 1-d series \(one entry per step\), got shape \(2, 3\)$"):
            window_b_simple(steps, *args, window=10)
    for name, args in [("g2_small", (small * [1, np.inf, 1], big)), ("g2_big", (small, big * [1, 1, np.nan]))]:
        with pytest.raises(ValueError, match=rf"^{name} contains non-finite values \(skip steps whose gradients"):
            window_b_simple(steps, *args, 2, 8, window=10)


def test_live_value_tracks_the_settled_truth_after_one_time_constant() -> None:
    """|G|^2 decays 1000x and settles (truth B_simple = 100); one window (50 steps) after it settled, the global
    value (every step) is within 10% of the truth at every step, and so is a bin measured every 5 steps: the
    window is in steps, not measurements. (A bias-corrected EMA of the same time constant is still ~2x off.)"""
    rng = np.random.default_rng(2)
    truth = 100.0
    steps = np.arange(1, 401)
    g2_small, g2_big = _gaussian_stream(rng, _transient(steps.astype(float)), truth, 16, 4, 4000)
    w = GNSWindow(WINDOW)
    live = np.array([w.update(int(s), g2_small[i], g2_big[i], 16, 64).value for i, s in enumerate(steps)])
    after = steps >= SETTLED + WINDOW
    assert np.all(np.abs(live[after] / truth - 1.0) < 0.10), np.max(np.abs(live[after] / truth - 1.0))
    assert live[SETTLED - 1] < 0.5 * truth  # while the transient is in the window the value is (rightly) off

    every = 5  # per bin: one measurement every 5 steps, smaller batches (b = 8, B = 16), so more noise per draw
    bin_steps = steps[every - 1 :: every]
    small_k, big_k = _gaussian_stream(rng, _transient(bin_steps.astype(float)), truth, 8, 2, 40_000)
    wk = GNSWindow(WINDOW)
    bin_live = np.array([wk.update(int(s), small_k[i], big_k[i], 8, 16).value for i, s in enumerate(bin_steps)])
    after = bin_steps >= SETTLED + WINDOW
    assert np.all(np.abs(bin_live[after] / truth - 1.0) < 0.10), np.max(np.abs(bin_live[after] / truth - 1.0))


@pytest.mark.parametrize(("n", "truth", "dim", "cover_lo"), [(50, 100.0, 10, 0.92), (10, 40.0, 6, 0.88)])
def test_window_se_is_honest(n: int, truth: float, dim: int, cover_lo: float) -> None:
    """Coverage on a stationary stream with a known answer: 2000 independent windows of ``n`` measurements
    (b = 16, B = 64; with n = 50 a hard case where 18% of single-step |G|^2 estimates are negative). The RMS SE
    matches the spread of the estimates within 15% / 20%, and ±1.96 SE covers the truth 92-98% of the time
    (n = 10: 88-98%, the SE itself then has 9 degrees of freedom)."""
    rng = np.random.default_rng(3)
    reps = 2000
    g2_small, g2_big = _gaussian_stream(rng, np.full(reps * n, 1.0), truth, 16, 4, dim)
    g2 = g2_unbiased(g2_small, g2_big, 16, 64).reshape(reps, n)
    tr = trace_unbiased(g2_small, g2_big, 16, 64).reshape(reps, n)
    assert np.mean(g2 < 0) > (0.15 if n == 50 else 0.05)  # noisy single-step |G|^2 estimates, often negative
    ests = [window_estimate(g2[r], tr[r]) for r in range(reps)]
    ok = np.array([e.ok for e in ests])
    assert ok.mean() > 0.99
    value = np.array([e.value for e in ests])[ok]
    se = np.array([e.se for e in ests])[ok]
    honesty = math.sqrt(np.mean(se**2)) / np.std(value, ddof=1)
    assert 0.85 < honesty < (1.15 if n == 50 else 1.2), honesty
    cover = np.mean(np.abs(value - truth) <= 1.96 * se)
    assert cover_lo <= cover <= 0.98, cover


_stat = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e-3, max_value=1e-3),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324]),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(_stat, _stat, st.integers(1, 8), st.integers(2, 4), st.integers(1, 7)), max_size=40),
    window=st.integers(1, 30),
    k=st.sampled_from([None, 0, 3]),
)
def test_no_impossible_b_simple_is_ever_logged(rows, window, k) -> None:
    """Whatever the measurements (negative, zero, tiny, huge, inf, nan; any b < B; any gaps), a logged B_simple
    is finite and >= 0 and comes with a finite SE >= 0; a window with no possible ratio is counted instead."""
    names = gns_names(k)
    w, step, count = GNSWindow(window), 0, 0
    for g2_small, g2_big, b, m, gap in rows:
        step += gap
        out = live_metrics(w, step, g2_small, g2_big, b, b * m, k)
        assert set(out) <= set(names.values())
        assert (names["b_simple"] in out) == (names["b_simple_se"] in out)
        if names["b_simple"] in out:
            assert math.isfinite(out[names["b_simple"]]) and out[names["b_simple"]] >= 0.0
            assert math.isfinite(out[names["b_simple_se"]]) and out[names["b_simple_se"]] >= 0.0
        if names["b_simple_undefined"] in out:
            count += 1
            assert out[names["b_simple_undefined"]] == count == w.undefined
        assert out[names["g2_small"]] == g2_small or math.isnan(g2_small)  # raw values logged as measured


def test_live_metrics_names_and_undefined_count() -> None:
    w = GNSWindow(10)
    first = live_metrics(w, 1, 5.0, 3.0, 2, 8)
    assert set(first) == {GNS_G2_SMALL, GNS_G2_BIG, GNS_B_SMALL, GNS_B_BIG, GNS_G2, GNS_TRACE}  # warming
    out = live_metrics(w, 2, 5.5, 3.2, 2, 8)
    g = [g2_unbiased(5.0, 3.0, 2, 8), g2_unbiased(5.5, 3.2, 2, 8)]
    t = [trace_unbiased(5.0, 3.0, 2, 8), trace_unbiased(5.5, 3.2, 2, 8)]
    assert out[GNS_B_SIMPLE] == pytest.approx(np.mean(t) / np.mean(g), rel=1e-12)
    assert out[GNS_B_SIMPLE_SE] == pytest.approx(window_estimate(g, t).se, rel=1e-12)
    w2 = GNSWindow(10)
    live_metrics(w2, 1, 5.0, 6.0, 2, 8, k=2)  # |G_B|^2 > |G_b|^2: negative tr(Sigma)
    out = live_metrics(w2, 2, 5.0, 6.0, 2, 8, k=2)
    assert "gns/bin2/b_simple" not in out and out["gns/bin2/b_simple_undefined"] == 1.0


def test_window_state_dict_round_trip() -> None:
    rng = np.random.default_rng(4)
    g2_small, g2_big = _gaussian_stream(rng, np.full(40, 1.0), 20.0, 4, 2, 8)
    a = GNSWindow(window=7)
    for n in range(20):
        a.update(n + 1, g2_small[n], g2_big[n], 4, 8)
    state = json.loads(json.dumps(a.state_dict()))  # plain python: survives JSON
    c = GNSWindow(window=7)
    c.load_state_dict(state)
    for n in range(20, 40):
        assert c.update(n + 1, g2_small[n], g2_big[n], 4, 8) == a.update(n + 1, g2_small[n], g2_big[n], 4, 8)
    assert c.undefined == a.undefined > 0  # noisy |G|^2 near 0: some windows had no possible value


def test_window_state_dict_keeps_the_undefined_count() -> None:
    """A resumed trial goes on counting undefined windows from where it stopped (the logged
    ``b_simple_undefined`` is the running count); a window state saved before the count existed restores 0."""
    a = GNSWindow(window=3)
    for step, (small, big) in enumerate([(5.0, 6.0), (5.0, 6.0), (5.0, 6.0), (5.0, 1.0)], start=1):
        a.update(step, small, big, 2, 8)  # |G_B|^2 > |G_b|^2: negative tr(Sigma), undefined at steps 2 and 3
    assert a.undefined == 2
    c = GNSWindow(window=3)
    c.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert c.undefined == 2
    for step in (5, 6, 7, 8):  # the window is defined at 5 and 6 (step 4 in it), undefined again at 7 and 8
        assert c.update(step, 5.0, 6.0, 2, 8) == a.update(step, 5.0, 6.0, 2, 8)
    assert c.undefined == a.undefined == 4
    state = a.state_dict()
    del state["undefined"]
    before = GNSWindow(window=3)
    before.undefined = 7
    before.load_state_dict(state)
    assert before.undefined == 0 and before.estimate == a.estimate


def test_window_messages() -> None:
    w = GNSWindow(10)
    for step in (1, 2, 5):
        w.update(step, 5.0, 3.0, 2, 8)
    with pytest.raises(ValueError, match=r"^GNS measurements must come in increasing steps, got 3 after 5$"):
        w.update(3, 5.0, 3.0, 2, 8)
    with pytest.raises(ValueError, match=r"^not a GNSWindow state \(keys \['window'\]\)$"):
        GNSWindow().load_state_dict({"window": 3})
    state = {"window": 10, "steps": [1, 2], "g2": [1.0, 2.0], "trace": [3.0], "undefined": 0}
    with pytest.raises(ValueError, match=r"^GNSWindow state: steps, g2 and trace differ in length$"):
        GNSWindow().load_state_dict(state)


def test_window_state_from_the_ema_era() -> None:
    old = GNSWindow(window=7)  # a checkpoint from the EMA era: nothing to restore, the window starts empty
    old.load_state_dict({"beta": 0.95, "steps": 12, "g2": 0.1, "trace": 3.0})
    assert old.estimate.n == 0


# --- Mutation-gap tests (issue 13): dtypes, user-facing messages, edge states of window_estimate -----------------


def _delta_se_by_hand(g: list[float], t: list[float]) -> tuple[float, float]:
    """Ratio of means and its first-order delta-method SE, written out with python floats (ddof=1)."""
    n = len(g)
    gm, tm = sum(g) / n, sum(t) / n
    s_gg = sum((x - gm) ** 2 for x in g) / (n - 1)
    s_tt = sum((y - tm) ** 2 for y in t) / (n - 1)
    s_tg = sum((x - gm) * (y - tm) for x, y in zip(g, t, strict=True)) / (n - 1)
    r = tm / gm
    return r, math.sqrt(max((s_tt - 2.0 * r * s_tg + r * r * s_gg) / (n * gm * gm), 0.0))


def test_estimators_return_float64_for_longdouble_and_float32_inputs():
    """Known answers (b=2, B=6: |G|^2 = (6 big - 2 small)/4, tr = (small - big)/(1/2 - 1/6)) come back float64,
    python floats for scalars, whatever the input precision (longdouble inputs must not leak out)."""
    small, big = [5.0, 3.0], [2.0, 1.0]
    g2_want = np.array([(6 * 2.0 - 2 * 5.0) / 4, (6 * 1.0 - 2 * 3.0) / 4])
    tr_want = np.array([(5.0 - 2.0) * 3.0, (3.0 - 1.0) * 3.0])
    for dt in (np.longdouble, np.float32):
        s, bg = np.array(small, dtype=dt), np.array(big, dtype=dt)
        for b, B in ((2, 6), (np.array([2, 2], dtype=dt), np.array([6, 6], dtype=dt))):
            g2, tr = g2_unbiased(s, bg, b, B), trace_unbiased(s, bg, b, B)
            assert g2.dtype == np.float64 and tr.dtype == np.float64
            np.testing.assert_allclose(g2, g2_want, rtol=1e-6)
            np.testing.assert_allclose(tr, tr_want, rtol=1e-6)
    assert type(g2_unbiased(5.0, 2.0, 2, 6)) is float and g2_unbiased(5.0, 2.0, 2, 6) == 0.5
    assert type(trace_unbiased(5.0, 2.0, 2, 6)) is float and trace_unbiased(5.0, 2.0, 2, 6) == pytest.approx(9.0)
    assert type(b_simple(9.0, 0.5)) is float and b_simple(9.0, 0.5) == 18.0


def test_scalar_b_with_array_B_broadcasts():
    np.testing.assert_allclose(g2_unbiased([5.0, 5.0], [2.0, 2.0], 2, np.array([6, 10])), [0.5, (20 - 10) / 8])


def test_batch_size_errors_name_the_problem():
    with pytest.raises(ValueError) as e:
        g2_unbiased(1.0, 2.0, 4, math.inf)
    assert str(e.value) == "batch sizes b and B must be finite"
    with pytest.raises(ValueError, match=r"small batch size b must be >= 1"):
        trace_unbiased(1.0, 2.0, 0.5, 8)
    with pytest.raises(ValueError, match=r"need b < B for the two-batch estimators"):
        g2_unbiased(1.0, 2.0, 8, 8)
    with pytest.raises(ValueError, match=r"window must be a positive number of optimizer steps"):
        GNSWindow(0)


def test_b_simple_of_overflowed_values_is_nan_without_warning():
    """inf/inf is nan, quietly (pytest turns RuntimeWarnings into errors)."""
    assert math.isnan(b_simple(math.inf, math.inf))


def test_missing_values_are_non_finite_not_type_errors():
    """A series read back with gaps (None) is treated as non-finite, not a crash on an object array."""
    est = window_estimate([1.0, None, 2.0], [3.0, 4.0, 5.0])
    assert est.state == "undefined" and math.isnan(est.value)
    est = window_estimate([1.0, 2.0, 3.0], [3.0, None, 5.0])
    assert est.state == "undefined" and math.isnan(est.value)
    for g, t in (([1.0, None], [1.0, 2.0]), ([1.0, 2.0], [None, 2.0]), ([1.0, 2.0], [1.0, math.inf])):
        with pytest.raises(ValueError) as e:
            b_simple_with_se(g, t)
        assert str(e.value) == "samples contain non-finite values"
    with pytest.raises(ValueError, match=r"g2_small contains non-finite values"):
        window_b_simple([1, 2], [1.0, None], [0.5, 0.5], 2, 4, window=10)


def test_b_simple_with_se_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"must pair up, got 3 and 2"):
        b_simple_with_se([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"need at least 2 independent repetitions"):
        b_simple_with_se([1.0], [1.0])


def test_window_estimate_zero_mean_trace_is_ok_with_delta_se():
    """Mean tr(Sigma) exactly 0 is a possible value (B_simple = 0, no noise), with its delta-method SE."""
    g, t = [1.0, 3.0, 2.0], [1.0, -1.0, 0.0]
    est = window_estimate(g, t)
    r, se = _delta_se_by_hand(g, t)
    assert est.state == "ok" and est.n == 3
    assert est.value == 0.0 == r
    assert est.se == pytest.approx(se, rel=1e-12) and se > 0


def test_window_estimate_overflow_in_the_covariance_is_undefined_quietly():
    """Finite window means whose covariance overflows: no SE, so "undefined" (nan, nan, n kept), no warning."""
    est = window_estimate([1e300, -0.5e300], [1.0, 1.0])
    assert est.state == "undefined" and not est.ok and est.n == 2
    assert math.isnan(est.value) and math.isnan(est.se)
    for g, t in (([1e308, 1e308], [1.0, 1.0]), ([math.inf, -math.inf], [1.0, 1.0])):  # the means overflow / nan
        est = window_estimate(g, t)
        assert est.state == "undefined" and math.isnan(est.value) and est.n == 2


def test_window_estimate_short_window_matches_hand_delta_method():
    """window_b_simple's last entries use only the measurements inside the window, with the hand-computed SE."""
    small = np.array([9.0, 7.0, 8.0, 6.5, 7.5])
    big = np.array([3.0, 2.0, 2.5, 2.2, 1.9])
    b, B = 2, 8
    g2 = [(B * y - b * x) / (B - b) for x, y in zip(small, big, strict=True)]
    tr = [(x - y) / (1 / b - 1 / B) for x, y in zip(small, big, strict=True)]
    value, se = window_b_simple([10, 20, 30, 40, 50], small, big, b, B, window=25)
    assert math.isnan(value[0]) and math.isnan(se[0])  # one measurement: warming
    for i in range(1, 5):
        lo = max(0, i - 2)  # steps in (s - 25, s]: this one and up to two before
        r, s = _delta_se_by_hand(g2[lo : i + 1], tr[lo : i + 1])
        assert value[i] == pytest.approx(r, rel=1e-12) and se[i] == pytest.approx(s, rel=1e-10)


def test_window_b_simple_accepts_unsigned_steps():
    """Steps stored as unsigned integers give the same result as int steps (no wrap-around of step - window)."""
    small, big = [9.0, 7.0, 8.0, 6.5], [3.0, 2.0, 2.5, 2.2]
    want = window_b_simple([1, 2, 3, 4], small, big, 2, 8, window=100)
    got = window_b_simple(np.array([1, 2, 3, 4], dtype=np.uint32), small, big, 2, 8, window=100)
    assert np.isfinite(want[0][1:]).all()
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError, match=r"strictly increasing"):
        window_b_simple(np.array([2, 1], dtype=np.uint32), [9.0, 7.0], [3.0, 2.0], 2, 8, window=100)


def test_gns_window_drops_a_step_whose_trace_overflowed():
    """|G|^2 finite but tr(Sigma) = inf (b close to B): the measurement is not added to the window."""
    w = GNSWindow(window=50)
    w.update(1, 1e300, 0.0, 1e6, 1e6 + 1)
    assert w.state_dict()["g2"] == [] and w.estimate.n == 0


def test_half_window_forgets_the_transient() -> None:
    """A short trial whose |G|^2 falls ~600x in its first steps (``_transient``): at step 60 a 100-step window still
    holds the transient and reads B_simple several times too low; the half window (steps 31..60) does not."""
    rng = np.random.default_rng(5)
    steps = np.arange(1, 61)
    truth = 20.0
    g2_small, g2_big = _gaussian_stream(rng, _transient(steps.astype(float)), truth, 8, 2, 16)
    plain = window_b_simple(steps, g2_small, g2_big, 8, 16, window=100)[0][-1]
    half, se = (x[-1] for x in window_b_simple(steps, g2_small, g2_big, 8, 16, window=100, half=True))
    assert plain < truth / 2
    assert abs(half - truth) < 4 * se
    np.testing.assert_array_equal(window_span([1, 2, 3, 4, 60, 250], 100, True), [1, 1, 2, 2, 30, 100])
    np.testing.assert_array_equal(window_span([1, 250], 100, False), [100, 100])


def test_stratified_b_simple_one_group_is_the_window_rule_and_groups_weigh_equally() -> None:
    rng = np.random.default_rng(11)
    g, t = 1.0 + 0.3 * rng.standard_normal(9), 8.0 + 2.0 * rng.standard_normal(9)
    one, ref = gns.stratified_b_simple([g], [t]), gns.window_estimate(g, t)
    assert one.state == ref.state == "ok" and one.n == ref.n == 9
    assert (one.value, one.se) == pytest.approx((ref.value, ref.se), rel=1e-12)
    # noise-free: a group of 50 measurements at |G|^2 = 1 and one of 2 at 4, tr = 10: equal weights give 10 / 2.5
    est = gns.stratified_b_simple([np.ones(50), np.full(2, 4.0)], [np.full(50, 10.0), np.full(2, 10.0)])
    assert est.ok and est.value == pytest.approx(4.0, rel=1e-12) and est.se == 0.0
    # a group of one measurement counts like any other: 4 at |G|^2 = 4 (one) and 1 (three), tr = 10
    one_alone = gns.stratified_b_simple([np.full(1, 4.0), np.ones(3)], [np.full(1, 10.0), np.full(3, 10.0)])
    assert one_alone.ok and one_alone.value == pytest.approx(4.0, rel=1e-12)
    warming = gns.stratified_b_simple([np.ones(1), np.ones(1)], [np.ones(1), np.ones(1)])
    assert warming.state == "warming" and math.isnan(warming.value) and math.isnan(warming.se)
    assert gns.stratified_b_simple([np.array([-1.0, 0.5])], [np.ones(2)]).state == "undefined"
    assert gns.stratified_b_simple([np.array([-1.0, 1.0])], [np.zeros(2)]).state == "undefined"  # mean |G|^2 = 0
    und = gns.stratified_b_simple([np.array([-1.0, 0.5, 0.2])], [np.ones(3)])
    assert (und.state, und.n) == ("undefined", 3) and math.isnan(und.value) and math.isnan(und.se)
    for tr, want in ((np.array([1.0, -1.0]), 0.0), (np.array([0.5, 0.5]), 0.5)):  # tr(Sigma) 0 and below 1 are fine
        est = gns.stratified_b_simple([np.ones(2)], [tr])
        assert est.ok and est.value == want
    assert gns.stratified_b_simple([np.zeros(0), g], [np.zeros(0), t]).value == pytest.approx(ref.value, rel=1e-12)
    msg = r"^g2_groups and trace_groups must pair up group by group and sample by sample$"
    for bad_g, bad_t in (([g], [t[:3]]), ([g], [t, t])):
        with pytest.raises(ValueError, match=msg):
            gns.stratified_b_simple(bad_g, bad_t)


def test_stratified_b_simple_against_float64_brute_force_and_coverage() -> None:
    """Unequal groups (sizes 2, 5, 20; |G|^2 0.3, 0.5, 1.0; tr 4): the value and SE against the formula written out
    element by element in float64, then the ±1.645 SE interval's coverage of the known mean(tr) / mean(|G|^2) =
    4 / 0.6 over 400 draws."""
    rng = np.random.default_rng(5)
    sizes, g2s = (2, 5, 20), (0.3, 0.5, 1.0)

    def draw():
        gs = [g2 + 0.15 * rng.standard_normal(n) for n, g2 in zip(sizes, g2s, strict=True)]
        ts = [4.0 + 1.5 * rng.standard_normal(n) for n in sizes]
        return gs, ts

    gs, ts = draw()
    est = gns.stratified_b_simple(gs, ts)
    P, N = len(gs), sum(sizes)
    G = sum(sum(g) / len(g) for g in gs) / P
    T = sum(sum(t) / len(t) for t in ts) / P
    R = T / G
    stt = sgg = stg = 0.0
    for g, t in zip(gs, ts, strict=True):
        mg, mt = sum(g) / len(g), sum(t) / len(t)
        for a, b in zip(g, t, strict=True):
            stt, sgg, stg = stt + (b - mt) ** 2, sgg + (a - mg) ** 2, stg + (a - mg) * (b - mt)
    stt, sgg, stg = stt / (N - P), sgg / (N - P), stg / (N - P)
    var = (stt - 2 * R * stg + R * R * sgg) * sum(1 / n for n in sizes) / P**2 / G**2
    assert est.ok and est.n == N
    assert (est.value, est.se) == pytest.approx((R, math.sqrt(var)), rel=1e-12)
    truth = 4.0 / np.mean(g2s)
    hits = 0
    for _ in range(400):
        e = gns.stratified_b_simple(*draw())
        hits += e.ok and abs(e.value - truth) <= 1.645 * e.se
    assert 0.85 <= hits / 400 <= 0.95


def test_stratified_b_simple_computes_in_float64() -> None:
    """float32 groups (as a GPU logs them) give exactly the float64 result of the same numbers."""
    rng = np.random.default_rng(2)
    gs = [(1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32) for n in (3, 7)]
    ts = [(8.0 + 2.0 * rng.standard_normal(n)).astype(np.float32) for n in (3, 7)]
    want = gns.stratified_b_simple([g.astype(np.float64) for g in gs], [t.astype(np.float64) for t in ts])
    for g_in, t_in in ((gs, [t.astype(np.float64) for t in ts]), ([g.astype(np.float64) for g in gs], ts)):
        got = gns.stratified_b_simple(g_in, t_in)
        assert (got.value, got.se) == (want.value, want.se)


def test_stratified_b_simple_overflow_is_undefined_without_warnings() -> None:
    """Overflowing sums (a diverging trial's statistics) give "undefined", silently, as window_estimate does."""
    import warnings

    big = np.full(3, 1e308)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gns.stratified_b_simple([big, big], [big, big]).state == "undefined"
        assert gns.stratified_b_simple([np.array([1.0, np.nan])], [np.ones(2)]).state == "undefined"
        # inf and -inf in one group: its mean is nan ("invalid" in numpy), not a warning
        assert gns.stratified_b_simple([np.array([np.inf, -np.inf, 1.0])], [np.ones(3)]).state == "undefined"
