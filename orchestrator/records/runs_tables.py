"""``trials.parquet`` and ``metrics.parquet`` of a sweep (schema: analysis.sources.schema), written as results arrive.

Every Tune result becomes a small part file, written atomically (temporary name, then ``os.replace``), under
``<sweep_dir>/parts/<trial_id>/``: ``trial.parquet`` (the trial's row, rewritten when its status changes) and
``m-<last step>.parquet`` (the new metric rows of that result). A killed driver loses nothing already written.
The per-trial watermark (max step written) comes from the part names, so rows that a resumed trial re-emits
(steps after its last checkpoint) are dropped, never duplicated. `RunsTables.compact` joins the parts into the
two files, sorted by ``(trial_id, step, metric)`` and validated with analysis.sources.schema's validators.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.core import metrics as M
from analysis.sources.schema import (
    BRANCH_STEP,
    METRICS_FILE,
    METRICS_SCHEMA_WITH_WALL_TIME,
    PARENT,
    TRIALS_FILE,
    TRIALS_SCHEMA,
    K,
    validate_metrics,
    validate_trials,
)
from orchestrator.storage.layout import PARTS

# trial-config keys copied into trials.parquet besides the schema's (nuisance values and budget)
EXTRA_PARAMS = ("warmup_steps", "beta2", "weight_decay", "max_steps", "target_loss", "gns_window", "gns_window_half")
EXTRA_RESULTS = (M.STEP, M.EXAMPLES, "train_seconds", "startup_seconds")
# when the sweep's driver started and ended the trial, and when that driver started (Unix seconds on its clock;
# orchestrator.records.tables_callback): what ``--dry-run --throughput-from`` measures Ray's time per trial from
SPAN_COLUMNS = ("started_at", "ended_at", "driver_started_at")


def trial_row(trial_id: str, cfg: dict, status: str, result: dict | None = None) -> dict[str, Any]:
    """One ``trials.parquet`` row from a trial-config dict (+ the latest result for the counters)."""
    w = max(1, int(cfg.get("num_workers", 0)))
    b, micro = int(cfg["batch_size"]), int(cfg["micro_batch_size"])
    row: dict[str, Any] = {
        "trial_id": trial_id,
        "batch_size": b,
        "micro_batch_size": micro,
        "grad_accum": int(cfg.get("grad_accum") or b // (micro * w)),
        "num_workers": w,  # world size: an in-process trial (num_workers 0) is one worker
        "lr": float(cfg["lr"]),
        "seed": int(cfg.get("seed", 0)),
        "status": status,
        "in_process": int(cfg.get("num_workers", 0)) == 0,
    }
    for k in EXTRA_PARAMS:
        v = cfg.get(k)
        row[k] = None if v is None else float(v)
    for k in EXTRA_RESULTS:
        v = (result or {}).get(k)
        row[k] = None if v is None else float(v)
    if cfg.get("batch_schedule"):  # a scheduled trial (analysis.core.stages): its stages as JSON text; absent otherwise
        row["batch_schedule"] = json.dumps(cfg["batch_schedule"])
    if (result or {}).get(M.STOP_REASON):  # stopping.behind's why (orchestrator.features.stop_behind.behind_callback)
        row[M.STOP_REASON] = str(result[M.STOP_REASON])
    if "timestep_sampling" in cfg:  # a scientific variable when a sweep compares samplers (docs/allocation.md)
        row["timestep_sampling"] = str(cfg["timestep_sampling"])
    tags = cfg.get("extra") or {}
    if tags.get(PARENT):  # a branch of a branched study (orchestrator.features.branched.branch_study)
        row.update({PARENT: str(tags[PARENT]), BRANCH_STEP: int(tags[BRANCH_STEP]), K: float(tags[K])})
    return row


def _write_atomic(table: pa.Table, path: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(table, tmp)
    os.replace(tmp, path)


class RunsTables:
    """Part files + watermarks of one sweep directory."""

    def __init__(self, sweep_dir: str):
        self.sweep_dir = os.path.abspath(sweep_dir)
        self.parts = os.path.join(self.sweep_dir, PARTS)
        os.makedirs(self.parts, exist_ok=True)
        self._watermarks: dict[str, int] = {}
        for path in glob.glob(os.path.join(self.parts, "*", "m-*.parquet")):
            tid = os.path.basename(os.path.dirname(path))
            step = int(os.path.basename(path)[2:-8])
            self._watermarks[tid] = max(step, self._watermarks.get(tid, -1))
        self._last_compact = 0.0

    def watermark(self, trial_id: str) -> int:
        """The largest step already written for the trial (-1: none)."""
        return self._watermarks.get(trial_id, -1)

    def write_trial(self, row: dict[str, Any]) -> None:
        d = os.path.join(self.parts, row["trial_id"])
        os.makedirs(d, exist_ok=True)
        _write_atomic(pa.Table.from_pylist([row]), os.path.join(d, "trial.parquet"))

    def trial_status(self, trial_id: str) -> str | None:
        path = os.path.join(self.parts, trial_id, "trial.parquet")
        if not os.path.exists(path):
            return None
        return pq.read_table(path, columns=["status"]).column("status")[0].as_py()

    def unfinished(self) -> list[str]:
        """The trials whose parts hold no final status (still "running", or no row yet), sorted."""
        ids = sorted(os.path.basename(d) for d in glob.glob(os.path.join(self.parts, "*")) if os.path.isdir(d))
        return [tid for tid in ids if self.trial_status(tid) not in M.FINAL_STATUSES]

    def drop(self, trial_ids: list[str]) -> None:
        """Remove the trials' parts (their row and metric rows): the next `compact` leaves them out."""
        for tid in trial_ids:
            shutil.rmtree(os.path.join(self.parts, tid), ignore_errors=True)
            self._watermarks.pop(tid, None)

    def add_rows(self, trial_id: str, rows: list) -> int:
        """Write the rows ``[step, examples, metric, value, wall_time(, unix_time)]`` past the watermark; returns
        how many (``unix_time`` is MLflow's, not a column here)."""
        mark = self.watermark(trial_id)
        new = [r for r in rows if int(r[0]) > mark]
        if not new:
            return 0
        last = max(int(r[0]) for r in new)
        cols = list(zip(*(r[:5] for r in new), strict=True))
        table = pa.table(
            {
                "trial_id": [trial_id] * len(new),
                "step": pa.array(cols[0], pa.int64()),
                "examples": pa.array(cols[1], pa.int64()),
                "metric": pa.array(cols[2], pa.string()),
                "value": pa.array(cols[3], pa.float64()),
                "wall_time": pa.array(cols[4], pa.float64()),
            },
            schema=METRICS_SCHEMA_WITH_WALL_TIME,
        )
        d = os.path.join(self.parts, trial_id)
        os.makedirs(d, exist_ok=True)
        _write_atomic(table, os.path.join(d, f"m-{last:010d}.parquet"))
        self._watermarks[trial_id] = last
        return len(new)

    def compact(self, min_interval_s: float = 0.0) -> tuple[int, int] | None:
        """Join the parts into ``trials.parquet`` / ``metrics.parquet`` (validated). Skipped (None) when the
        last compaction is more recent than ``min_interval_s``. Returns (trials, metric rows)."""
        now = time.monotonic()
        if min_interval_s and now - self._last_compact < min_interval_s:
            return None
        self._last_compact = now
        trial_files = sorted(glob.glob(os.path.join(self.parts, "*", "trial.parquet")))
        if trial_files:
            trials = pa.concat_tables([pq.read_table(p) for p in trial_files], promote_options="permissive")
        else:
            trials = TRIALS_SCHEMA.empty_table()
        trials = validate_trials(trials.sort_by("trial_id"))
        metric_files = sorted(glob.glob(os.path.join(self.parts, "*", "m-*.parquet")))
        if metric_files:
            metrics = pa.concat_tables([pq.read_table(p) for p in metric_files])
            metrics = metrics.sort_by([("trial_id", "ascending"), ("step", "ascending"), ("metric", "ascending")])
        else:
            metrics = METRICS_SCHEMA_WITH_WALL_TIME.empty_table()
        metrics = validate_metrics(metrics, trials.column("trial_id"))
        _write_atomic(trials, os.path.join(self.sweep_dir, TRIALS_FILE))
        _write_atomic(metrics, os.path.join(self.sweep_dir, METRICS_FILE))
        return trials.num_rows, metrics.num_rows
