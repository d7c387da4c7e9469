"""Steps-to-target per trial, and the best trial per batch size (Shallue et al. 2018, arXiv 1811.03600).

A trial's steps-to-target is the first step at which its (low-noise) eval metric is at or below the target, linearly
interpolated between the two evaluations that bracket the crossing. A trial that never reaches the target is
*censored* (``inf``) at its last evaluated step; diverged and failed trials, and trials an adaptive sweep ended at its
goal (``ended_at_goal``: neither a lower bound on a setting's steps nor part of the answer), are *excluded* (``nan``)
and counted.

:func:`best_per_batch` tunes per batch size in two stages: (1) the seeds of each *setting* (batch size, split and
:data:`analysis.sources.schema.NUISANCE_COLUMNS`) are averaged as the geometric mean of their steps (a seed that has
not reached counts with its last evaluated step, making the mean a lower bound); (2) the best setting is the one with
the fewest averaged steps, *known* only if every other setting's lower bound is at least as large, else the batch
size is *censored* at that target. Why a geometric mean and not the minimum over seeds: docs/design.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.core import metrics as m
from analysis.fits import crossing
from analysis.sources.loaders import Runs, Series
from analysis.sources.schema import NUISANCE_COLUMNS, SPLIT_COLUMNS

EXCLUDED_STATUSES = (m.STATUS_DIVERGED, m.STATUS_FAILED, m.STATUS_ENDED)


def usable(runs: Runs) -> np.ndarray:
    """Boolean mask over trials: not diverged, not failed, not ended by the sweep."""
    return ~np.isin(runs.status, EXCLUDED_STATUSES)


def excluded_counts(runs: Runs) -> dict[str, int]:
    """How many trials each excluded status removed, e.g. ``{"diverged": 3, "failed": 0, "ended_at_goal": 0}``."""
    return {s: int((runs.status == s).sum()) for s in EXCLUDED_STATUSES}


def _first_rows(trial: np.ndarray) -> np.ndarray:
    """Boolean mask of the first row of each trial in a (trial, step)-sorted series."""
    first = np.ones(len(trial), dtype=bool)
    first[1:] = trial[1:] != trial[:-1]
    return first


def steps_to_target(series: Series, n_trials: int, targets: np.ndarray | list[float], local: bool = True) -> np.ndarray:
    """Crossing step for every (target, trial): shape ``(len(targets), n_trials)``.

    ``inf`` where a trial with data never reaches the target (censored) or has no rows. The *first passage*: the
    first evaluation at or below the target, the crossing between it ``(s1, v1)`` and the evaluation before
    ``(s0, v0)`` interpolated as ``s0 + (v0 - y)/(v0 - v1)·(s1 - s0)``; a trial already at or below the target at
    its first evaluation gets that evaluation's step. ``local`` (the default): that crossing refined by a local
    quadratic fit of the evaluations around it (:mod:`analysis.fits.crossing`: the first passage is early by noise
    and late by curvature, differently at each batch size); False: the first passage itself.
    """
    targets = np.atleast_1d(np.asarray(targets, dtype=np.float64))
    if len(series.trial) == 0:
        return np.full((len(targets), n_trials), np.inf)
    starts = np.flatnonzero(_first_rows(series.trial))
    longest = int(np.diff(np.append(starts, len(series.trial))).max())
    if len(starts) * longest <= 2 * len(series.trial) + 4096:  # trials of similar length: a dense grid
        return _dense(series, n_trials, targets, starts, longest, local)
    return _sparse(series, n_trials, targets, local)


def _dense(
    series: Series, n_trials: int, targets: np.ndarray, starts: np.ndarray, width: int, local: bool = True
) -> np.ndarray:
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
    key = _row_keys(t, s) if local else None
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
        if local:
            step = _refine_rows(t, s, v, key, starts[rr] + kk, step, y)
        out[j, t[starts[rr]]] = step
    return out


def _sparse(series: Series, n_trials: int, targets: np.ndarray, local: bool = True) -> np.ndarray:
    """Per target, the first row at or below it in each trial (for trials of very unequal lengths)."""
    out = np.full((len(targets), n_trials), np.inf)
    t, s, v = series.trial, series.step.astype(np.float64), series.value
    starts = _first_rows(t)
    key = _row_keys(t, s) if local else None
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
        if local:
            step = _refine_rows(t, s, v, key, first, step, y)
        out[j, t[first]] = step
    return out


def _row_keys(t: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The (trial, step) order of a sorted series as one sorted float64 per row (exact: integers below 2**53)."""
    return t.astype(np.float64) * (float(s.max()) + 1.0) + s


