"""Which B_crit to trust: the per-point and per-target checks behind the flags of :mod:`analysis.fits.flags`.

A fitted point (the best setting of a batch size) is flagged ``lr_at_edge`` when its lr is the smallest or largest
tried at that batch size (diverged trials count as tried), ``coarse_steps`` when it reaches the target within fewer
than ``COARSE_MIN_INTERVALS`` evaluation intervals (median over its seeds), and ``near_floor`` when its seeds' loss,
around their crossing, scatters so much relative to its descent (:func:`analysis.fits.steps.crossing_jitter`) that
``NEAR_FLOOR_Z`` x scatter spans more than ``NEAR_FLOOR_FRAC`` of the crossing step (median over seeds), and
``lr_at_divergence`` when a neighbour of its lr diverged and its interpolated optimum lies towards it, faster by more
than ``LR_DIVERGENCE_GAP`` and ``LR_DIVERGENCE_FRAC`` of the interval's log half-width (:mod:`analysis.fits.lr_grid`).
The headline takes only targets without flags.
"""

from __future__ import annotations

import numpy as np

from analysis.core import metrics as m
from analysis.fits import flags as fl
from analysis.fits.steps import crossing_jitter
from analysis.sources.loaders import Runs


class PointChecks:
    """The per-point checks of :func:`analysis.fits.sweep_fit.analyze_metric`: a fitted point's flags, why a batch size
    is
    censored. Holds what they need: the runs, the metric's series, the settings, each trial's extent."""

    def __init__(self, runs: Runs, series, st, last: np.ndarray, spacing: np.ndarray):
        self.runs, self.series, self.st, self.last, self.spacing = runs, series, st, last, spacing
        n = len(runs.trial_ids)
        self.rows = np.zeros((n, 2), dtype=np.int64)
        if len(series.trial):
            starts = np.flatnonzero(np.r_[True, series.trial[1:] != series.trial[:-1]])
            ends = np.append(starts[1:], len(series.trial))
            self.rows[series.trial[starts]] = np.stack([starts, ends], axis=1)
        lr = runs.trials.column("lr").to_numpy()
        # every learning rate tried per batch size (diverged and failed trials included), and those at which every
        # trial diverged
        self.tried = {int(b): np.unique(lr[runs.batch_size == b]) for b in np.unique(runs.batch_size)}
        self.diverged = {b: np.array([q for q in t if _all_diverged(runs, lr, b, q)]) for b, t in self.tried.items()}
        self.lr_range = {b: (t[0], t[-1]) for b, t in self.tried.items()}

    def point(self, i: int, best, steps: np.ndarray, ref_steps: float, ref_lr: float, gap: float = 0.0,
              gap_limit: float = fl.LR_DIVERGENCE_GAP) -> dict:  # fmt: skip
        """One fitted point: the best setting of batch size ``best.batch_sizes[i]`` and its flags. ``gap``: the log
        steps it loses to its learning-rate optimum past a diverged neighbour (analysis.fits.lr_grid), flagged above
        ``gap_limit``."""
        k = int(best.setting[i])
        members = self.st.members[k]
        b, value = int(best.batch_sizes[i]), float(best.steps[i])
        rep = members[int(np.argmin(np.abs(np.log(steps[members] / value))))]  # the seed closest to the mean
        flags = []
        lo, hi = self.lr_range[b]
        lr = float(self.st.lr[k])
        if lr <= lo * (1 + 1e-9) or lr >= hi * (1 - 1e-9):
            flags.append(fl.LR_AT_EDGE)
        if gap > gap_limit:
            flags.append(fl.LR_AT_DIVERGENCE)
        if value < fl.COARSE_MIN_INTERVALS * _median(self.spacing[members]):
            flags.append(fl.COARSE_STEPS)
        jitter = [crossing_jitter(self.series, self.rows[r], steps[r]) for r in members]
        if fl.NEAR_FLOOR_Z * _median(jitter) > fl.NEAR_FLOOR_FRAC:  # too few evaluations to tell: not flagged
            flags.append(fl.NEAR_FLOOR)
        return {
            "batch_size": b,
            "steps": value,
            "trial_id": self.runs.trial_ids[rep],
            "trial_ids": [self.runs.trial_ids[r] for r in members],
            "lr": lr,
            "seeds": len(members),
            "steps_refined": float(ref_steps),
            "lr_refined": float(ref_lr),
            "divergence_gap": float(gap),
            "flags": flags,
        }

    def censored_reason(self, i: int, best, steps: np.ndarray) -> dict:
        """Why batch size ``best.batch_sizes[i]`` is censored: the setting that might have been faster."""
        k = int(best.blocker[i])
        members = self.st.members[k]
        short = [r for r in members if not np.isfinite(steps[r])]
        status = sorted({str(self.runs.status[r]) for r in short})
        far = ", ".join(f"{self.last[r]:g}" for r in short)
        reason = (
            f"lr={self.st.lr[k]:g}: {len(short)} of {len(members)} seed(s) stopped at step {far} "
            f"({', '.join(status)}) without reaching the target, below the best known {best.candidate[i]:.4g} "
            f"steps (lr={self.st.lr[best.setting[i]]:g})"
        )
        return {"batch_size": int(best.batch_sizes[i]), "steps_at_most": float(best.candidate[i]), "reason": reason}

    def stopped_unreached(self, best, ok: np.ndarray) -> list[dict]:
        """The batch sizes no setting reached where a trial was stopped behind (``stopping.behind``): it might have
        reached the target had it run on (below its comparator's level in a timestep bin, say), so the batch size
        counts as censored, as it would had that trial run to its budget, not as unreached."""
        out = []
        behind = ok & (self.runs.status == m.STATUS_BEHIND)
        for b, k in zip(best.batch_sizes, best.setting, strict=True):
            if k < 0 and (behind & (self.runs.batch_size == b)).any():
                why = "no setting reached the target; a trial stopped behind its batch size's best might have"
                out.append({"batch_size": int(b), "steps_at_most": None, "reason": why})
        return out


def _all_diverged(runs: Runs, lrs: np.ndarray, b: int, lr: float) -> bool:
    """Whether every trial at batch size ``b`` and learning rate ``lr`` diverged (``lrs``: the trials' lr column)."""
    sel = (runs.batch_size == b) & np.isclose(lrs, lr, rtol=1e-9, atol=0.0)
    return bool(sel.any() and (runs.status[sel] == m.STATUS_DIVERGED).all())


def _median(x) -> float:
    """Median of the non-NaN values (``nan`` if none, without a warning)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else float("nan")


def headline(targets: list[dict]) -> list[dict]:
    """The targets whose B_crit is trustworthy (no flags): the only ones a summary should quote."""
    return [t for t in targets if not t.get("flags")]
