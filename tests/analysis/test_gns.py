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

from analysis.gns import (
    GNSEma,
    b_simple,
    b_simple_with_se,
    ema_b_simple,
    from_subbatch_grads,
    g2_unbiased,
    mean_with_se,
    trace_unbiased,
    windowed_b_simple,
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
    n, noise_var = 300, np.array([0.25, 1.0, 2.5])  # per-bin noise; |mean| = 1 in every bin
    bin_of = np.repeat(np.arange(3), n // 3)  # (n,): bin label of each example
    means = rng.normal(size=(3, P))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    grads = means[bin_of] + np.sqrt(noise_var[bin_of])[:, None] * rng.standard_t(5, size=(n, P))  # (n, P)

    b_simples = [_truth(grads[bin_of == k])[1] / _truth(grads[bin_of == k])[0] for k in range(3)]
    assert max(b_simples) > 5 * min(b_simples)  # the bins really differ
    for k, b in enumerate([16, 16, 32]):  # the noisiest bin measured with a bigger b, as one would
        _assert_unbiased(grads[bin_of == k], rng, b=b)


# --------------------------------------------------------------------------------------------------------
# the seed repo's defects are biased where ours is not (REFERENCE.md mistakes 1 and 2)
# --------------------------------------------------------------------------------------------------------


def test_seed_unsquared_norm_is_biased(population: np.ndarray) -> None:
    """Mistake 1: |G_b| instead of |G_b|^2 in the |G|^2 estimator, on the very same draws as ours."""
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
    """Mistake 2: b=100 as sub-batches 32,32,32,4 averaged with equal weights (effective b ~ 46.5)."""
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
# smoothing: EMA and windowed means
# --------------------------------------------------------------------------------------------------------


def _series(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.choice([4, 8, 16], size=n)
    B = b * rng.choice([2, 4], size=n)
    g2, tr = 1.0 + 0.3 * rng.normal(size=n), 20.0 + 5 * rng.normal(size=n)
    g2_small = g2 + tr / b + 0.5 * rng.normal(size=n)
    g2_big = g2 + tr / B + 0.2 * rng.normal(size=n)
    return g2_small, g2_big, b, B


def test_ema_first_update_is_first_ratio() -> None:
    ema = GNSEma(beta=0.99)
    assert math.isnan(ema.b_simple) and math.isnan(ema.g2) and math.isnan(ema.trace)
    out = ema.update(5.0, 3.0, 2, 8)
    assert out == trace_unbiased(5.0, 3.0, 2, 8) / g2_unbiased(5.0, 3.0, 2, 8)
    assert ema.g2 == g2_unbiased(5.0, 3.0, 2, 8)
    assert ema.trace == trace_unbiased(5.0, 3.0, 2, 8)


def test_ema_matches_zero_started_bias_corrected_ema() -> None:
    """Numerator and denominator smoothed separately, each an Adam-style bias-corrected EMA."""
    beta = 0.9
    g2_small, g2_big, b, B = _series(30)
    ema, raw_g2, raw_tr = GNSEma(beta), 0.0, 0.0
    for n in range(30):
        out = ema.update(g2_small[n], g2_big[n], b[n], B[n])
        raw_g2 = beta * raw_g2 + (1 - beta) * g2_unbiased(g2_small[n], g2_big[n], b[n], B[n])
        raw_tr = beta * raw_tr + (1 - beta) * trace_unbiased(g2_small[n], g2_big[n], b[n], B[n])
        c = 1 - beta ** (n + 1)
        assert ema.g2 == pytest.approx(raw_g2 / c, rel=1e-12)
        assert ema.trace == pytest.approx(raw_tr / c, rel=1e-12)
        assert out == pytest.approx((raw_tr / c) / (raw_g2 / c), rel=1e-12)


def test_ema_state_dict_round_trip() -> None:
    g2_small, g2_big, b, B = _series(40, seed=1)
    a = GNSEma(beta=0.95)
    for n in range(20):
        a.update(g2_small[n], g2_big[n], b[n], B[n])
    state = json.loads(json.dumps(a.state_dict()))  # plain python: survives JSON
    assert all(isinstance(v, int | float) for v in a.state_dict().values())
    c = GNSEma()
    c.load_state_dict(state)
    assert c.beta == 0.95
    for n in range(20, 40):
        assert c.update(g2_small[n], g2_big[n], b[n], B[n]) == a.update(g2_small[n], g2_big[n], b[n], B[n])
    with pytest.raises(ValueError):
        GNSEma().load_state_dict({"beta": 0.9})


def test_ema_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        GNSEma(beta=1.0)
    ema = GNSEma()
    with pytest.raises(ValueError):
        ema.update(float("inf"), 1.0, 2, 4)
    with pytest.raises(ValueError):
        ema.update(1.0, 1.0, 4, 4)
    assert ema.steps == 0


@pytest.mark.parametrize("beta", [0.0, 0.9, 0.99])
def test_ema_series_equals_step_by_step(beta: float) -> None:
    g2_small, g2_big, b, B = _series(500, seed=2)
    ema = GNSEma(beta)
    stepwise = [ema.update(g2_small[n], g2_big[n], b[n], B[n]) for n in range(500)]
    np.testing.assert_allclose(ema_b_simple(g2_small, g2_big, b, B, beta=beta), stepwise, rtol=1e-10)


def test_windowed_b_simple_brute_force() -> None:
    g2_small, g2_big, b, B = _series(50, seed=3)
    window = 7
    out = windowed_b_simple(g2_small, g2_big, b, B, window)
    g2 = g2_unbiased(g2_small, g2_big, b, B)
    tr = trace_unbiased(g2_small, g2_big, b, B)
    for i in range(50):
        lo = max(0, i - window + 1)
        assert out[i] == pytest.approx(np.mean(tr[lo : i + 1]) / np.mean(g2[lo : i + 1]), rel=1e-10)
    # scalar b, B broadcast over the series; window 1 is the per-step ratio
    np.testing.assert_allclose(
        windowed_b_simple(g2_small, g2_big, 4, 64, 1),
        trace_unbiased(g2_small, g2_big, 4, 64) / g2_unbiased(g2_small, g2_big, 4, 64),
        rtol=1e-12,
    )
    with pytest.raises(ValueError):
        windowed_b_simple(g2_small, g2_big, b, B, 0)
