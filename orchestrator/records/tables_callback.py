"""The Ray Tune callback (driver side) that keeps a sweep's ``trials.parquet`` / ``metrics.parquet`` current as
results arrive, and mirrors the sweep directory to a URI storage after each compaction (orchestrator.storage.uri).
(orchestrator.records.runs_tables writes them; that module needs no Ray, so a process without Ray can write a
sweep directory too, e.g. a script on a device whose image has no Ray)."""

from __future__ import annotations

import time

from ray.tune import Callback

from analysis.core import metrics as M
from orchestrator.records.runs_tables import SPAN_COLUMNS, RunsTables, trial_row
from orchestrator.storage.layout import PARTS
from orchestrator.storage.uri import Mirror


class TablesCallback(Callback):
    """Ray Tune callback (driver side) that keeps the two tables current as results arrive."""

    def __init__(self, sweep_dir: str, compact_every_s: float = 10.0, storage_uri: str | None = None):
        self.sweep_dir = sweep_dir
        self.compact_every_s = compact_every_s
        self.storage_uri = storage_uri  # a URI sweep: the sweep dir is mirrored there after each compaction
        self._tables: RunsTables | None = None
        self._mirror = None
        self._started: dict[str, float] = {}  # trial id -> when this driver started it (Unix seconds)
        self._driver_started = time.time()  # which driver: a resumed sweep's trials carry the later one's

    def _compact(self, min_interval_s: float = 0.0) -> None:
        if self.tables.compact(min_interval_s) is not None and self.storage_uri:
            self.mirror()

    def _the_mirror(self):
        """The sweep dir's mirror at ``<storage_uri>/bcrit/`` (orchestrator.storage.uri), made once."""
        if self._mirror is None:
            self._mirror = Mirror(self.storage_uri, self.sweep_dir)
        return self._mirror

    def mirror(self) -> None:
        """Push the sweep dir to ``<storage_uri>/bcrit/`` (orchestrator.storage.uri)."""
        try:
            self._the_mirror().push()
        except OSError as e:  # a storage hiccup must not stop the sweep: the next push (and the last) retries
            print(f"[bcrit] mirroring to {self.storage_uri} failed, retried at the next compaction: {e}")

    def forget(self, trial_ids: list[str]) -> None:
        """Remove trials from the tables (orchestrator.records.lost_trials), and from the URI's mirror of them."""
        self.tables.drop(trial_ids)
        if self.storage_uri:
            for tid in trial_ids:  # else a pull on another machine would bring them back
                self._the_mirror().remove(f"{PARTS}/{tid}/")
        self._compact()

    @property
    def tables(self) -> RunsTables:
        if self._tables is None:
            self._tables = RunsTables(self.sweep_dir)
        return self._tables

    def _write(self, trial, status: str, result: dict | None = None) -> None:
        """The trial's row with its span: ``started_at`` / ``ended_at`` on the driver's clock (Unix seconds; None
        where this driver did not see it, or while it runs) and ``driver_started_at``: the slots' real occupancy,
        Ray's and the driver's time per trial included, which ``--dry-run --throughput-from`` measures against the
        trials' own seconds (orchestrator.execution.plan.overhead)."""
        ended = time.time() if status != M.STATUS_RUNNING else None
        span = (self._started.get(trial.trial_id), ended, self._driver_started)
        row = trial_row(trial.trial_id, trial.config["trial"], status, result)
        self.tables.write_trial({**row, **dict(zip(SPAN_COLUMNS, span, strict=True))})

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        if self.tables.trial_status(trial.trial_id) in M.FINAL_STATUSES:
            return
        self._started[trial.trial_id] = time.time()
        self._write(trial, M.STATUS_RUNNING)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.tables.add_rows(trial.trial_id, result.get("rows") or [])
        status = result.get("status", M.STATUS_RUNNING)
        if status != M.STATUS_RUNNING:
            self._write(trial, status, result)
            self._compact()
        else:
            self._compact(self.compact_every_s)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._write(trial, M.STATUS_FAILED, trial.last_result or {})
        self._compact()

    def on_experiment_end(self, trials, **info) -> None:
        self._compact()


class StripRows(Callback):
    """The last bcrit callback: removes the ``rows`` payload from each result once tracking and tables have it,
    so Tune's own result files (``result.json``, ``progress.csv``, TensorBoard) and experiment state hold only
    the scalars. Tune passes the same result dict to every callback and then keeps it as ``trial.last_result``."""

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        result.pop("rows", None)
