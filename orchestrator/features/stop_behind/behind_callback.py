"""``stopping.behind``, driver side: a Ray Tune callback that stops the trials the fit only needs to know are slower.

It keeps every trial's evaluations of the fitted metrics (from each result's ``rows``, so it runs before
`orchestrator.records.tables_callback.StripRows`), and after each (at most every ``every_s``, and whenever a trial
finishes) asks :func:`analysis.features.stop_behind.stop_behind.behind` which running trials are behind their batch
size's best
setting by more than the seed noise can undo. It names them to the sweep's `trainables.sweep_signal.GoalSignal`
actor; each ends itself at its next evaluation with the status ``stopped_behind`` (a final report and checkpoint, as
every trial ends: Tune never stops a trial, docs/design.md). The trial's last result then gets a ``stop_reason``,
which the tables (``trials.parquet``), the MLflow run (tag ``stop_reason``) and the terminal show: it comes first
among bcrit's callbacks so that they see it.

A resumed sweep reads the finished trials' evaluations back from its tables (their rows are not re-sent).
"""

from __future__ import annotations

import os
import time

from ray.tune import Callback

from analysis.core import metrics as M
from analysis.features.stop_behind.stop_behind import Curve, Seeds, behind, curves_from_runs, fitted_metric, setting_of
from analysis.sources.loaders import load_sweep_dir
from analysis.sources.schema import TRIALS_FILE
from trainables import sweep_signal


def curve_of(trial_id: str, cfg: dict) -> Curve:
    """An empty curve of a running trial's config (its setting: the nuisance values, lr first; splits pooled)."""
    return Curve(trial_id, int(cfg["batch_size"]), setting_of(cfg), int(cfg.get("seed", 0) or 0), M.STATUS_RUNNING)


class StopBehind(Callback):
    """Ray Tune callback: marks trials that are behind (module docstring) on the sweep's signal actor."""

    def __init__(self, sweep_dir: str, signal: str, seeds: Seeds | None = None, every_s: float = 1.0):
        self.sweep_dir, self.signal, self.every_s = sweep_dir, signal, every_s
        self.seeds = seeds  # how many seeds each setting will have (a comparator needs them all)
        self.curves: dict[str, Curve] = {}
        self.reasons: dict[str, str] = {}  # trial id -> why it was told to stop
        self._last = -float("inf")

    def setup(self, **info) -> None:
        """Create the signal actor the trials ask at each evaluation, and for a resumed sweep read the finished
        trials' evaluations from its tables (Tune does not re-send them)."""
        try:
            sweep_signal.open_signal(self.signal)
        except Exception as e:  # the trials keep training whatever the actor does; the callback tells it again later
            print(f"[bcrit] stopping.behind could not create its signal actor yet: {e}")

        if not os.path.exists(os.path.join(self.sweep_dir, TRIALS_FILE)):  # a new sweep
            return
        try:
            runs = load_sweep_dir(self.sweep_dir)
        except Exception as e:  # the tables are checked again by the analysis; here they only help
            print(f"[bcrit] stopping.behind starts without the finished trials' evaluations: {e}")
            return

        for c in curves_from_runs(runs):
            if c.status in M.FINAL_STATUSES:
                self.curves[c.trial_id] = c

    def _curve(self, trial) -> Curve:
        c = self.curves.get(trial.trial_id)
        if c is None:
            c = self.curves[trial.trial_id] = curve_of(trial.trial_id, trial.config["trial"])
        return c

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        c = self._curve(trial)
        for row in result.get("rows") or []:
            if fitted_metric(row[2]):
                c.add(int(row[0]), row[2], float(row[3]))
        c.status = result.get("status", M.STATUS_RUNNING)
        if c.status == M.STATUS_BEHIND:
            result[M.STOP_REASON] = self.reasons.get(trial.trial_id, "behind its batch size's best setting")
        self.decide(force=c.status != M.STATUS_RUNNING)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, (trial.last_result or {}).get("status", M.STATUS_FAILED))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, M.STATUS_FAILED)

    def _finish(self, trial, status: str) -> None:
        c = self._curve(trial)
        if c.status == M.STATUS_RUNNING:
            c.status = status if status in M.FINAL_STATUSES else M.STATUS_FAILED
            self.decide(force=True)

    def decide(self, force: bool = False) -> list[str]:
        """Tell the signal actor about the trials newly behind; returns their ids."""
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return []
        self._last = now
        found = behind(list(self.curves.values()), seeds=self.seeds)
        new = {t: why for t, why in found.items() if t not in self.reasons}
        if new:
            sweep_signal.mark_behind(self.signal, list(new))
            self.reasons.update(new)
        return list(new)
