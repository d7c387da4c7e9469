"""The gradient noise scale beside B_crit (McCandlish et al. 2018, arXiv 1812.06162).

From the raw statistics a trial logs (``|G_b|^2``, ``|G_B|^2``, ``b``, ``B``; globally every step and per
timestep bin every ``gns_every`` steps) B_simple ± SE is re-smoothed offline with the live values' rule,
:func:`analysis.core.gns.window_b_simple` (means of numerator and denominator over the last ``window`` optimizer
steps, then divided; the trial's own ``gns_window`` and ``gns_window_half`` when the runs table has them), and read
off at the step where
a trial reaches a target. McCandlish et al. predict ``B_crit ≈ B_simple`` at the loss where both are measured; this
puts them side by side."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from analysis.core import gns
from analysis.core import metrics as m
from analysis.sources.loaders import Runs

_BIN_RE = re.compile(r"/bin(\d+)(?:/|$)")


@dataclass(frozen=True)
class GNSTrace:
    """Smoothed B_simple of one trial over training."""

    step: np.ndarray  # (n,) optimizer steps of the measurements
    b_simple: np.ndarray  # (n,) window mean of tr(Sigma) over window mean of |G|^2 (nan where undefined)
    se: np.ndarray  # (n,) its standard error


def gns_names(k: int | None = None) -> tuple[str, str, str, str]:
    """Metric names of ``(|G_b|^2, |G_B|^2, b, B)``, global (``k=None``) or of timestep bin ``k``."""
    if k is None:
        return (m.GNS_G2_SMALL, m.GNS_G2_BIG, m.GNS_B_SMALL, m.GNS_B_BIG)
    return tuple(m.per_bin(t, k) for t in (m.GNS_BIN_G2_SMALL, m.GNS_BIN_G2_BIG, m.GNS_BIN_B_SMALL, m.GNS_BIN_B_BIG))


def bins_in(runs: Runs, prefix: str) -> list[int]:
    """Bin indices k for which some metric ``{prefix}bin{k}...`` was reported (``bin{k}`` right after the prefix:
    ``gns/`` finds ``gns/bin3/g2``, not ``gns/adaln/bin3/...``), ascending."""
    ks = {
        int(g.group(1))
        for name in runs.metric_names()
        if name.startswith(prefix) and (g := _BIN_RE.match("/" + name[len(prefix) :]))
    }
    return sorted(ks)


def _rows(runs: Runs, name: str, row: int) -> tuple[np.ndarray, np.ndarray]:
    s = runs.series(name)
    lo, hi = np.searchsorted(s.trial, [row, row + 1])
    return s.step[lo:hi], s.value[lo:hi]


def _aligned(runs: Runs, row: int, k: int | None) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Trial ``row``'s GNS measurements (global, or bin ``k``): the steps where all four series were logged, the four
    series' values ``(|G_b|^2, |G_B|^2, b, B)`` at them, and where both ``|G|^2`` are finite (overflowed measurements
    stay out, as live)."""
    parts = [_rows(runs, name, row) for name in gns_names(k)]
    steps = parts[0][0]
    for s, _ in parts[1:]:
        steps = np.intersect1d(steps, s)
    vals = [v[np.isin(s, steps)] for s, v in parts]
    return steps, vals, np.isfinite(vals[0]) & np.isfinite(vals[1])


def window_of(runs: Runs, row: int, default: int | None = None) -> int:
    """The B_simple window (optimizer steps) of trial ``row``: its ``gns_window`` column when the runs table has a
    positive one, else ``default``, else ``analysis.core.gns.DEFAULT_WINDOW``."""
    if "gns_window" in runs.trials.column_names:
        try:
            w = int(float(runs.trials.column("gns_window")[row].as_py()))
        except (TypeError, ValueError):
            w = 0
        if w > 0:
            return w
    return default or gns.DEFAULT_WINDOW


def half_of(runs: Runs, row: int) -> bool:
    """Whether trial ``row``'s GLOBAL window never reaches back past half its steps (its ``gns_window_half``; a runs
    table without the column, i.e. trials from before the option, used the plain window: False). Per-bin windows
    always use the plain window (as live: `trainables.gns_bins`)."""
    if "gns_window_half" not in runs.trials.column_names:
        return False
    v = runs.trials.column("gns_window_half")[row].as_py()
    if isinstance(v, str):  # MLflow params arrive as strings ("True", "1.0")
        return v.strip().lower() in ("true", "1", "1.0", "yes")
    return bool(v) if v is not None and v == v else False