def _refine_rows(
    t: np.ndarray, s: np.ndarray, v: np.ndarray, key: np.ndarray, first: np.ndarray, step: np.ndarray, y: float
) -> np.ndarray:
    """:func:`analysis.fits.crossing.refine` of the crossings ``step`` whose first passage is at the series' rows
    ``first`` (one per trial), each on a slab of its trial's rows: those within the fit's window in log step plus
    ``MIN_POINTS`` on either side of the first passage (the nearest points the fit may need), padded to one grid.
    ``t``, ``s`` (float64), ``v``: the series' columns; ``key``: their :func:`_row_keys`, computed once per series."""
    if len(first) == 0:
        return step
    base = key[first] - s[first]  # the trial's offset in key
    lo = np.searchsorted(key, base + step * np.exp(-crossing.WINDOW), side="left")
    hi = np.searchsorted(key, base + step * np.exp(crossing.WINDOW), side="right")
    a = np.searchsorted(t, t[first], side="left")  # the trial's rows are [a, b)
    b = np.searchsorted(t, t[first], side="right")
    lo = np.clip(np.minimum(lo, first - crossing.MIN_POINTS), a, None)
    hi = np.clip(np.maximum(hi, first + crossing.MIN_POINTS + 1), None, b)
    width = int((hi - lo).max())
    idx = lo[:, None] + np.arange(width)[None, :]
    pad = idx >= hi[:, None]
    idx = np.where(pad, lo[:, None], idx)
    return crossing.refine(s[idx], np.where(pad, np.nan, v[idx]), step, y)


def trial_extent(series: Series, n_trials: int) -> tuple[np.ndarray, np.ndarray]:
    """Per trial: the last evaluated step (``-1`` without rows; how far a censored trial is known to have
    run) and the mean evaluation interval in steps (``nan`` with fewer than two rows)."""
    last = np.full(n_trials, -1.0)
    spacing = np.full(n_trials, np.nan)
    if len(series.trial) == 0:
        return last, spacing
    starts = np.flatnonzero(_first_rows(series.trial))
    ends = np.append(starts[1:], len(series.trial)) - 1
    rows = series.trial[starts]
    s0, s1 = series.step[starts].astype(np.float64), series.step[ends].astype(np.float64)
    count = ends - starts + 1
    last[rows] = s1
    with np.errstate(invalid="ignore", divide="ignore"):
        spacing[rows] = np.where(count > 1, (s1 - s0) / np.maximum(count - 1, 1), np.nan)
    return last, spacing


def pool_splits(runs: Runs, steps: np.ndarray, last: np.ndarray, ok: np.ndarray):
    """One pseudo-trial per (batch size, nuisance setting, seed) over its splits: ``(runs', steps', last', ok')``.

    ``steps`` is ``(T, n)`` (one row per target), ``last`` and ``ok`` per trial, as in ``bcrit analyze``. Splits of
    one batch size run with the same seed take the same steps up to numerics (same examples, same draws: the demo's
    splits of B = 64 cross its targets at the same step), so they are one repeat, not several. Left as separate
    settings, the bootstrap resampled each split's seeds independently and took the minimum over the splits:
    replicates biased low and intervals too narrow (they held the truth far less often than their level with
    several splits per batch size, and as often as stated with one). Pooled, a group's steps
    at each target are the geometric mean of its splits' (``inf`` unless every split reached; ``last'`` the same
    mean with the last evaluated step of those that did not, else the largest last step), kept on its first usable
    trial; the others leave ``ok'``. The trials table's split columns are set to ``(B, 1, 1)`` so that the settings
    group by batch size and nuisance hyper-parameters alone. A split that ran fewer seeds than the others joins
    the groups of the seeds it ran. Without two splits of one (batch size, setting, seed) nothing changes."""
    import pyarrow as pa

    steps, last, ok = steps.copy(), last.copy(), ok.copy()
    cols = [c for c in NUISANCE_COLUMNS if c in runs.trials.column_names] + ["seed"]
    vals = [runs.batch_size.astype(str)] + [np.asarray(runs.trials.column(c).to_pylist(), dtype=str) for c in cols]
    key = np.unique(np.stack(vals, axis=1), axis=0, return_inverse=True)[1].ravel()
    for g in np.unique(key[ok]):
        members = np.flatnonzero(ok & (key == g))
        if len(members) < 2:
            continue
        s = steps[:, members]  # (T, k)
        reached = np.isfinite(s)
        with np.errstate(divide="ignore"):
            low = np.exp(np.mean(np.log(np.where(reached, s, np.maximum(last[members], 0.0)[None, :])), axis=1))
        all_reached = reached.all(axis=1)
        steps[:, members[0]] = np.where(all_reached, low, np.inf)
        # the lower bound of a censored group is its mean of (steps or last step): what aggregate_seeds reads
        last[members[0]] = last[members].max() if all_reached.all() else low[~all_reached].min()
        ok[members[1:]] = False
        steps[:, members[1:]] = np.nan
    b = runs.trials.column("batch_size")
    trials = runs.trials
    for name, col in (("micro_batch_size", b), ("grad_accum", pa.array(np.ones(len(b), np.int64))),
                      ("num_workers", pa.array(np.ones(len(b), np.int64)))):  # fmt: skip
        trials = trials.set_column(trials.schema.get_field_index(name), name, col.cast(trials.schema.field(name).type))
    return Runs(trials, runs.metrics, source=runs.source), steps, last, ok


