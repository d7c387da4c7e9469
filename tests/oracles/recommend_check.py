"""Is a recommendation right? Measured time-to-target per split, and held-out splits predicted from the rest (a
check of ``bcrit recommend``'s predictions, used by tests/analysis/test_recommend.py and benchmarks/bench_recommend.py).

- :func:`measured_times`: for every split ``(micro, A, W)`` of a sweep, its best learning-rate setting's steps to
  the target (geometric mean over seeds, as :mod:`analysis.fits.steps`) and its *measured* training seconds to the
  target
  (``metrics.parquet``'s ``wall_time`` interpolated at each seed's crossing step, geometric mean over the seeds).
- :func:`holdout`: drop one split's trials from the sweep, fit steps and step times on the rest, predict that
  split's time-to-target (:func:`analysis.features.recommend.recommend.plan`) and Pollux's
  (:func:`analysis.features.recommend.recommend.pollux_times`),
  and set both beside what was measured.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.features.recommend import recommend, throughput
from analysis.fits import pareto
from analysis.fits.steps import aggregate_seeds, settings_of, steps_to_target, trial_extent, usable
from analysis.sources.loaders import Runs, runs_from_tables


def seconds_at(runs: Runs, metric: str, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Training seconds (``wall_time``) of trials ``rows`` at (fractional) ``steps``, interpolated between the
    ``metric``'s rows; ``nan`` without a ``wall_time`` column or rows."""
    out = np.full(len(rows), np.nan)
    if "wall_time" not in runs.metrics.column_names:
        return out
    t = runs.metrics.filter(pc.equal(runs.metrics.column("metric"), metric))
    ids = pc.cast(t.column("trial_id"), pa.string()).to_numpy(zero_copy_only=False)
    st, wt = t.column("step").to_numpy().astype(np.float64), t.column("wall_time").to_numpy()
    for j, (r, s) in enumerate(zip(rows, steps, strict=True)):
        sel = ids == runs.trial_ids[int(r)]
        ok = sel & np.isfinite(wt)
        if ok.sum() >= 2 and np.isfinite(s):
            order = np.argsort(st[ok])
            out[j] = float(np.interp(s, st[ok][order], wt[ok][order]))
    return out


def measured_times(runs: Runs, metric: str, target: float) -> dict[tuple[int, int, int], dict]:
    """Per split: ``{"steps", "seconds", "lr", "seeds"}`` of its best setting that reached the target."""
    n = len(runs.trial_ids)
    ok = usable(runs)
    steps = steps_to_target(runs.series(metric), n, [target])[0]
    steps[~ok] = np.nan
    last, _ = trial_extent(runs.series(metric), n)
    st = settings_of(runs, ok)
    val, _low = aggregate_seeds(steps, last, st)
    sp = throughput.split_columns(runs)
    out: dict[tuple[int, int, int], dict] = {}
    for k, members in enumerate(st.members):
        key = tuple(int(x) for x in sp[members[0]])
        if not np.isfinite(val[k]) or (key in out and out[key]["steps"] <= val[k]):
            continue
        sec = seconds_at(runs, metric, members, steps[members])
        out[key] = {
            "steps": float(val[k]),
            "seconds": float(np.exp(np.mean(np.log(sec)))) if np.isfinite(sec).all() else float("nan"),
            "lr": float(st.lr[k]),
            "seeds": len(members),
        }
    return out


def without_split(runs: Runs, split: tuple[int, int, int]) -> Runs:
    """The sweep without the trials of ``split``."""
    keep = ~(throughput.split_columns(runs) == np.asarray(split)).all(axis=1)
    trials = runs.trials.filter(pa.array(keep))
    kept = pa.array([t for t, k in zip(runs.trial_ids, keep, strict=True) if k], pa.string())
    ids = pc.cast(runs.metrics.column("trial_id"), pa.string())  # plain strings: a dictionary keeps dropped ids
    metrics = runs.metrics.set_column(runs.metrics.schema.get_field_index("trial_id"), "trial_id", ids)
    metrics = metrics.filter(pc.is_in(ids, value_set=kept))
    return runs_from_tables(trials, metrics, source=f"{runs.source} without {split}")


def holdout(runs: Runs, metric: str, target: float, split, n_boot: int = 400, seed: int = 0) -> dict:
    """Predict held-out ``split``'s time-to-target from the rest of the sweep; beside it what was measured."""
    split = tuple(int(x) for x in split)
    measured = measured_times(runs, metric, target).get(split)
    rest = without_split(runs, split)
    row = {"split": list(split), "measured": measured}
    try:
        fit = recommend.fit_steps(rest, metric, target, n_boot, seed)
    except pareto.TooFewBatchSizesError as e:
        return {**row, "error": str(e)}
    times = throughput.measured_splits(rest)
    try:
        p = recommend.plan(fit, times, np.array([split]), metric=metric, seed=seed)
    except recommend.RecommendError as e:
        return {**row, "error": str(e)}
    row.update(
        predicted_s=float(p.time_s[0]), predicted_ci=[float(x) for x in p.time_ci[0]], steps=float(p.steps[0]),
        step_s=float(p.step_s[0]), extrapolated=p.extrapolated[0],
    )  # fmt: skip
    bs = recommend.b_simple_at_target(rest, metric, target)
    if bs is not None:
        row["pollux_s"] = float(recommend.pollux_times(fit, bs, np.array([np.prod(split)]), p.step_s[:1])[0])
        row["b_simple"] = float(bs)
    return row