def b_simple_trace(runs: Runs, row: int, k: int | None = None, window: int | None = None) -> GNSTrace | None:
    """Re-smoothed B_simple ± SE of trial ``row`` (global, or bin ``k``); ``None`` without usable GNS rows.

    ``window`` is in optimizer steps (``None``: the trial's own, see ``window_of``): per-bin measurements every
    ``gns_every`` steps and global ones every step forget at the same age, as in the live values.
    """
    steps, vals, finite = _aligned(runs, row, k)
    if len(steps) == 0:
        return None
    window = window or window_of(runs, row)
    try:
        value, se = gns.window_b_simple(
            steps[finite], *(v[finite] for v in vals), window=window, half=k is None and half_of(runs, row)
        )
    except ValueError:  # e.g. b == B: one worker and no accumulation gives no second batch size
        return None
    return GNSTrace(steps[finite], value, se)


def b_simple_at(trace: GNSTrace | None, step: float) -> float:
    """B_simple interpolated at ``step`` (clamped to the measured range); ``nan`` without a trace."""
    if trace is None or not np.isfinite(step):
        return float("nan")
    ok = np.isfinite(trace.b_simple)
    if not ok.any():
        return float("nan")
    return float(np.interp(step, trace.step[ok], trace.b_simple[ok]))


def window_samples(
    runs: Runs, row: int, k: int | None, end: float, window: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-measurement unbiased ``(|G|^2, tr Sigma)`` of trial ``row`` (global, or bin ``k``) in the window that ends
    at step ``end``: steps in ``(end - span, end]`` with ``span`` the trial's live rule (``window_span``; the half
    rule for the global window only). Incomplete or non-finite measurements are left out, as in ``b_simple_trace``."""
    steps, vals, finite = _aligned(runs, row, k)
    span = int(gns.window_span(int(end), window or window_of(runs, row), half=k is None and half_of(runs, row)))
    sel = finite & (steps > end - span) & (steps <= end)
    if not sel.any():
        return np.zeros(0), np.zeros(0)
    small, big, b, B = (v[sel] for v in vals)
    try:
        return np.atleast_1d(gns.g2_unbiased(small, big, b, B)), np.atleast_1d(gns.trace_unbiased(small, big, b, B))
    except ValueError:  # b == B: no second batch size
        return np.zeros(0), np.zeros(0)


def pooled_b_simple(
    runs: Runs, points: list[dict], k: int | None = None, window: int | None = None
) -> gns.WindowEstimate:
    """B_simple ± SE at a target: per point (batch size), the raw statistics of every trial of its best setting (all
    seeds, ``trial_ids``) in the window ending at the point's crossing step pooled; then the points weighted equally
    (``gns.stratified_b_simple``: means of numerator and denominator, divided).

    One trial's window holds few measurements per bin (every ``gns_every`` steps, on ``gns_bin_examples``), so a
    median of per-trial ratios would swing with single trials' noise by large factors between sets of seeds;
    averaging numerators and denominators before dividing is McCandlish et al.'s rule and carries a standard error.
    Equal weights keep what the median over points had: every batch size of the fit counts once, not by how many
    steps its trials took."""
    row_of = {t: i for i, t in enumerate(runs.trial_ids)}
    g2, tr = [], []
    for p in points:
        if not np.isfinite(p["steps"]):
            continue
        got = [window_samples(runs, row_of[t], k, float(p["steps"]), window)
               for t in p.get("trial_ids") or [p["trial_id"]] if t in row_of]  # fmt: skip
        g2.append(np.concatenate([g for g, _ in got]) if got else np.zeros(0))
        tr.append(np.concatenate([t for _, t in got]) if got else np.zeros(0))
    return gns.stratified_b_simple(g2, tr)


def attach_b_simple(runs: Runs, targets: list[dict], k: int | None = None, window: int | None = None) -> None:
    """Add ``b_simple`` to every point (its representative trial's value at its crossing step) and to every target
    ``b_simple`` ± ``b_simple_se`` of :func:`pooled_b_simple` (``None`` where not defined).

    ``window``: the B_simple window in optimizer steps (``None``: each trial's own ``gns_window``)."""
    row_of = {t: i for i, t in enumerate(runs.trial_ids)}
    cache: dict[int, GNSTrace | None] = {}
    for tgt in targets:
        for p in tgt["points"]:
            row = row_of[p["trial_id"]]
            if row not in cache:
                cache[row] = b_simple_trace(runs, row, k, window)
            v = b_simple_at(cache[row], p["steps"])
            p["b_simple"] = None if np.isnan(v) else v
        est = pooled_b_simple(runs, tgt["points"], k, window)
        tgt["b_simple"] = est.value if est.ok else None
        tgt["b_simple_se"] = est.se if est.ok else None
