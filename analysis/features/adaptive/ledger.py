"""What the sweep has spent: the trials tried, their seeds per setting, their examples, a trial's expected cost."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.core import metrics as m
from analysis.features.adaptive.decision import Space, Trial, _same_lr
from analysis.sources.loaders import Runs, runs_subset


def spent_examples(runs: Runs) -> np.ndarray:
    """Examples each trial of ``runs`` processed (its largest reported ``examples``; 0 without rows)."""
    out = np.zeros(len(runs.trial_ids))
    if runs.metrics.num_rows == 0:
        return out
    g = runs.metrics.group_by("trial_id").aggregate([("examples", "max")])
    row = {t: i for i, t in enumerate(runs.trial_ids)}
    for t, e in zip(g.column("trial_id").to_pylist(), g.column("examples_max").to_pylist(), strict=True):
        if t in row and e is not None:
            out[row[t]] = float(e)
    return out


def _not_ended(runs: Runs | None, spent: np.ndarray) -> tuple[Runs | None, np.ndarray]:
    """``runs`` without the trials a stop on the goal ended (``ended_at_goal``; None when none is left), and
    ``spent`` (:func:`spent_examples` of ``runs``) of the trials kept."""
    if runs is None:
        return None, spent
    keep = runs.status != m.STATUS_ENDED
    if keep.all():
        return runs, spent
    if not keep.any():
        return None, spent[keep]
    return runs_subset(runs, [t for t, k in zip(runs.trial_ids, keep, strict=True) if k]), spent[keep]


def _tried(runs: Runs | None, pending: list[Trial]) -> list[Trial]:
    out = list(pending)
    if runs is not None and len(runs.trial_ids):
        lr = runs.trials.column("lr").to_numpy().astype(float)
        seed = pc.cast(runs.trials.column("seed"), pa.int64()).to_numpy()
        out += [Trial(int(b), float(x), int(s)) for b, x, s in zip(runs.batch_size, lr, seed, strict=True)]
    return out


def _seeds_at(trials: list[Trial], b: int, lr: float) -> list[Trial]:
    """The trials of ``trials`` at the setting ``(b, lr)``: its seeds."""
    return [t for t in trials if t.batch_size == b and _same_lr(t.lr, lr)]


def _next_seed(tried: list[Trial], b: int, lr: float) -> int:
    used = {t.seed for t in _seeds_at(tried, b, lr)}
    return next(s for s in range(len(used) + 1) if s not in used)


class _Cost:
    """Expected examples of a trial at batch size b: the mean of the trials there, else ``B · S(B)`` from the
    hardest target's fit scaled by the measured ratio of examples to ``B · S(B)``, else the mean trial's."""

    def __init__(self, runs: Runs | None, spent: np.ndarray, space: Space):
        self.by_b: dict[int, float] = {}
        self.mean = float(np.mean(spent[spent > 0])) if np.any(spent > 0) else 1.0
        self.runs, self.spent = runs, spent
        if runs is not None:
            for b in np.unique(runs.batch_size):
                e = spent[(runs.batch_size == b) & (spent > 0)]
                if len(e):
                    self.by_b[int(b)] = float(np.mean(e))

    def of(self, b: int, fits: list[dict]) -> float:
        if b in self.by_b:
            return self.by_b[b]
        if not fits:
            return self.mean
        f = max(fits, key=lambda f: f["s_min"] + f["e_min"] / b)  # the hardest target sets the trial's length
        ratio = [self.by_b[p["batch_size"]] / (p["batch_size"] * p["steps"]) for p in f["points"]
                 if p["batch_size"] in self.by_b]  # fmt: skip
        return float(b * (f["s_min"] + f["e_min"] / b) * (np.median(ratio) if ratio else 1.0))
