"""Pareto fit of steps vs examples and the critical batch size (McCandlish et al. 2018, arXiv 1812.06162).

The empirical trade-off ``(S/S_min - 1)(E/E_min - 1) = 1`` with ``E = B·S`` is ``S(B) = S_min + E_min/B``;
the critical batch size is ``B_crit = E_min / S_min``. Steps-to-target scatter is multiplicative, so the fit
minimises ``Σ (log S_i - log(S_min + E_min/B_i))²`` over ``(log S_min, log E_min)``: both stay positive.
The confidence interval is a percentile bootstrap over trials: resample trials with replacement within each
batch size, re-take the best per batch size, refit (Shallue et al. 2018 tune ~100 trials per batch size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_BATCH_SIZES = 3


class TooFewBatchSizesError(ValueError):
    """Fewer than three batch sizes reach a target; the message names the missing ones."""


@dataclass(frozen=True)
class ParetoFit:
    s_min: float  # steps at infinite batch size
    e_min: float  # examples at batch size -> 0
    rms_log: float  # root-mean-square residual of log S

    @property
    def b_crit(self) -> float:
        return self.e_min / self.s_min


def _init(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Starting point from relative linear least squares of S on 1/B, clipped positive. x = 1/B, y = S."""
    a = np.stack([1.0 / y, x / y], axis=1)  # minimise Σ((S_min + E_min x - S)/S)²
    coef = np.linalg.lstsq(a, np.ones_like(y), rcond=None)[0]
    floor = np.array([y.min(), y.min() / x.max()]) * 1e-3
    return np.log(np.maximum(coef, floor))


def fit_pareto(batch_sizes: np.ndarray, steps: np.ndarray) -> ParetoFit:
    """Fit ``S = S_min + E_min/B`` in log space (scipy ``least_squares``, log-parametrised) to finite
    points."""
    from scipy.optimize import least_squares

    b = np.asarray(batch_sizes, dtype=np.float64)
    s = np.asarray(steps, dtype=np.float64)
    keep = np.isfinite(s) & (s > 0)
    b, s = b[keep], s[keep]
    if len(b) < MIN_BATCH_SIZES:
        raise TooFewBatchSizesError(f"need >= {MIN_BATCH_SIZES} batch sizes with finite steps, got {len(b)}")
    x, y = 1.0 / b, np.log(s)

    def resid(p: np.ndarray) -> np.ndarray:
        return np.logaddexp(p[0], p[1] + np.log(x)) - y

    def jac(p: np.ndarray) -> np.ndarray:
        q = 1.0 / (1.0 + np.exp(p[1] + np.log(x) - p[0]))  # share of S_min in the model
        return np.stack([q, 1.0 - q], axis=1)

    res = least_squares(resid, _init(x, s), jac=jac, method="lm", xtol=1e-12, ftol=1e-12)
    return ParetoFit(float(np.exp(res.x[0])), float(np.exp(res.x[1])), float(np.sqrt(np.mean(res.fun**2))))


def fit_pareto_batched(
    batch_sizes: np.ndarray, steps: np.ndarray, p0: np.ndarray, iters: int = 60
) -> tuple[np.ndarray, np.ndarray]:
    """The same fit for many replicates at once (Levenberg-Marquardt in numpy), for the bootstrap.

    ``steps``: (R, n_b); non-finite entries are ignored. ``p0``: (2,) starting ``(log S_min, log E_min)``.
    Returns ``(s_min, e_min)`` of shape (R,), ``nan`` for replicates with fewer than three finite points.
    """
    lx = np.log(1.0 / np.asarray(batch_sizes, dtype=np.float64))[None, :]  # (1, n_b)
    w = np.isfinite(steps) & (steps > 0)  # (R, n_b)
    y = np.log(np.where(w, steps, 1.0))
    r_count = steps.shape[0]
    p = np.tile(np.asarray(p0, dtype=np.float64), (r_count, 1))  # (R, 2)
    lam = np.full(r_count, 1e-3)

    def cost_and_parts(p: np.ndarray):
        f = np.logaddexp(p[:, :1], p[:, 1:] + lx)
        r = np.where(w, f - y, 0.0)
        q = np.where(w, np.exp(p[:, :1] - f), 0.0)  # d f / d log S_min
        return (r**2).sum(1), r, q, np.where(w, 1.0 - q, 0.0)

    cost, r, q0, q1 = cost_and_parts(p)
    for _ in range(iters):
        a00, a01, a11 = (q0 * q0).sum(1), (q0 * q1).sum(1), (q1 * q1).sum(1)
        g0, g1 = (q0 * r).sum(1), (q1 * r).sum(1)
        d00, d11 = a00 * (1 + lam) + 1e-12, a11 * (1 + lam) + 1e-12
        det = d00 * d11 - a01**2
        step = -np.stack([(d11 * g0 - a01 * g1) / det, (d00 * g1 - a01 * g0) / det], axis=1)
        trial = np.clip(p + step, -60.0, 60.0)
        new_cost, nr, nq0, nq1 = cost_and_parts(trial)
        better = new_cost < cost
        p = np.where(better[:, None], trial, p)
        cost = np.where(better, new_cost, cost)
        r = np.where(better[:, None], nr, r)
        q0 = np.where(better[:, None], nq0, q0)
        q1 = np.where(better[:, None], nq1, q1)
        lam = np.where(better, lam * 0.3, lam * 10.0)
    s_min, e_min = np.exp(p[:, 0]), np.exp(p[:, 1])
    few = w.sum(1) < MIN_BATCH_SIZES
    s_min[few] = np.nan
    e_min[few] = np.nan
    return s_min, e_min


