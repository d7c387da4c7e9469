"""Float64 reference tests of the timestep allocation maths (analysis.core.allocation, docs/allocation.md).

Ground truth: a finite population of per-example gradients per timestep bin (bins of unequal width, so ``q_k``
is not ``1/K``), whose weighted per-example gradient distribution under an allocation ``p`` is enumerated atom by
atom (probability ``p_k / N_k``, vector ``(q_k/p_k) g_kj``): its mean, second moment and covariance trace are
exact and computed without the closed forms under test. A Monte Carlo of the trial's two-stage draw (bin by
inverse CDF of a uniform, then an example within the bin) checks the same numbers by sampling.
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis.core.allocation import bin_shares, loss_allocation, mix_floor, noise_allocation, predict
from tests.oracles.allocation import sample_bins, second_moment


def population(seed: int = 0, widths=(3, 3, 4), dim: int = 5, n: int = 40):
    """Per-bin populations ``g[k]`` (n, dim) with different means and spreads, bin shares from ``widths``."""
    rng = np.random.default_rng(seed)
    q = np.asarray(widths, np.float64) / sum(widths)
    g = [rng.normal(0.3 * (k + 1), 0.5 + 2.0 * k, size=(n, dim)) for k in range(len(widths))]
    return q, g


def exact_weighted(g, q, p):
    """Mean, second moment and covariance trace of the weighted per-example gradient, by enumeration."""
    probs = np.concatenate([np.full(len(gk), pk / len(gk)) for gk, pk in zip(g, p, strict=True)])
    vecs = np.concatenate([(qk / pk) * gk for gk, qk, pk in zip(g, q, p, strict=True)])
    mean = probs @ vecs
    second = probs @ np.einsum("nd,nd->n", vecs, vecs)
    cov = (vecs - mean).T @ ((vecs - mean) * probs[:, None])
    return mean, second, float(np.trace(cov))


def bin_m(g):
    """``m_k = tr Sigma_k + |G_k|^2`` of each bin's population (population covariance, ddof 0)."""
    return np.array([np.trace(np.cov(gk.T, ddof=0)) + gk.mean(0) @ gk.mean(0) for gk in g])


def test_bin_shares_are_widths_over_T():
    assert np.allclose(bin_shares(3, 10), [0.3, 0.3, 0.4])
    assert np.allclose(bin_shares(10), 0.1)


@pytest.mark.parametrize("which", ["uniform", "neyman", "skewed"])
def test_weighted_gradient_is_unbiased_and_second_moment_exact(which):
    q, g = population()
    m = bin_m(g)
    p = {"uniform": q, "neyman": noise_allocation(m, q, 0.05), "skewed": np.array([0.6, 0.3, 0.1])}[which]
    mean, second, trace = exact_weighted(g, q, p)
    G = sum(qk * gk.mean(0) for qk, gk in zip(q, g, strict=True))  # gradient of the uniform objective
    np.testing.assert_allclose(mean, G, rtol=1e-12, atol=1e-12)
    assert second_moment(m, p, q) == pytest.approx(second, rel=1e-12)
    assert second_moment(m, p, q) - G @ G == pytest.approx(trace, rel=1e-10)


def test_neyman_allocation_minimises_the_second_moment():
    q, g = population(seed=1)
    m = bin_m(g)
    best = noise_allocation(m, q, floor=1e-12)
    assert second_moment(m, best, q) == pytest.approx(np.sum(q * np.sqrt(m)) ** 2, rel=1e-9)  # Cauchy-Schwarz
    rng = np.random.default_rng(2)
    others = rng.dirichlet(np.ones(3), size=2000)
    assert min(second_moment(m, p, q) for p in others) > second_moment(m, best, q)
    assert second_moment(m, best, q) < second_moment(m, q, q)  # strictly better than uniform here


def test_floor_keeps_every_bin_and_bad_scores_fall_back_to_uniform():
    q = bin_shares(4, 1000)
    p = noise_allocation([1e6, 0.0, -3.0, np.nan], q, floor=0.2)
    assert np.all(p >= 0.2 * q - 1e-15) and p.sum() == pytest.approx(1.0)
    assert np.allclose(noise_allocation([0, 0, 0, 0], q, 0.1), q)
    np.testing.assert_allclose(loss_allocation([4.0, 1.0, 1.0, 1.0], q, 1e-9), [0.4, 0.2, 0.2, 0.2], rtol=1e-8)
    np.testing.assert_allclose(mix_floor([1, 0, 0, 0], q, 0.5), [0.625, 0.125, 0.125, 0.125])


