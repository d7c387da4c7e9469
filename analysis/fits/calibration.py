"""Calibration of the B_crit interval's level from the sweep itself: a parametric double bootstrap (issue 30).

The percentile interval of :func:`analysis.fits.sweep_fit.analyze_metric` takes each batch size's per-point
variance ``v_i`` (what the seed bootstrap shows) and the lack-of-fit ``tau²``
(:func:`analysis.fits.pareto.lack_of_fit_var`) as if they were known. They are estimated: ``v_i`` from a handful of
seeds, ``tau²`` from ``n - 2`` residual degrees of freedom (5 with 7 batch sizes), so the nominal 90% interval holds
the truth less often (0.84 on an independent simulator), as a z-interval with an estimated variance does where a
t-interval is due. This module measures that shortfall on the fitted model and returns the level that restores it
(Hall 1986; Beran 1987 "prepivoting"; Davison & Hinkley 1997, section 5.6):

1. **Outer draws** (``outer``): sweeps' points from the fitted model: ``y*_i = log(S_min + E_min/B_i) + N(0, v_i +
   tau²)``, each with its own estimate of the per-point variance ``v*_i = v_i·chi²_d_i/d_i`` (``d_i`` = seeds at
   point i's best setting - 1: the bootstrap's variance of a mean of ``d_i + 1`` seeds is itself an
   estimate on ``d_i`` degrees of freedom).
2. On each, the interval procedure as ``analyze_metric`` runs it: refit, ``tau²*`` by the same method of moments,
   **inner replicates** (``inner``) ``y*_i + N(0, v*_i + tau²*)``, refitted.
3. Where the fitted model's ``B_crit`` (the truth of this parametric world) falls among each outer draw's inner
   replicates: ``u = |2F - 1|`` with ``F`` its empirical CDF there. The nominal interval at level ``a`` holds the
   truth iff ``u <= a``; the calibrated level is the ``level``-quantile of ``u`` (clipped to ``[MIN_LEVEL,
   MAX_LEVEL]``): the level at which the interval held the truth ``level`` of the time.

Approximations (documented in docs/intervals.md): the points' errors are Gaussian in log steps and independent
between batch sizes; the selection of the best learning rate and censoring are not re-simulated (the real bootstrap
does them; this step only measures how much the estimated variances understate the real ones); the calibrated
level is then applied to the real bootstrap's replicates.
"""

from __future__ import annotations

import numpy as np

from analysis.fits.pareto import fit_pareto_batched

OUTER = 600  # simulated sweeps per target: at 200 the level's sd was 0.033 and the tiny grid's width moved by 13%
# from one seed to the next, at 600 0.018 and 4% (benchmarks/RESULTS.md, "replayed")
INNER = 100  # bootstrap replicates per simulated sweep
MIN_LEVEL = 0.5
MAX_LEVEL = 0.99  # beyond this the percentile of 1000 replicates rests on fewer than 5 of them
ITERS = 8  # Levenberg-Marquardt steps per fit: from the fitted point a few suffice (B_crit within 1e-6 / 1e-5 of 60
# steps' at 5% / 20% noise per point, tests/analysis/test_calibration.py); 600 x 8 costs about 200 x 20 did


def _leverages_batched(b: np.ndarray, s_min: np.ndarray, e_min: np.ndarray) -> np.ndarray:
    """(M, n) diagonals of the hat matrices of M fits (as :func:`analysis.fits.pareto.leverages`, batched)."""
    q = s_min[:, None] / (s_min[:, None] + e_min[:, None] / b[None, :])
    a00, a01, a11 = (q * q).sum(1), (q * (1 - q)).sum(1), ((1 - q) ** 2).sum(1)
    det = a00 * a11 - a01**2
    with np.errstate(divide="ignore", invalid="ignore"):
        i00, i01, i11 = a11 / det, -a01 / det, a00 / det
        h = q * q * i00[:, None] + 2 * q * (1 - q) * i01[:, None] + (1 - q) ** 2 * i11[:, None]
    return h


def coverage_stats(
    batch_sizes: np.ndarray,
    s_min: float,
    e_min: float,
    v: np.ndarray,
    tau2: float,
    dof: float | np.ndarray,
    rng: np.random.Generator,
    outer: int = OUTER,
    inner: int = INNER,
) -> np.ndarray:
    """``u = |2F - 1|`` for each of ``outer`` parametric sweeps (``nan`` where a fit failed): the nominal interval at
    level ``a`` holds the model's B_crit on a sweep iff ``u <= a``. ``v``: (n,) per-point variances of log steps,
    ``tau2``: the lack of fit, ``dof``: degrees of freedom of each ``v_i``, one for all or (n,) per point (``inf``:
    known exactly)."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    n = len(b)
    f = np.log(s_min + e_min / b)
    p0 = np.log([s_min, e_min])
    y = f[None, :] + rng.standard_normal((outer, n)) * np.sqrt(v + tau2)[None, :]
    dof = np.broadcast_to(np.asarray(dof, dtype=np.float64), (n,))
    v_star = v[None, :] * (rng.chisquare(dof, (outer, n)) / dof if np.isfinite(dof).all() else 1.0)
    s_o, e_o = fit_pareto_batched(b, np.exp(y), p0, iters=ITERS)
    r = y - np.log(s_o[:, None] + e_o[:, None] / b[None, :])
    h = _leverages_batched(b, s_o, e_o)
    tau2_star = np.maximum(0.0, ((r**2).sum(1) - ((1 - h) * v_star).sum(1)) / (n - 2))
    sd = np.sqrt(v_star + tau2_star[:, None])  # (M, n)
    reps = y[:, None, :] + rng.standard_normal((outer, inner, n)) * sd[:, None, :]
    s_i, e_i = fit_pareto_batched(b, np.exp(reps.reshape(outer * inner, n)), p0, iters=ITERS)
    bc = (e_i / s_i).reshape(outer, inner)
    ok = np.isfinite(bc)
    truth = e_min / s_min
    below = ((bc < truth) & ok).sum(1) + 0.5 * ((bc == truth) & ok).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = np.abs(2 * below / ok.sum(1) - 1)
    u[ok.sum(1) < inner / 2] = np.nan
    return u


def level_for(u: np.ndarray, level: float) -> float:
    """The level at which the intervals summarised by ``u`` (:func:`coverage_stats`) held the truth ``level`` of the
    time, clipped to ``[MIN_LEVEL, MAX_LEVEL]``; ``level`` itself when no draw is usable."""
    u = u[np.isfinite(u)]
    if len(u) == 0:
        return float(level)
    return float(np.clip(np.quantile(u, level, method="higher"), MIN_LEVEL, MAX_LEVEL))


def calibrated_level(
    batch_sizes: np.ndarray,
    s_min: float,
    e_min: float,
    v: np.ndarray,
    tau2: float,
    dof: float | np.ndarray,
    level: float,
    rng: np.random.Generator,
    outer: int = OUTER,
    inner: int = INNER,
) -> float:
    """The level whose percentile interval holds the fitted B_crit ``level`` of the time on sweeps simulated from
    the fit (:func:`coverage_stats`, :func:`level_for`)."""
    u = coverage_stats(batch_sizes, s_min, e_min, v, tau2, dof, rng, outer, inner)
    return level_for(u, level)
