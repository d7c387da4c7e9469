"""The Ray Tune callback (driver side) that keeps a sweep's ``trials.parquet`` / ``metrics.parquet`` current as
results arrive (orchestrator.tables writes them; that module needs no Ray, so a process without Ray can write a
sweep directory too, e.g. benchmarks/gpu_study.py on a device whose image has no Ray)."""

from __future__ import annotations

from ray.tune import Callback

from analysis.core import metrics as M
from orchestrator.tables import RunsTables, trial_row


class TablesCallback(Callback):
    """Ray Tune callback (driver side) that keeps the two tables current as results arrive."""

    def __init__(self, sweep_dir: str, compact_every_s: float = 10.0):
        self.sweep_dir = sweep_dir
        self.compact_every_s = compact_every_s
        self._tables: RunsTables | None = None

    @property
    def tables(self) -> RunsTables:
        if self._tables is None:
            self._tables = RunsTables(self.sweep_dir)
        return self._tables

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        if self.tables.trial_status(trial.trial_id) in M.FINAL_STATUSES:
            return
        self.tables.write_trial(trial_row(trial.trial_id, trial.config["trial"], M.STATUS_RUNNING))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.tables.add_rows(trial.trial_id, result.get("rows") or [])
        status = result.get("status", M.STATUS_RUNNING)
        if status != M.STATUS_RUNNING:
            self.tables.write_trial(trial_row(trial.trial_id, trial.config["trial"], status, result))
            self.tables.compact()
        else:
            self.tables.compact(self.compact_every_s)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        last = trial.last_result or {}
        self.tables.write_trial(trial_row(trial.trial_id, trial.config["trial"], M.STATUS_FAILED, last))
        self.tables.compact()

    def on_experiment_end(self, trials, **info) -> None:
        self.tables.compact()