def test_two_stage_draw_is_uniform_in_t_under_q():
    """Bin from p = q, then t uniform within the bin: every timestep has probability exactly 1/T."""
    q = bin_shares(3, 10)
    u = (np.arange(100000) + 0.5) / 100000  # a fine deterministic grid of uniforms
    k = sample_bins(u, q)
    assert np.allclose(np.bincount(k, minlength=3) / u.size, q, atol=1e-4)


def test_monte_carlo_of_the_two_stage_draw_matches_the_prediction():
    q, g = population(seed=3)
    m = bin_m(g)
    p = noise_allocation(m, q, 0.1)
    rng = np.random.default_rng(4)
    n = 200_000
    k = sample_bins(rng.random(n), p)
    j = rng.integers(0, len(g[0]), n)
    w = (q / p)[k]  # importance weight of each draw
    allv = np.concatenate(g)[k * len(g[0]) + j] * w[:, None]  # (n, dim) weighted per-example gradients
    sq = np.einsum("nd,nd->n", allv, allv)
    assert abs(sq.mean() - second_moment(m, p, q)) < 4 * sq.std() / np.sqrt(n)
    G = sum(qk * gk.mean(0) for qk, gk in zip(q, g, strict=True))
    assert np.all(np.abs(allv.mean(0) - G) < 4 * allv.std(0) / np.sqrt(n))


def test_predict_point_values_match_exact_population():
    q, g = population(seed=5)
    m = bin_m(g)
    G = sum(qk * gk.mean(0) for qk, gk in zip(q, g, strict=True))
    p = noise_allocation(m, q, 0.1)
    # measurements whose means are exactly m_k and |G|^2: symmetric +-1 perturbations
    ms = [np.array([mk - 1.0, mk + 1.0]) for mk in m]
    g2 = np.array([G @ G - 0.01, G @ G + 0.01])
    pred = {a.name: a for a in predict(ms, g2, {"uniform": q, "noise": p}, q, batch_sizes=[1, 8, 64])}
    for name, pp in (("uniform", q), ("noise", p)):
        _, second, trace = exact_weighted(g, q, pp)
        assert pred[name].second_moment == pytest.approx(second, rel=1e-12)
        assert pred[name].trace == pytest.approx(trace, rel=1e-10)
        assert pred[name].b_simple == pytest.approx(trace / (G @ G), rel=1e-10)
    bu, bn = pred["uniform"].b_simple, pred["noise"].b_simple
    np.testing.assert_allclose(pred["noise"].ratio, (np.array([1, 8, 64]) + bn) / (np.array([1, 8, 64]) + bu))
    np.testing.assert_allclose(pred["uniform"].ratio, 1.0)
    assert np.all(pred["uniform"].ratio_se < 1e-12)  # the uniform's ratio to itself is exact


def test_predict_standard_errors_match_repeated_windows():
    """Delta-method SEs against the spread of predictions over 3000 independent synthetic windows."""
    rng = np.random.default_rng(6)
    q = bin_shares(4, 1000)
    m_true, sd = np.array([40.0, 10.0, 4.0, 1.0]), np.array([8.0, 3.0, 1.5, 0.5])
    g_true, g_sd, n = 2.0, 0.6, 12
    p = noise_allocation(m_true, q, 0.1)
    preds, ses = [], []
    for _ in range(3000):
        ms = [rng.normal(mu, s, n) for mu, s in zip(m_true, sd, strict=True)]
        g2 = rng.normal(g_true, g_sd, 3 * n)
        a = predict(ms, g2, {"noise": p}, q, batch_sizes=[4.0])[0]
        preds.append([a.trace, a.b_simple, a.ratio[0]])
        ses.append([a.trace_se, a.b_simple_se, a.ratio_se[0]])
    spread, mean_se = np.std(preds, axis=0, ddof=1), np.mean(ses, axis=0)
    np.testing.assert_allclose(mean_se, spread, rtol=0.1)


def test_predict_rejects_what_it_cannot_use():
    q = bin_shares(2, 10)
    with pytest.raises(ValueError, match="bin 1"):
        predict([[1.0, 2.0], [3.0]], [1.0, 1.1], {"u": q}, q)
    with pytest.raises(ValueError, match="<= 0"):
        predict([[1.0, 2.0], [3.0, 4.0]], [-1.0, 0.5], {"u": q}, q)
