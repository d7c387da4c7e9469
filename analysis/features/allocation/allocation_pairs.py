"""Sampler vs uniform measured in pairs (docs/allocation.md): a sweep that crosses ``timestep_sampling`` with the
seeds and the nuisance settings runs, for each uniform trial, a trial of every other sampler with the same batch size,
seed, lr (and the other :data:`analysis.sources.schema.NUISANCE_COLUMNS` and the split). The ratio of their
steps-to-target is a paired measurement of ``S_sampler / S_uniform`` that needs no Pareto fit, so it holds on a sweep
of one or two batch sizes (the fit needs three).

Per batch size: the mean of the pairs' ratios and its standard error ``std(ddof=1) / sqrt(n)`` (pairs where either
trial never reached the target, diverged or failed are left out and counted).
"""

from __future__ import annotations

import math

import numpy as np

from analysis.core import metrics as M
from analysis.fits.steps import steps_to_target, usable
from analysis.sources.loaders import Runs
from analysis.sources.schema import NUISANCE_COLUMNS

PAIR_COLUMNS = ("batch_size", "seed", "micro_batch_size", "grad_accum", "num_workers", *NUISANCE_COLUMNS)


def _keys(runs: Runs) -> list[tuple]:
    cols = [c for c in PAIR_COLUMNS if c in runs.trials.column_names]
    values = [runs.trials.column(c).to_pylist() for c in cols]
    return [tuple(v[i] for v in values) for i in range(len(runs.trial_ids))]


def paired_ratios(runs: Runs, samplers: np.ndarray, target: float, base: str) -> list[dict]:
    """Rows ``{"sampler", "batch_size", "measured", "measured_se", "pairs", "unpaired"}``: per sampler other than
    ``base`` and per batch size, the mean ± SE of ``steps(sampler) / steps(base)`` over the pairs of trials that share
    every :data:`PAIR_COLUMNS` value and both reached ``target``. ``unpaired``: the pairs left out (not reached)."""
    steps = steps_to_target(runs.series(M.EVAL_LOSS), len(runs.trial_ids), [target])[0]
    ok = usable(runs) & np.isfinite(steps) & (steps > 0)
    keys = _keys(runs)
    base_of = {keys[i]: i for i in np.flatnonzero(samplers == base)}
    rows = []
    for name in sorted(set(samplers) - {base}):
        by_b: dict[int, list[float]] = {}
        missed: dict[int, int] = {}
        for i in np.flatnonzero(samplers == name):
            j = base_of.get(keys[i])
            if j is None:
                continue
            b = int(runs.batch_size[i])
            if ok[i] and ok[j]:
                by_b.setdefault(b, []).append(float(steps[i] / steps[j]))
            else:
                missed[b] = missed.get(b, 0) + 1
        for b in sorted(set(by_b) | set(missed)):
            r = np.array(by_b.get(b, []))
            mean = float(r.mean()) if len(r) else float("nan")
            se = float(r.std(ddof=1) / math.sqrt(len(r))) if len(r) >= 2 else float("nan")
            rows.append({"sampler": name, "batch_size": b, "measured": mean, "measured_se": se, "pairs": len(r),
                         "unpaired": missed.get(b, 0)})  # fmt: skip
    return [r for r in rows if r["pairs"]]


def reached_by_all(runs: Runs) -> float | None:
    """The lowest loss every usable trial reached (the largest of the trials' lowest ``eval/loss``), rounded up to 4
    significant digits; None when that is not below the median first evaluation (the trials barely trained)."""
    s = runs.series(M.EVAL_LOSS)
    keep = usable(runs)[s.trial] & np.isfinite(s.value)
    t, v = s.trial[keep], s.value[keep]
    if not len(t):
        return None
    trials = np.unique(t)
    lowest = np.array([v[t == i].min() for i in trials])
    first = np.array([v[t == i][0] for i in trials])
    top = float(lowest.max())
    if not top < float(np.median(first)) or top <= 0:
        return None
    digits = 3 - math.floor(math.log10(top))
    up = math.ceil(top * 10**digits) / 10**digits
    return up if up < float(np.median(first)) else top