@dataclass(frozen=True)
class Settings:
    """Usable trials grouped into nuisance settings; the trials of one setting are its seeds (repeats)."""

    batch_size: np.ndarray  # (n_settings,) int64
    lr: np.ndarray  # (n_settings,) float64
    members: list[np.ndarray]  # per setting, its trial rows (ascending)
    lr_only: np.ndarray  # (n_batch_sizes,) bool: at that batch size the settings differ in lr only

    @property
    def n_seeds(self) -> np.ndarray:
        return np.array([len(x) for x in self.members], dtype=np.int64)


def _column_codes(col) -> np.ndarray:
    """Integer codes of a trials column's values (exact: floats compare by their shortest repr)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    vals = pc.cast(col, pa.string()).to_pylist()
    return np.unique(np.asarray([str(v) for v in vals], dtype=object), return_inverse=True)[1].ravel()


def settings_of(runs: Runs, ok: np.ndarray) -> Settings:
    """Group the usable trials (``ok``) by (batch size, split, nuisance columns present); ``seed`` varies within.

    Settings come sorted by (batch size, lr), so the settings of one batch size are contiguous and in lr order.
    """

    others = [*SPLIT_COLUMNS, *[c for c in NUISANCE_COLUMNS[1:] if c in runs.trials.column_names]]
    rows = np.flatnonzero(ok)
    lr = runs.trials.column("lr").to_numpy().astype(np.float64)
    other = np.stack([_column_codes(runs.trials.column(c)) for c in others], axis=1).astype(np.float64)
    key = np.concatenate([runs.batch_size[rows, None].astype(np.float64), lr[rows, None], other[rows]], axis=1)
    if len(rows) == 0:
        z = np.zeros(0)
        return Settings(z.astype(np.int64), z, [], np.zeros(0, bool))
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.ravel()
    order = np.argsort(inv, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(inv[order]) != 0, True])
    members = [rows[order[a:b]] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    bs = uniq[:, 0].astype(np.int64)
    lr_only = np.array([len(np.unique(uniq[bs == b, 2:], axis=0)) == 1 for b in np.unique(bs)])
    return Settings(bs, uniq[:, 1], members, lr_only)


@dataclass(frozen=True)
class Pooled:
    """A sweep's steps to its targets, ready for the best setting per batch size (:func:`pooled_steps`)."""

    runs: Runs  # the splits of one seed pooled (:func:`pool_splits`): trial indices unchanged
    steps: np.ndarray  # (T, n): per target and trial, steps (``inf``: censored; ``nan``: not usable)
    last: np.ndarray  # (n,) last evaluated step (a pooled group's on its first trial)
    spacing: np.ndarray  # (n,) evaluation spacing (:func:`trial_extent`)
    ok: np.ndarray  # (n,) usable and not pooled into another trial
    st: Settings  # the settings of the ``ok`` trials


def pooled_steps(runs: Runs, series: Series, targets: np.ndarray | list[float]) -> Pooled:
    """Stage 0 of every fit of steps (``bcrit analyze``, its bands, ``bcrit recommend``): each trial's steps to the
    ``targets`` on ``series`` (:func:`steps_to_target`; ``nan`` where the trial is not :func:`usable`), the splits
    of one seed pooled into one repeat (:func:`pool_splits`), and the settings of what is left
    (:func:`settings_of`)."""
    n = len(runs.trial_ids)
    ok = usable(runs)
    steps = steps_to_target(series, n, targets)
    steps[:, ~ok] = np.nan
    last, spacing = trial_extent(series, n)
    runs, steps, last, ok = pool_splits(runs, steps, last, ok)
    return Pooled(runs, steps, last, spacing, ok, settings_of(runs, ok))


