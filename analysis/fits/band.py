"""The critical batch size of a *band* of the loss curve, from the grid of trials: how B_crit changes along training.

``B_crit(y) = E_min(y)/S_min(y)`` counts every step from initialisation, so it averages the whole path down to ``y``;
the branched measurement (analysis.features.branched.branched) is *local*. The like-for-like quantity from the grid is
the band between two targets ``hi > lo``: with the best setting per batch size at each target, ``S*(y; B) = S_min(y) +
E_min(y)/B``, so the extra steps ``ΔS(B) = S*(lo; B) - S*(hi; B) = ΔS_min + ΔE_min / B`` follow the same hyperbola,
fitted the same way (analysis.fits.pareto, log space), and ``B_band = ΔE_min / ΔS_min`` is the examples-weighted local
critical batch size over the band (above ``B_crit(lo)``: the critical batch grows during training).

A batch size enters the fit only where both targets' minima are known (censoring-aware,
analysis.fits.steps.best_per_batch). The interval is the percentile bootstrap of
analysis.fits.pareto.bootstrap_best with the same draws for both targets (paired), refitted per replicate."""

from __future__ import annotations

import numpy as np

from analysis.fits import flags as fl
from analysis.fits import pareto
from analysis.fits.steps import aggregate_seeds, best_per_batch, pooled_steps
from analysis.sources.loaders import Runs


def band_b_crit(
    runs: Runs, metric: str, hi: float, lo: float, bootstrap: int = 1000, seed: int = 0, level: float = 0.9
) -> dict:
    """``{"hi", "lo", "b_crit", "b_crit_ci", "s_min", "e_min", "points", "flags", "ci_resamples"}`` of the band
    ``hi > lo`` on ``metric``; ``s_min``/``e_min`` are ``ΔS_min``/``ΔE_min`` and ``points`` the per-batch-size
    ``ΔS`` fitted. Raises ``ValueError`` for ``hi <= lo`` and :class:`pareto.TooFewBatchSizesError` when fewer
    than three batch sizes have both minima known."""
    if not hi > lo:
        raise ValueError(f"a band needs hi > lo, got hi={hi:g}, lo={lo:g}")
    pooled = pooled_steps(runs, runs.series(metric), [hi, lo])  # the splits of one seed are one repeat
    steps, last, st = pooled.steps, pooled.last, pooled.st  # steps: (2, n)
    best = [best_per_batch(*aggregate_seeds(steps[t], last, st), st) for t in (0, 1)]
    bs = best[0].batch_sizes
    with np.errstate(invalid="ignore"):
        delta = best[1].steps - best[0].steps  # inf/nan where either minimum is unknown
    fitted = np.isfinite(delta) & (delta > 0)
    pareto.check_enough(lo, metric, bs, np.where(fitted, delta, np.inf), best[0].censored | best[1].censored)
    fit = pareto.fit_pareto(bs[fitted], delta[fitted])
    ci = (float("nan"), float("nan"))
    resample = pareto.ci_resamples(st, np.concatenate([best[0].setting, best[1].setting]))
    if bootstrap > 0:
        _bs, reps = pareto.bootstrap_best(steps, last, st, bootstrap, np.random.default_rng(seed), resample)
        with np.errstate(invalid="ignore"):
            d = np.where(fitted[None, :], reps[1] - reps[0], np.nan)  # (R, n_b), the point estimate's batch sizes
        s_min, e_min = pareto.fit_pareto_batched(bs, d, np.log([fit.s_min, fit.e_min]))
        ci = pareto.percentile_ci(e_min / s_min, level)
    flags = []
    if not bs[fitted].min() <= fit.b_crit <= bs[fitted].max():
        flags.append(fl.EXTRAPOLATED)
    if (best[0].censored | best[1].censored).any():
        flags.append(fl.CENSORED_BATCH_SIZES)
    return {
        "hi": float(hi),
        "lo": float(lo),
        "b_crit": fit.b_crit,
        "b_crit_ci": [None if not np.isfinite(c) else float(c) for c in ci],
        "s_min": fit.s_min,
        "e_min": fit.e_min,
        "points": [
            {"batch_size": int(b), "delta_steps": float(s)} for b, s in zip(bs[fitted], delta[fitted], strict=True)
        ],
        "flags": [f for f in fl.FLAGS if f in flags],
        "ci_resamples": resample,
    }


def bands_between(
    runs: Runs,
    metric: str,
    targets: list[dict],
    bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.9,
    notes: list[str] | None = None,
) -> list[dict]:
    """:func:`band_b_crit` for every pair of consecutive analysed targets (``analyze_metric`` entries), highest
    loss first. A band's ``flags`` are its own plus those of the two targets it joins (the same crossings make
    both). Bands fewer than three batch sizes resolve are skipped with a line in ``notes``."""
    ts = sorted(targets, key=lambda t: -t["target"])
    out = []
    for a, b in zip(ts[:-1], ts[1:], strict=True):
        try:
            band = band_b_crit(runs, metric, a["target"], b["target"], bootstrap, seed, level)
        except pareto.TooFewBatchSizesError as e:
            (notes if notes is not None else []).append(f"band {a['target']:.4g} -> {b['target']:.4g}: {e}")
            continue
        flags = set(band["flags"]) | set(a.get("flags", [])) | set(b.get("flags", []))
        band["flags"] = [f for f in fl.FLAGS if f in flags]
        out.append(band)
    return out
