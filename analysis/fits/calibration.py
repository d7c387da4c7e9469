"""Calibration of the B_crit interval's level from the sweep itself: a parametric double bootstrap.

The percentile interval of :func:`analysis.fits.sweep_fit.analyze_metric` treats each batch size's per-point
variance ``v_i`` and the lack of fit ``tau²`` (:func:`analysis.fits.pareto.lack_of_fit_var`) as known; they are
estimated from a handful of seeds and ``n - 2`` residual degrees of freedom, so the nominal interval holds the truth
less often than its level says. :func:`calibrated_level` simulates sweeps from the fitted model (`OUTER` draws,
each with its own variance estimates), runs the interval procedure on each (`INNER` replicates), and returns the
level at which those intervals held the model's own ``B_crit`` ``level`` of the time, clipped to ``[MIN_LEVEL,
MAX_LEVEL]``; the real bootstrap's replicates are then read at that level. The procedure and its approximations
(Gaussian, independent errors in log steps; lr selection and censoring not re-simulated): docs/design.md and
docs/intervals.md."""

from __future__ import annotations

import numpy as np

from analysis.fits.pareto import fit_pareto_batched

OUTER = 600  # simulated sweeps per target: enough that the calibrated level and the interval's width vary little
# from one seed to the next (fewer left them visibly seed-dependent; benchmarks/RESULTS.md)
INNER = 100  # bootstrap replicates per simulated sweep
MIN_LEVEL = 0.5
MAX_LEVEL = 0.99  # beyond this the percentile of 1000 replicates rests on fewer than 5 of them
ITERS = 8  # Levenberg-Marquardt steps per fit: from the fitted point a few suffice (B_crit within 1e-6 / 1e-5 of 60
# steps' at 5% / 20% noise per point, tests/analysis/test_calibration.py), which pays for the larger OUTER


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
) -> float:
    """The level whose percentile interval holds the fitted B_crit ``level`` of the time on sweeps simulated from
    the fit (:func:`coverage_stats`, :func:`level_for`)."""
    u = coverage_stats(batch_sizes, s_min, e_min, v, tau2, dof, rng, OUTER, INNER)
    return level_for(u, level)
