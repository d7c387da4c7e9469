"""The gradient noise scale beside B_crit (McCandlish et al. 2018, arXiv 1812.06162).

From the raw statistics a trial logs (``|G_b|^2``, ``|G_B|^2``, ``b``, ``B``; globally every step and per
timestep bin every ``gns_every`` steps) B_simple is re-smoothed offline with :func:`analysis.gns.ema_b_simple`
(numerator and denominator smoothed separately, then divided) and read off at the step where a trial
reaches a target. McCandlish et al. predict ``B_crit ≈ B_simple`` at the loss where both are measured; this
puts them side by side."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from analysis import gns
from analysis import metrics as m
from analysis.loaders import Runs

_BIN_RE = re.compile(r"/bin(\d+)(?:/|$)")


@dataclass(frozen=True)
class GNSTrace:
    """Smoothed B_simple of one trial over training."""

    step: np.ndarray  # (n,) optimizer steps of the measurements
    b_simple: np.ndarray  # (n,) bias-corrected EMA of tr(Sigma) over EMA of |G|^2


def gns_names(k: int | None = None) -> tuple[str, str, str, str]:
    """Metric names of ``(|G_b|^2, |G_B|^2, b, B)``, global (``k=None``) or of timestep bin ``k``."""
    if k is None:
        return (m.GNS_G2_SMALL, m.GNS_G2_BIG, m.GNS_B_SMALL, m.GNS_B_BIG)
    return tuple(m.per_bin(t, k) for t in (m.GNS_BIN_G2_SMALL, m.GNS_BIN_G2_BIG, m.GNS_BIN_B_SMALL, m.GNS_BIN_B_BIG))


def bins_in(runs: Runs, prefix: str) -> list[int]:
    """Bin indices k for which some metric ``{prefix}/bin{k}...`` was reported, ascending."""
    ks = {int(g.group(1)) for name in runs.metric_names() if name.startswith(prefix) and (g := _BIN_RE.search(name))}
    return sorted(ks)


def _rows(runs: Runs, name: str, row: int) -> tuple[np.ndarray, np.ndarray]:
    s = runs.series(name)
    lo, hi = np.searchsorted(s.trial, [row, row + 1])
    return s.step[lo:hi], s.value[lo:hi]


def b_simple_trace(runs: Runs, row: int, k: int | None = None, beta: float = 0.99) -> GNSTrace | None:
    """Re-smoothed B_simple of trial ``row`` (global, or bin ``k``); ``None`` without usable GNS rows.

    ``beta`` is the EMA decay *per optimizer step*; measurements ``g`` steps apart use ``beta**g`` so that the
    global (every step) and per-bin (every ``gns_every`` steps) traces have the same time constant.
    """
    parts = [_rows(runs, name, row) for name in gns_names(k)]
    steps = parts[0][0]
    for s, _ in parts[1:]:
        steps = np.intersect1d(steps, s)
    if len(steps) == 0:
        return None
    vals = [v[np.isin(s, steps)] for s, v in parts]
    gap = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
    try:
        smooth = gns.ema_b_simple(*vals, beta=beta**gap)
    except ValueError:  # e.g. b == B: one worker and no accumulation gives no second batch size
        return None
    return GNSTrace(steps, np.asarray(smooth, dtype=np.float64))


def b_simple_at(trace: GNSTrace | None, step: float) -> float:
    """B_simple interpolated at ``step`` (clamped to the measured range); ``nan`` without a trace."""
    if trace is None or not np.isfinite(step):
        return float("nan")
    ok = np.isfinite(trace.b_simple)
    if not ok.any():
        return float("nan")
    return float(np.interp(step, trace.step[ok], trace.b_simple[ok]))


def attach_b_simple(runs: Runs, targets: list[dict], k: int | None = None, beta: float = 0.99) -> None:
    """Add ``b_simple`` to every point (at its crossing step) and the median over points to every target."""
    row_of = {t: i for i, t in enumerate(runs.trial_ids)}
    cache: dict[int, GNSTrace | None] = {}
    for tgt in targets:
        vals = []
        for p in tgt["points"]:
            row = row_of[p["trial_id"]]
            if row not in cache:
                cache[row] = b_simple_trace(runs, row, k, beta)
            v = b_simple_at(cache[row], p["steps"])
            p["b_simple"] = None if np.isnan(v) else v
            if not np.isnan(v):
                vals.append(v)
        tgt["b_simple"] = float(np.median(vals)) if vals else None
