"""Pareto fit of steps vs examples and the critical batch size (McCandlish et al. 2018, arXiv 1812.06162).

The trade-off ``(S/S_min - 1)(E/E_min - 1) = 1`` with ``E = B·S`` is ``S(B) = S_min + E_min/B``; ``B_crit = E_min /
S_min``. Steps-to-target scatter is multiplicative, so the fit minimises ``Σ (log S_i - log(S_min + E_min/B_i))²``
over ``(log S_min, log E_min)``: both stay positive. The interval is a percentile bootstrap of what varies between
repeats of the sweep: with several seeds per setting, seeds are resampled within each setting, re-averaged, the best
setting per batch size re-taken (censoring-aware) and the fit redone; with one seed per setting, the settings within
each batch size are resampled, an interval without seed-to-seed noise (``ci_resamples`` says which). Every
replicate's points also get the between-point scatter that seeds do not show -- how far each batch size's best grid
learning rate sits from its optimum -- estimated by :func:`lack_of_fit_var` and added by :func:`with_lack_of_fit`
(why: docs/design.md; coverage: docs/intervals.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.core.bcrit_error import BcritError
from analysis.fits.flags import CI_SEEDS, CI_TRIALS
from analysis.fits.steps import Settings, aggregate_seeds

MIN_BATCH_SIZES = 3


class TooFewBatchSizesError(BcritError):
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
        q = np.exp(p[0] - np.logaddexp(p[0], p[1] + np.log(x)))  # share of S_min in the model (no overflow)
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


def ci_resamples(st: Settings, points: np.ndarray | None = None) -> str:
    """What the interval resamples: seeds when the typical fitted point's setting has several seeds, else trials.

    ``points``: the settings the fit stands on (each batch size's best, at any target; -1 entries ignored); None:
    every setting. Judged on the points, not on every setting tried: an adaptive sweep runs many one-seed
    neighbours of 3-seed best settings, and a median over all settings then turned the bootstrap of the points'
    seeds into one of learning rates, and flipped between the two as the sweep grew."""
    n = st.n_seeds
    if points is not None:
        idx = np.asarray(points, dtype=np.int64)
        n = n[idx[idx >= 0]]
    return CI_SEEDS if len(n) and np.median(n) >= 2 else CI_TRIALS


def _best_of(val: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Censoring-aware minimum over the last axis: the least known value, ``nan`` where an unknown setting's
    lower bound lies below it (censored), ``inf`` where nothing is known."""
    m = val.min(axis=-1)
    open_lb = np.where(np.isfinite(val), np.inf, low).min(axis=-1)
    return np.where(np.isfinite(m) & (open_lb < m), np.nan, m)


def bootstrap_best(
    steps: np.ndarray,
    last: np.ndarray,
    st: Settings,
    n_boot: int,
    rng: np.random.Generator,
    resample: str = CI_SEEDS,
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap replicates of the best steps per batch size: ``(batch sizes, (T, R, n_b))``.

    ``steps``: (T, n_trials) for T targets; ``last``: each trial's last evaluated step. ``resample="seeds"``:
    every setting's seeds redrawn (:func:`bootstrap_settings`), then the best setting re-taken per batch size
    (:func:`best_of_settings`). ``"trials"``: draw settings with replacement within each batch size. The same draws
    serve every target (a paired bootstrap). A replicate's batch size is ``nan`` where it is censored (an unknown
    setting's lower bound lies below the best known) and ``inf`` where nothing reached.
    """
    if resample == CI_TRIALS:
        bs = np.unique(st.batch_size)
        n_t = steps.shape[0]
        out = np.empty((n_t, n_boot, len(bs)))
        vals = [aggregate_seeds(steps[t], last, st) for t in range(n_t)]
        for i, b in enumerate(bs):
            idx = np.flatnonzero(st.batch_size == b)
            pick = idx[rng.integers(0, len(idx), size=(n_boot, len(idx)))]  # (R, k)
            for t in range(n_t):
                out[t, :, i] = _best_of(vals[t][0][pick], vals[t][1][pick])
        return bs, out
    return best_of_settings(*bootstrap_settings(steps, last, st, n_boot, rng), st)


def bootstrap_settings(
    steps: np.ndarray, last: np.ndarray, st: Settings, n_boot: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap replicates of every setting's steps, ``(value, lower bound)``, each (T, R, n_settings): within every
    setting draw its seeds with replacement and re-average them (:func:`analysis.fits.steps.aggregate_seeds`; the
    value ``inf`` where a drawn seed stopped short, the lower bound then the drawn seeds' mean of what they reached).
    The log-steps of a setting whose seeds all reached are drawn as adjusted residuals ``mean + sqrt(k/(k-1))·(x -
    mean)`` (Davison & Hinkley 1997, eq. 3.8): the plain bootstrap of a mean of ``k`` seeds has ``(k-1)/k`` of its
    variance, 2/3 with three seeds, and its interval undercovers."""
    n_t = steps.shape[0]
    n_seeds = st.n_seeds
    val = np.empty((n_t, n_boot, len(n_seeds)))
    low = np.empty_like(val)
    for k in np.unique(n_seeds):
        which = np.flatnonzero(n_seeds == k)
        members = np.stack([st.members[w] for w in which])  # (n_k, k)
        pick = (np.arange(len(which))[None, :, None], rng.integers(0, k, size=(n_boot, len(which), k)))
        inflate = np.sqrt(k / (k - 1)) if k > 1 else 1.0
        for t in range(n_t):
            s = steps[t][members]  # (n_k, k)
            reached = np.isfinite(s)
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.log(np.where(reached, s, np.maximum(last[members], 0.0)))
                known = reached.all(axis=1)
                xbar = x.mean(axis=1, keepdims=True)
                x = np.where(known[:, None], xbar + inflate * (x - xbar), x)  # adjusted residuals
            low[t][:, which] = np.exp(x[pick].mean(axis=-1))
            val[t][:, which] = np.where(reached[pick].all(axis=-1), low[t][:, which], np.inf)
    return val, low


def best_of_settings(val: np.ndarray, low: np.ndarray, st: Settings) -> tuple[np.ndarray, np.ndarray]:
    """The best setting per batch size of replicated settings ``(value, lower bound)`` (..., n_settings),
    censoring-aware (:func:`_best_of`): ``(batch sizes, (..., n_b))``."""
    bs = np.unique(st.batch_size)
    out = np.empty((*val.shape[:-1], len(bs)))
    for i, b in enumerate(bs):
        idx = np.flatnonzero(st.batch_size == b)
        out[..., i] = _best_of(val[..., idx], low[..., idx])
    return bs, out


def leverages(batch_sizes: np.ndarray, fit: ParetoFit) -> np.ndarray:
    """Diagonal of the hat matrix of the log-space fit at its optimum: ``J (JᵀJ)⁻¹ Jᵀ`` with ``J = [q, 1 - q]``,
    ``q = S_min / (S_min + E_min/B)`` the derivatives of ``log S`` in ``(log S_min, log E_min)``."""
    b = np.asarray(batch_sizes, dtype=np.float64)
    q = fit.s_min / (fit.s_min + fit.e_min / b)
    jac = np.stack([q, 1.0 - q], axis=1)  # (n, 2)
    return np.einsum("ij,jk,ik->i", jac, np.linalg.pinv(jac.T @ jac), jac)


def point_vars(reps: np.ndarray) -> np.ndarray:
    """(n,) variance of log steps of each point over the replicates ``reps`` (R, n), finite positive values only;
    0 where fewer than two are finite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.where(np.isfinite(reps) & (reps > 0), np.log(np.where(reps > 0, reps, 1.0)), np.nan)
    ok = np.isfinite(lr).sum(axis=0) >= 2
    v = np.zeros(reps.shape[1])
    v[ok] = np.nanvar(lr[:, ok], axis=0, ddof=1)
    return v


def lack_of_fit_var(batch_sizes: np.ndarray, steps: np.ndarray, fit: ParetoFit, reps: np.ndarray) -> float:
    """Between-point variance of log steps that the replicates do not hold (method of moments, truncated at 0).

    Each point's log steps ``y_i`` scatters about the hyperbola with the variance ``v_i`` that the replicates
    (``reps``: (R, n), the bootstrap of the point's best steps) show, plus an unknown ``tau²`` common to all points
    (what varies from point to point but not from seed to seed: the lr grid's distance from each batch size's
    optimum, the crossing interpolation's bias, any bend of the real curve). With residuals ``r_i`` and leverages
    ``h_i`` of the least-squares fit, ``E Σ r_i² = Σ (1 - h_i)(v_i + tau²)``, so
    ``tau² = max(0, (Σ r_i² - Σ (1 - h_i) v_i) / (n - 2))`` (DerSimonian & Laird 1986, unweighted form).
    Points whose replicates have fewer than two finite values count with ``v_i = 0``.
    """
    b = np.asarray(batch_sizes, dtype=np.float64)
    y = np.log(np.asarray(steps, dtype=np.float64))
    r = y - np.log(fit.s_min + fit.e_min / b)
    v = point_vars(reps)
    h = leverages(b, fit)
    return float(max(0.0, ((r**2).sum() - ((1.0 - h) * v).sum()) / (len(b) - 2)))


def with_lack_of_fit(reps: np.ndarray, tau2: float, rng: np.random.Generator) -> np.ndarray:
    """The replicates with an independent ``N(0, tau²)`` error added to each point's log steps (``nan``/``inf``
    entries unchanged): the refitted B_crit then varies as much as the points scatter about the hyperbola."""
    if tau2 <= 0:
        return reps
    with np.errstate(invalid="ignore", over="ignore"):
        return reps * np.exp(np.sqrt(tau2) * rng.standard_normal(reps.shape))


def percentile_ci(samples: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of the finite samples (``nan`` when there are none)."""
    s = samples[np.isfinite(samples)]
    if len(s) == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def check_enough(
    target: float, metric: str, batch_sizes: np.ndarray, best: np.ndarray, censored: np.ndarray | None = None
) -> None:
    """Raise :class:`TooFewBatchSizesError` naming the batch sizes that miss ``target`` (and the censored ones:
    a setting stopped before reaching it, so their minimum is unknown)."""
    reached = np.isfinite(best)
    if reached.sum() < MIN_BATCH_SIZES:
        cens = np.zeros(len(best), bool) if censored is None else np.asarray(censored, bool)
        more = (
            f"; {batch_sizes[cens].tolist()} are censored (trials stopped before reaching it: lower the sweep's "
            "stopping.target_loss or raise max_steps)"
            if cens.any()
            else ""
        )
        raise TooFewBatchSizesError(
            f"target {target:g} on {metric}: only batch sizes {batch_sizes[reached].tolist()} reach it, "
            f"{batch_sizes[~reached & ~cens].tolist()} do not{more} (need >= {MIN_BATCH_SIZES}); "
            "pick a higher target"
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