def aggregate_seeds(steps: np.ndarray, last: np.ndarray, st: Settings) -> tuple[np.ndarray, np.ndarray]:
    """Per setting, ``(value, lower bound)`` of the seeds' geometric-mean steps for one target.

    ``value`` is ``inf`` unless every seed reached the target; ``lower bound`` puts each unreached seed's last
    evaluated step in place of its steps (equal to ``value`` when every seed reached)."""
    if not st.members:
        return np.zeros(0), np.zeros(0)
    order = np.concatenate(st.members)
    starts = np.r_[0, np.cumsum(st.n_seeds)[:-1]]
    s = steps[order]
    reached = np.isfinite(s)
    with np.errstate(divide="ignore"):
        logs = np.log(np.where(reached, s, np.maximum(last[order], 0.0)))
    lower = np.exp(np.add.reduceat(logs, starts) / st.n_seeds)
    n_reached = np.add.reduceat(reached.astype(np.int64), starts)
    return np.where(n_reached == st.n_seeds, lower, np.inf), lower


@dataclass(frozen=True)
class BestPerBatch:
    """Per batch size (ascending): the best setting's steps, and whether that minimum is known."""

    batch_sizes: np.ndarray  # (n_b,) int64
    steps: np.ndarray  # (n_b,) float64: the best setting's steps; inf where no setting reached or censored
    setting: np.ndarray  # (n_b,) int64 best known setting, -1 where no setting reached the target
    censored: np.ndarray  # (n_b,) bool: a setting that stopped below the best known steps might be faster
    blocker: np.ndarray  # (n_b,) int64 the censored setting with the lowest lower bound, -1 if none
    candidate: np.ndarray  # (n_b,) float64 the best known steps (finite also where censored)


def best_per_batch(value: np.ndarray, lower: np.ndarray, st: Settings) -> BestPerBatch:
    """Tune the nuisance setting per batch size, censoring-aware (module docstring, stage 2)."""
    bs = np.unique(st.batch_size)
    best = np.full(len(bs), np.inf)
    cand = np.full(len(bs), np.inf)
    arg = np.full(len(bs), -1, dtype=np.int64)
    cens = np.zeros(len(bs), dtype=bool)
    block = np.full(len(bs), -1, dtype=np.int64)
    for i, b in enumerate(bs):
        idx = np.flatnonzero(st.batch_size == b)
        v = value[idx]
        k = int(np.argmin(v))
        if not np.isfinite(v[k]):
            continue
        arg[i], cand[i] = idx[k], v[k]
        open_lb = np.where(np.isfinite(v), np.inf, lower[idx])  # settings known only as a lower bound
        j = int(np.argmin(open_lb))
        if open_lb[j] < v[k]:
            cens[i], block[i] = True, idx[j]
        else:
            best[i] = v[k]
    return BestPerBatch(bs, best, arg, cens, block, cand)


def crossing_jitter(series: Series, rows: np.ndarray, t_cross: float, min_pts: int = 6):
    """How much the loss fluctuates around a trial's crossing, relative to its descent: ``scatter / (|slope| ·
    t_cross)``, from a quadratic fit of the evaluations within ``t_cross·(1 ± 0.25)`` (at least ``min_pts``,
    the nearest ones). ``inf`` where the fitted curve does not descend at the crossing; ``nan`` with too few
    rows. ``rows``: the trial's row range ``[a, b)`` in the series."""
    a, b = rows
    s = series.step[a:b].astype(np.float64)
    v = series.value[a:b]
    fin = np.isfinite(v)
    s, v = s[fin], v[fin]
    if len(s) < min_pts or not t_cross > 0:
        return float("nan")
    near = np.abs(s - t_cross) <= 0.25 * t_cross
    if near.sum() < min_pts:
        near = np.zeros(len(s), dtype=bool)
        near[np.argsort(np.abs(s - t_cross), kind="stable")[:min_pts]] = True
    x = (s[near] - t_cross) / t_cross
    coef, res, *_ = np.polyfit(x, v[near], 2, full=True)
    resid = v[near] - np.polyval(coef, x)
    scatter = float(np.sqrt((resid**2).sum() / max(near.sum() - 3, 1)))
    slope = float(coef[1])  # d v / d (s / t_cross) at the crossing
    if slope >= 0:
        return float("inf")
    return scatter / -slope


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
