"""Steps-to-target per trial, and the best trial per batch size (Shallue et al. 2018, arXiv 1811.03600).

For a target loss, a trial's steps-to-target is the first step at which its (low-noise) eval metric is at
or below the target, linearly interpolated between the two evaluations that bracket the crossing. A trial
that never reaches the target is *censored* (``inf``); diverged and failed trials are *excluded* (``nan``)
and counted. Per batch size, the nuisance hyper-parameters are tuned by taking the fewest steps over that
batch size's trials."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis import metrics as m
from analysis.loaders import Runs, Series

EXCLUDED_STATUSES = (m.STATUS_DIVERGED, m.STATUS_FAILED)


def usable(runs: Runs) -> np.ndarray:
    """Boolean mask over trials: not diverged and not failed."""
    return ~np.isin(runs.status, EXCLUDED_STATUSES)


def excluded_counts(runs: Runs) -> dict[str, int]:
    """How many trials each excluded status removed, e.g. ``{"diverged": 3, "failed": 0}``."""
    return {s: int((runs.status == s).sum()) for s in EXCLUDED_STATUSES}


def _first_rows(trial: np.ndarray) -> np.ndarray:
    """Boolean mask of the first row of each trial in a (trial, step)-sorted series."""
    first = np.ones(len(trial), dtype=bool)
    first[1:] = trial[1:] != trial[:-1]
    return first


def steps_to_target(series: Series, n_trials: int, targets: np.ndarray | list[float]) -> np.ndarray:
    """Interpolated first crossing step for every (target, trial): shape ``(len(targets), n_trials)``.

    ``inf`` where a trial with data never reaches the target (censored) or has no rows. The crossing between
    evaluations ``(s0, v0)`` (above target) and ``(s1, v1)`` (at or below) is ``s0 + (v0 - y)/(v0 -
    v1)·(s1 - s0)``; a trial already at or below the target at its first evaluation gets that evaluation's
    step.
    """
    targets = np.atleast_1d(np.asarray(targets, dtype=np.float64))
    if len(series.trial) == 0:
        return np.full((len(targets), n_trials), np.inf)
    starts = np.flatnonzero(_first_rows(series.trial))
    longest = int(np.diff(np.append(starts, len(series.trial))).max())
    if len(starts) * longest <= 2 * len(series.trial) + 4096:  # trials of similar length: a dense grid
        return _dense(series, n_trials, targets, starts, longest)
    return _sparse(series, n_trials, targets)


def _dense(series: Series, n_trials: int, targets: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """One running minimum per trial on a padded (trials, evaluations) grid, then one pass per target."""
    t, s, v = series.trial, series.step.astype(np.float64), series.value
    lengths = np.diff(np.append(starts, len(t)))
    if (lengths == width).all():  # every trial has the same number of evaluations: a reshape, no scatter
        vals, steps = v.reshape(len(starts), width), s.reshape(len(starts), width)
    else:
        row = np.repeat(np.arange(len(starts)), lengths)
        col = np.arange(len(t)) - np.repeat(starts, lengths)
        vals = np.full((len(starts), width), np.nan)  # (trials present, evaluations); padding is NaN
        vals[row, col] = v
        steps = np.zeros((len(starts), width))
        steps[row, col] = s
    runmin = np.fmin.accumulate(np.where(np.isnan(vals), np.inf, vals), axis=1)  # NaN never reaches
    out = np.full((len(targets), n_trials), np.inf)
    r = np.arange(len(starts))
    for j, y in enumerate(targets):
        k = (runmin > y).sum(axis=1)  # index of the first evaluation at or below y; width if none
        hit = k < width
        rr, kk = r[hit], k[hit]
        step = steps[rr, kk]
        inner = kk > 0
        v0, v1 = vals[rr[inner], kk[inner] - 1], vals[rr[inner], kk[inner]]
        s0 = steps[rr[inner], kk[inner] - 1]
        with np.errstate(invalid="ignore"):
            frac = (v0 - y) / (v0 - v1)  # v0 > y >= v1, so 0 <= frac < 1; NaN v0 -> no interpolation
        step_in = step[inner]
        ok = np.isfinite(frac)
        step_in[ok] = s0[ok] + frac[ok] * (step_in[ok] - s0[ok])
        step[inner] = step_in
        out[j, t[starts[rr]]] = step
    return out


def _sparse(series: Series, n_trials: int, targets: np.ndarray) -> np.ndarray:
    """Per target, the first row at or below it in each trial (for trials of very unequal lengths)."""
    out = np.full((len(targets), n_trials), np.inf)
    t, s, v = series.trial, series.step.astype(np.float64), series.value
    starts = _first_rows(t)
    for j, y in enumerate(targets):
        idx = np.flatnonzero(v <= y)  # NaN compares False: a NaN evaluation never counts as reaching
        if len(idx) == 0:
            continue
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = t[idx[1:]] != t[idx[:-1]]  # first hit of each trial
        first = idx[keep]
        step = s[first]
        interp = ~starts[first]
        prev = first[interp] - 1
        v0, v1 = v[prev], v[first[interp]]
        with np.errstate(invalid="ignore"):
            frac = (v0 - y) / (v0 - v1)  # v0 > y >= v1, so 0 <= frac < 1
        ok = np.isfinite(frac)
        step_i = step[interp]
        step_i[ok] = s[prev][ok] + frac[ok] * (step_i[ok] - s[prev][ok])
        step[interp] = step_i
        out[j, t[first]] = step
    return out


@dataclass(frozen=True)
class BestPerBatch:
    """Per batch size (ascending): fewest steps over usable trials and the trial that achieved it."""

    batch_sizes: np.ndarray  # (n_b,) int64
    steps: np.ndarray  # (n_b,) float64, inf where no usable trial reached the target
    trial: np.ndarray  # (n_b,) int64 row in Runs.trials, -1 where none reached


def best_per_batch(steps: np.ndarray, batch_size: np.ndarray, ok: np.ndarray) -> BestPerBatch:
    """Tune the nuisance hyper-parameters: per batch size, the minimum steps over usable trials (``ok``)."""
    bs = np.unique(batch_size[ok])
    best = np.full(len(bs), np.inf)
    arg = np.full(len(bs), -1, dtype=np.int64)
    for i, b in enumerate(bs):
        rows = np.flatnonzero(ok & (batch_size == b))
        k = int(np.argmin(steps[rows]))
        if np.isfinite(steps[rows[k]]):
            best[i], arg[i] = steps[rows[k]], rows[k]
    return BestPerBatch(bs, best, arg)


def final_losses(series: Series, n_trials: int) -> tuple[np.ndarray, np.ndarray]:
    """Per trial, the first evaluated value and the lowest value (``nan`` where a trial has no finite
    rows)."""
    first_val = np.full(n_trials, np.nan)
    lowest = np.full(n_trials, np.nan)
    if len(series.trial) == 0:
        return first_val, lowest
    starts = np.flatnonzero(_first_rows(series.trial))
    rows = series.trial[starts]
    first_val[rows] = series.value[starts]
    vals = np.where(np.isnan(series.value), np.inf, series.value)
    low = np.minimum.reduceat(vals, starts)
    lowest[rows] = np.where(np.isinf(low), np.nan, low)
    return first_val, lowest
