"""The fit of one metric of a sweep: steps-to-target per trial, the best setting per batch size, the Pareto fit
``S = S_min + E_min/B`` and ``B_crit = E_min/S_min`` with its bootstrap interval and trust flags, per target
(steps 1-4 of the pipeline in ``analysis.reporting.report``; docs/analysis.md, docs/intervals.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.fits import calibration, lr_grid, pareto
from analysis.fits import flags as fl
from analysis.fits.steps import aggregate_seeds, best_per_batch, final_losses, pooled_steps, usable
from analysis.fits.trust import PointChecks
from analysis.sources.loaders import Runs


def analyze_metric(
    runs: Runs,
    metric: str,
    targets: list[float] | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.9,
    n_targets: int = 8,
    strict: bool = True,
    notes: list[str] | None = None,
    calibrate: bool = True,
) -> list[dict]:
    """Per target: ``{"target", "b_crit", "b_crit_ci", "s_min", "e_min", "flags", "ci_resamples",
    "b_crit_refined", "points", "censored", "censored_batch_sizes", "unreached_batch_sizes", "ci_level"}``.

    ``calibrate``: the interval's percentile level is calibrated by a parametric double bootstrap
    (:mod:`analysis.fits.calibration`) so that it holds ``level``; ``ci_level`` is the level used (``level`` itself
    when not calibrated, as with ``bcrit analyze --no-calibration``).

    ``flags`` (names from :mod:`analysis.fits.flags`; empty = trustworthy) say why a number should not be taken at
    face value. ``strict``: a given target with fewer than 3 known batch sizes raises
    :class:`pareto.TooFewBatchSizesError`; otherwise (and for automatic targets: the lowest can fall below where
    trials stopped at the sweep's own target) it is skipped with a line in ``notes``."""
    series = runs.series(metric)
    n = len(runs.trial_ids)
    ok, bs = usable(runs), runs.batch_size
    if len(series.trial) == 0:
        raise pareto.TooFewBatchSizesError(f"no trial reported {metric!r} (have {runs.metric_names()[:8]})")
    if targets is None:  # automatic targets: one that too few batch sizes reach is skipped with a note, not fatal
        targets, strict = list(pareto.auto_targets(bs, ok, *final_losses(series, n), n=n_targets)), False
    pooled = pooled_steps(runs, series, targets)  # the splits of one seed are one repeat
    runs, steps, last, ok, st = pooled.runs, pooled.steps, pooled.last, pooled.ok, pooled.st
    tuned = [_tuned(row, last, st) for row in steps]  # per target: (value, lower bound, best per batch size)
    resample = pareto.ci_resamples(st, np.concatenate([best.setting for _, _, best in tuned]))
    boot = _replicates(steps, last, st, bootstrap, np.random.default_rng(seed), resample)
    ctx = PointChecks(runs, series, st, last, pooled.spacing)
    kappas = _lr_curvatures(tuned, st, ctx.tried)
    out = []
    for j, y in enumerate(targets):
        val, low, best = tuned[j]
        try:
            pareto.check_enough(float(y), metric, best.batch_sizes, best.steps, best.censored)
        except pareto.TooFewBatchSizesError as e:
            if strict:
                raise
            (notes if notes is not None else []).append(str(e))
            continue
        fit = pareto.fit_pareto(best.batch_sizes, best.steps)
        dof = _variance_dof(st, resample, best) if calibrate else None
        ci, used = _b_crit_interval(best, fit, None if boot is None else boot[j], target_rng(seed, y), level, dof)
        ref = _refined(best, val, st, ctx.tried, kappas[j])
        res = _target_result(runs, ctx, float(y), steps[j], val, low, st, best, fit, ci, ok, resample, ref)
        out.append({**res, "ci_level": used})
    return out


def target_rng(seed: int, target: float) -> np.random.Generator:
    """The random stream of one target's interval (lack-of-fit draws, calibration): a function of the seed and the
    target's value only, so the interval at a target does not depend on which other targets are analysed with it
    (``bcrit analyze --targets 0.18`` and the automatic targets agree where they share a target), and successive
    refits of a growing sweep (the adaptive sweep's) draw the same numbers where the data allow it."""
    return np.random.default_rng([int(seed), int(np.float64(target).view(np.uint64))])


def _replicates(steps, last, st, bootstrap: int, rng, resample: str):
    """The bootstrap's best steps per batch size (T, R, n_b); None without a bootstrap."""
    if bootstrap <= 0 or not len(st.members):
        return None
    return pareto.bootstrap_best(steps, last, st, bootstrap, rng, resample)[1]


@dataclass(frozen=True)
class Refined:
    """B_crit on the refined points (analysis.fits.lr_grid.refined_optima)."""

    steps: np.ndarray  # per batch size, the optimum's steps
    lr: np.ndarray  # per batch size, the optimum's learning rate
    b_crit: float
    kappa: float  # the shared lr curvature it was refined with


def _refined(best, val, st, tried, kappa: float) -> Refined:
    """The refined fit of one target."""
    fitted = np.isfinite(best.steps)
    ref_steps, ref_lr = lr_grid.refined_optima(val, st, best, tried, kappa)
    fit = pareto.fit_pareto(best.batch_sizes[fitted], ref_steps[fitted])
    return Refined(ref_steps, ref_lr, fit.b_crit, kappa)


def _variance_dof(st, resample: str, best) -> np.ndarray:
    """Degrees of freedom of each fitted point's bootstrap variance (the points of ``best`` with finite steps, in
    order): its best setting's seeds - 1 (``"seeds"``), or the median number of settings per batch size - 1
    (``"trials"``); at least 1. Per point, not a median over every setting: in an adaptive sweep a 2-seed point's
    variance rests on 1 degree of freedom whatever the other settings hold, and the many one-seed neighbours of its
    3-seed points would otherwise set the whole interval's calibration to 1 (docs/intervals.md)."""
    fitted = best.setting[np.isfinite(best.steps)]
    if resample == fl.CI_SEEDS:
        return np.maximum(1.0, st.n_seeds[fitted] - 1.0)
    per_b = np.unique(st.batch_size, return_counts=True)[1]
    return np.full(len(fitted), max(1.0, float(np.median(per_b)) - 1.0))


def _b_crit_interval(best, fit, boot: np.ndarray | None, rng, level: float, dof: np.ndarray | None):
    """The percentile interval of ``B_crit`` at one target and the level it was taken at: the bootstrap's best
    steps per batch size (``boot``, (R, n_B); None: no bootstrap) at the point estimate's batch sizes, the points'
    scatter about the fit beyond what the replicates show added (analysis.fits.pareto.lack_of_fit_var), each
    replicate refitted. ``dof`` (None: no calibration): the level is calibrated by
    :func:`analysis.fits.calibration.calibrated_level` with each point's variance on its ``dof`` degrees of
    freedom (:func:`_variance_dof`)."""
    if boot is None:
        return (float("nan"), float("nan")), level
    fitted = np.isfinite(best.steps)
    reps = np.where(fitted[None, :], boot, np.nan)  # the batch sizes of the point estimate only
    bf, v = best.batch_sizes[fitted], pareto.point_vars(reps[:, fitted])
    tau2 = pareto.lack_of_fit_var(bf, best.steps[fitted], fit, reps[:, fitted])
    reps = pareto.with_lack_of_fit(reps, tau2, rng)
    s_min, e_min = pareto.fit_pareto_batched(best.batch_sizes, reps, np.log([fit.s_min, fit.e_min]))
    if dof is not None:
        level = calibration.calibrated_level(bf, fit.s_min, fit.e_min, v, tau2, dof, level, rng)
    return pareto.percentile_ci(e_min / s_min, level), level


def _tuned(steps: np.ndarray, last: np.ndarray, st):
    """One target's ``(value, lower bound, best per batch size)``: the seeds aggregated per setting, then the best
    setting per batch size (analysis.fits.steps, stages 1-2)."""
    val, low = aggregate_seeds(steps, last, st)
    return val, low, best_per_batch(val, low, st)


def _lr_curvatures(tuned: list, st, tried: dict) -> list[float]:
    """Per target, the relative curvature of steps in log lr its points share (analysis.fits.lr_grid), or where
    they give none (its slower settings censored, say) the median of the other targets' (``nan`` where none has
    one): the penalty of an lr off the optimum is a property of the training, shared along it as across batch
    sizes."""
    own = [lr_grid.shared_curvature(lr_grid.brackets(val, st, best, tried)) for val, _, best in tuned]
    fin = [v for v in own if np.isfinite(v)]
    metric = float(np.median(fin)) if fin else float("nan")
    return [v if np.isfinite(v) else metric for v in own]


def _target_result(runs, ctx, y: float, steps: np.ndarray, val, low, st, best, fit, ci, ok, resample, ref) -> dict:
    """One target's entry of `analyze_metric`: the fit, the interval, the fit with the learning rate refined
    (``ref``: :class:`Refined`), the points with their checks, the flags, what was censored."""
    fitted = np.isfinite(best.steps)
    ref_steps, ref_lr, kappa = ref.steps, ref.lr, ref.kappa
    gaps = lr_grid.divergence_gaps(val, low, st, best, ctx.tried, ctx.diverged, kappa)
    limit = fl.LR_DIVERGENCE_GAP
    if np.isfinite(ci).all() and ci[0] > 0:  # and a quarter of the interval's half-width, in log
        limit = max(limit, fl.LR_DIVERGENCE_FRAC * float(np.log(ci[1] / ci[0])) / 2)
    points = [ctx.point(int(i), best, steps, ref_steps[i], ref_lr[i], gaps[i], limit) for i in np.flatnonzero(fitted)]
    flags = {f for p in points for f in p["flags"]}
    if not best.batch_sizes[fitted].min() <= fit.b_crit <= best.batch_sizes[fitted].max():
        flags.add(fl.EXTRAPOLATED)
    censored_b = [ctx.censored_reason(int(i), best, steps) for i in np.flatnonzero(best.censored)]
    censored_b += ctx.stopped_unreached(best, ok)
    cut_short = {c["batch_size"] for c in censored_b}  # censored, so not also listed as unreached
    if censored_b:
        flags.add(fl.CENSORED_BATCH_SIZES)
    return {
        "target": y,
        "b_crit": fit.b_crit,
        "b_crit_ci": [_num(ci[0]), _num(ci[1])],
        "s_min": fit.s_min,
        "e_min": fit.e_min,
        "flags": [f for f in fl.FLAGS if f in flags],
        "ci_resamples": resample,
        "b_crit_refined": ref.b_crit,
        "points": points,
        "censored": [runs.trial_ids[r] for r in np.flatnonzero(ok & np.isinf(steps))],
        "censored_batch_sizes": censored_b,
        "unreached_batch_sizes": [
            int(b) for b, k in zip(best.batch_sizes, best.setting, strict=True) if k < 0 and int(b) not in cut_short
        ],  # fmt: skip
    }


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)
