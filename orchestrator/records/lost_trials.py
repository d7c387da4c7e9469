"""Trials lost with a killed driver, removed from the sweep's records when it is resumed.

Tune saves its trial list (``experiment_state-*.json``) at most every ``TUNE_GLOBAL_CHECKPOINT_S`` (and skips an
upload from the driver's staging directory while the previous one runs). A trial started after the last save and
still running when the driver is SIGKILLed is unknown to ``Tuner.restore``, which never runs it again: a grid makes
its config again under a new trial id (Tune's generator is restored from the same save), the Optuna searcher
recounts its quotas from the restored trials and suggests another trial in its place (orchestrator.search.optuna_search,
``reconcile``), the adaptive one hands its setting out again (orchestrator.features.adaptive.adaptive_search,
``reconcile``). bcrit's records of the lost trial -- its "running" row and metric
rows in the tables, its MLflow child run -- would stay beside its replacement, never finished: a group of an Optuna
sweep with 4 trials for a quota of 3, an MLflow run RUNNING for ever. `ForgetLost` removes them at the driver's
first step, when Tune has restored its trials and started none: every trial the records hold as unfinished that
Tune did not restore. A fresh sweep's records hold none (``bcrit sweep`` clears or refuses a directory with them).
"""

from __future__ import annotations

from ray.tune import Callback


class ForgetLost(Callback):
    """Driver-side callback before ``tracking`` and ``tables`` (the sweep's MLflowTracking and TablesCallback): at
    the first step of each driver, the trials they hold as unfinished that Tune did not restore are removed."""

    def __init__(self, tracking, tables):
        self.tracking, self.tables = tracking, tables
        self._checked = False  # per driver: Tune pickles the callbacks with the experiment

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_checked": False}

    def on_step_begin(self, iteration, trials, **info) -> None:
        if self._checked:
            return
        self._checked = True
        known = {t.trial_id for t in trials}
        rows = [tid for tid in self.tables.tables.unfinished() if tid not in known]
        if rows:
            self.tables.forget(rows)
        lost = sorted(set(rows) | set(self.tracking.forget_lost(known)))
        if lost:
            print(
                f"[bcrit] trial{'s' if len(lost) > 1 else ''} {', '.join(lost)} started after Tune's last saved state "
                "and cannot be resumed: partial rows and MLflow run removed (the sweep runs another in its place)",
                flush=True,
            )