def bootstrap_best(
    steps: np.ndarray, batch_size: np.ndarray, ok: np.ndarray, n_boot: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Resample usable trials within each batch size; return (batch sizes, best steps of shape (T, R, n_b)).

    ``steps``: (T, n_trials) for T targets; the same resampled trials serve every target (a paired bootstrap).
    """
    bs = np.unique(batch_size[ok])
    out = np.empty((steps.shape[0], n_boot, len(bs)))
    for i, b in enumerate(bs):
        rows = np.flatnonzero(ok & (batch_size == b))
        pick = rows[rng.integers(0, len(rows), size=(n_boot, len(rows)))]  # (R, n_rows)
        for t in range(steps.shape[0]):
            out[t, :, i] = steps[t][pick].min(axis=1)
    return bs, out


def percentile_ci(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of the finite samples (``nan`` when there are none)."""
    s = samples[np.isfinite(samples)]
    if len(s) == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def check_enough(target: float, metric: str, batch_sizes: np.ndarray, best: np.ndarray) -> None:
    """Raise :class:`TooFewBatchSizesError` naming the batch sizes that miss ``target``."""
    reached = np.isfinite(best)
    if reached.sum() < MIN_BATCH_SIZES:
        raise TooFewBatchSizesError(
            f"target {target:g} on {metric}: only batch sizes {batch_sizes[reached].tolist()} reach it, "
            f"{batch_sizes[~reached].tolist()} do not (need >= {MIN_BATCH_SIZES}); pick a higher target"
        )


def auto_targets(batch_size: np.ndarray, ok: np.ndarray, first: np.ndarray, lowest: np.ndarray, n: int = 8):
    """Spread ``n`` targets over the reachable range of a metric.

    The low end is the loss every batch size reaches (the largest per-batch-size best loss; if that is
    not below the start, the third smallest, so that >= 3 batch sizes reach every target); the high end is the
    median first evaluation. Targets are spaced geometrically over the lower half of that range (in log
    loss, or linearly for non-positive losses), rounded to 4 significant digits, descending.
    """
    bs = np.unique(batch_size[ok])
    best_b = np.array([np.nanmin(lowest[ok & (batch_size == b)], initial=np.inf) for b in bs])
    best_b = np.sort(best_b[np.isfinite(best_b)])
    starts = first[ok & np.isfinite(first)]
    if len(best_b) < MIN_BATCH_SIZES or len(starts) == 0:
        raise TooFewBatchSizesError(
            f"fewer than {MIN_BATCH_SIZES} batch sizes have usable evaluations (have {bs.tolist()})"
        )
    hi = float(np.median(starts))
    lo = float(best_b[-1]) if best_b[-1] < hi else float(best_b[MIN_BATCH_SIZES - 1])
    if not lo < hi:
        raise TooFewBatchSizesError(f"no target below the starting loss {hi:g} is reached by >= 3 batch sizes")
    lo = lo + 1e-3 * (hi - lo)  # strictly inside, so the best trials cross it between evaluations
    q = np.linspace(0.0, 0.5, n)
    if lo > 0:
        t = np.exp(np.log(lo) + q * (np.log(hi) - np.log(lo)))
    else:
        t = lo + q * (hi - lo)
    return np.unique([float(f"{x:.4g}") for x in t])[::-1]
