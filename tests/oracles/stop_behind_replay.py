"""A recorded sweep replayed with ``stopping.behind`` on: which trials the rule would have stopped, and when.

Every trial of the recording runs on a simulated clock (``concurrency`` at once, in the recording's order, each
taking its recorded training seconds, or its examples where none are recorded), its evaluations revealed in time
order; after each, :func:`analysis.features.stop_behind.stop_behind.behind` decides on the trials then running, as the
sweep's driver does on their reports. A trial it stops ends there (its slot goes to the next trial) with the status
``stopped_behind`` and its rows up to that step. The result is the sweep the rule would have left -- the same
trials, the stopped ones cut short -- for the analysis to compare with the full one
(tests/analysis/test_stop_behind.py). The rule itself, and the curves it reads from a sweep's tables
(``curves_from_runs``), are the product's (analysis.features.stop_behind.stop_behind).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.core import metrics as m
from analysis.features.stop_behind.stop_behind import MARGIN, Seeds, _empty_curve, _events, behind
from analysis.sources.loaders import Runs, runs_from_tables


@dataclass
class Replay:
    runs: Runs  # the sweep as the rule leaves it
    stops: dict[str, tuple[int, str]]  # trial id -> (step it stopped at, reason)
    examples_full: float
    examples_kept: float

    @property
    def examples_ratio(self) -> float:
        return self.examples_kept / self.examples_full if self.examples_full else float("nan")


def trial_examples(runs: Runs) -> np.ndarray:
    """Per trial, the examples it processed: the largest ``examples`` of its metric rows (0 without rows)."""
    ids = pc.cast(runs.metrics.column("trial_id"), pa.string()).to_pylist()
    ex = runs.metrics.column("examples").to_numpy()
    row = {t: i for i, t in enumerate(runs.trial_ids)}
    out = np.zeros(len(runs.trial_ids))
    np.maximum.at(out, np.array([row[t] for t in ids], dtype=np.int64), ex.astype(np.float64))
    return out


def _durations(runs: Runs) -> np.ndarray:
    """Per trial, its recorded training seconds; its examples where they are not all recorded."""
    if "train_seconds" in runs.trials.column_names:
        d = np.asarray(runs.trials.column("train_seconds").to_pylist(), dtype=np.float64)
        if np.isfinite(d).all() and (d > 0).all():
            return d
    return trial_examples(runs).clip(min=1.0)


def replay(runs: Runs, concurrency: int, margin: float = MARGIN, order: list[int] | None = None) -> Replay:
    """Replay ``runs`` (module docstring). ``order``: the trials' rows in the order they start (default: the
    table's)."""
    n = len(runs.trial_ids)
    per, steps = _events(runs)
    dur = _durations(runs)
    last = np.array([max(int(steps[i][-1]) if len(steps[i]) else 1, 1) for i in range(n)], dtype=np.float64)
    status = runs.status
    curves = [_empty_curve(runs, i, m.STATUS_RUNNING) for i in range(n)]
    rows = [{c: runs.trials.column(c)[i].as_py() for c in runs.trials.column_names} for i in range(n)]
    plan = Seeds.of_configs(rows)  # the seeds each setting ran: what a sweep of these trials would plan
    heap: list = []  # (time, order, trial, event index)
    pending = list(order if order is not None else range(n))[::-1]
    clock, started, running, order = 0.0, {}, set(), 0

    def start(now: float) -> None:
        nonlocal order
        while pending and len(running) < concurrency:
            i = pending.pop()
            started[i], order = now, order + 1
            running.add(i)
            if len(steps[i]) == 0:
                heapq.heappush(heap, (now, order, i, -1))
            for k, s in enumerate(steps[i]):
                heapq.heappush(heap, (now + dur[i] * s / last[i], order, i, k))

    start(0.0)
    stops: dict[str, tuple[int, str]] = {}
    while heap:
        clock, _, i, k = heapq.heappop(heap)
        if i not in running:
            continue  # stopped: its later evaluations never happen
        if k >= 0:
            s = int(steps[i][k])
            for name, v in per[i][s].items():
                curves[i].add(s, name, v)
        if k == len(steps[i]) - 1 or k < 0:
            curves[i].status = str(status[i])
            running.discard(i)
        at = {curves[i].batch_size}  # only its batch size changed
        for tid, why in behind([curves[j] for j in started], margin, at, plan).items():
            j = runs.trial_ids.index(tid)
            if j in running:
                stops[tid] = (curves[j].last_step, why)
                curves[j].status = m.STATUS_BEHIND
                running.discard(j)
        start(clock)
    kept = _cut(runs, stops)
    ex_full, ex_kept = float(trial_examples(runs).sum()), float(trial_examples(kept).sum())
    return Replay(kept, stops, ex_full, ex_kept)


def _cut(runs: Runs, stops: dict[str, tuple[int, str]]) -> Runs:
    """The tables with each stopped trial's rows after its stop removed and its row set to ``stopped_behind``."""
    if not stops:
        return runs
    met = runs.metrics
    ids = pc.cast(met.column("trial_id"), pa.string()).to_numpy(zero_copy_only=False)
    step = met.column("step").to_numpy()
    cut = np.array([stops[t][0] if t in stops else np.iinfo(np.int64).max for t in ids])
    met = met.filter(pa.array(step <= cut))
    tr = runs.trials
    tids = runs.trial_ids
    ex_at = _examples_at(met, stops)
    new = {
        "status": lambda t, v: m.STATUS_BEHIND if t in stops else v,
        "step": lambda t, v: stops[t][0] if t in stops else v,
        "examples": lambda t, v: ex_at.get(t, v) if t in stops else v,
    }
    for name, f in new.items():
        if name in tr.column_names:
            i = tr.schema.get_field_index(name)
            vals = [f(t, v) for t, v in zip(tids, tr.column(name).to_pylist(), strict=True)]
            tr = tr.set_column(i, name, pa.array(vals, tr.schema.field(name).type))
    return runs_from_tables(tr, met, source=runs.source + " (replayed, stopping.behind)")


def _examples_at(met: pa.Table, stops: dict[str, tuple[int, str]]) -> dict[str, int]:
    """Each stopped trial's examples at its stop: the largest of its remaining rows'."""
    out: dict[str, int] = {}
    ids = pc.cast(met.column("trial_id"), pa.string()).to_pylist()
    ex = met.column("examples").to_pylist()
    for t, e in zip(ids, ex, strict=True):
        if t in stops:
            out[t] = max(out.get(t, 0), int(e))
    return out
