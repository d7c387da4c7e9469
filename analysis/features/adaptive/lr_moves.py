"""Moves on the learning-rate grid: past a tried edge, between tried neighbours, a bracket, a new batch size's lr."""

from __future__ import annotations

import numpy as np

from analysis.core import metrics as m
from analysis.features.adaptive.decision import Space, Trial, _same_lr
from analysis.fits.steps import final_losses
from analysis.sources.loaders import Runs


def _below(a: float, b: float) -> bool:
    """Learning rate ``a`` is lower than ``b`` and not the same setting (:func:`_same_lr`)."""
    return a < b and not _same_lr(a, b)


def _lrs_at(tried: list[Trial], b: int) -> list[float]:
    return sorted({t.lr for t in tried if t.batch_size == b})


def _beyond_edge(space: Space, tried: list[Trial], b: int, lr: float) -> float | None:
    """The next grid lr beyond the tried range at b on the side where ``lr`` sits; None if none is left, or if
    ``lr`` is no longer at an edge (a pending trial went past it: the flag is the finished trials')."""
    got = _lrs_at(tried, b)
    if _same_lr(lr, got[0]):
        below = [x for x in space.lrs if _below(x, got[0])]
        return below[-1] if below else None
    if not _same_lr(lr, got[-1]):
        return None
    above = [x for x in space.lrs if _below(got[-1], x)]
    return above[0] if above else None


def _neighbours(tried: list[Trial], b: int, lr: float) -> list[float]:
    """The tried lrs next to ``lr`` at b (the best may be either of them once seeds are averaged)."""
    got = _lrs_at(tried, b)
    i = next(k for k, x in enumerate(got) if _same_lr(x, lr))
    return got[max(i - 1, 0) : i] + got[i + 1 : i + 2]


def _refine(space: Space, tried: list[Trial], b: int, lr: float) -> list[float]:
    """Untried grid lrs between ``lr`` and its tried neighbours at b (the nearest on each side)."""
    got = _lrs_at(tried, b)
    i = next(k for k, x in enumerate(got) if _same_lr(x, lr))
    out = []
    if i > 0:
        mid = [x for x in space.lrs if _below(got[i - 1], x) and _below(x, lr)]
        out += mid[-1:]
    if i + 1 < len(got):
        mid = [x for x in space.lrs if _below(lr, x) and _below(x, got[i + 1])]
        out += mid[:1]
    return out


def _lr_for_new_b(space: Space, fit: dict, b: int) -> float:
    """The grid lr nearest the log-log interpolation (or extrapolation from the two nearest) of the fitted best lrs."""
    pb = np.array([p["batch_size"] for p in fit["points"]], float)
    plr = np.array([p["lr"] for p in fit["points"]], float)
    order = np.argsort(np.abs(np.log(pb / b)))[:2]
    x, y = np.log(pb[order]), np.log(plr[order])
    guess = y[0] if len(x) < 2 or x[0] == x[1] else y[0] + (y[1] - y[0]) / (x[1] - x[0]) * (np.log(b) - x[0])
    grid = np.array(space.lrs)
    return float(grid[int(np.argmin(np.abs(np.log(grid) - guess)))])


def _bracket_lr(runs: Runs | None, space: Space, tried: list[Trial], b: int, metric: str) -> float | None:
    """At a batch size without a fitted point: the untried grid lr next to the tried lr whose trial got lowest
    (diverged trials count as the worst), on the side away from the others (below the smallest or above the
    largest tried; an interior best: the nearer untried grid lr on either side); None when nothing is left."""
    got = _lrs_at(tried, b)
    low = _lowest_by_lr(runs, b, metric)
    best = min(low, key=low.get) if low else got[-1]
    below = [x for x in space.lrs if _below(x, best) and not any(_same_lr(x, g) for g in got)]
    above = [x for x in space.lrs if _below(best, x) and not any(_same_lr(x, g) for g in got)]
    if _same_lr(best, got[0]) and len(got) > 1:
        return below[-1] if below else None
    if _same_lr(best, got[-1]):
        return above[0] if above else (below[-1] if below else None)
    return (below[-1:] + above[:1] or [None])[0]


def _lowest_by_lr(runs: Runs | None, b: int, metric: str) -> dict[float, float]:
    """Per tried lr at b, the lowest evaluated loss of its finished trials (inf for diverged or unevaluated)."""
    if runs is None or not len(runs.trial_ids):
        return {}
    _, lowest = final_losses(runs.series(metric), len(runs.trial_ids))
    lr = runs.trials.column("lr").to_numpy().astype(float)
    out: dict[float, float] = {}
    for i in np.flatnonzero(runs.batch_size == b):
        v = np.inf if runs.status[i] == m.STATUS_DIVERGED or not np.isfinite(lowest[i]) else float(lowest[i])
        out[float(lr[i])] = min(out.get(float(lr[i]), np.inf), v)
    return out
