"""The Tune *function* trainable of a sweep: one call = one trial (Ray Train V2 pattern: docs/design.md).

- ``num_workers >= 1``: build a ``TorchTrainer`` named after the Tune trial id (so a retried or restored trial
  resumes from its latest Train checkpoint) and fit it; rank 0's reports reach Tune via `ObjectiveReportCallback`
  (``TuneReportCallback`` plus the ``objective`` the searcher minimises). Worker failures: Train's FailureConfig.
- ``num_workers == 0``: the loop runs in the trial actor itself with a `TuneSession` (Tune checkpoints; a
  ``TorchTrainer`` in local mode cannot report to Tune). This is the fast path of tests and the quadratic workload.

A trial always ends itself (target, budget, divergence, its adaptive sweep's goal met: trainables.sweep_signal),
never by Tune: the placement-group leak of ray#54305 (docs/design.md).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from analysis.core import metrics as M
from orchestrator.execution.tune_handoff import hand_off_pending_results
from orchestrator.search.optuna_search import OBJECTIVE
from orchestrator.storage.layout import TRAIN_DIR
from orchestrator.storage.uri import is_uri, join
from trainables import quiet_exit
from trainables.skeleton import opened
from trainables.sweep_signal import SignalReader
from trainables.workloads import Workload, get_workload  # noqa: F401 (Workload: its public home here before)


def objective(metrics: dict, target_loss: float | None, max_steps: int) -> float:
    """Lower is better. With a target: steps to reach it when reached, else ``max_steps x (1 + loss/target)``
    (a censored trial ranks behind every trial that reached it, closer ones first). Without: the eval loss.
    A diverged trial gets ``4 x max_steps`` (or +inf-like 1e30 without a target)."""
    loss = metrics.get(M.EVAL_LOSS, math.inf)
    status = metrics.get("status")
    if status == M.STATUS_DIVERGED or not math.isfinite(loss):
        return 4.0 * max_steps if target_loss is not None else 1e30
    if target_loss is None:
        return float(loss)
    if status == M.STATUS_REACHED_TARGET:
        return float(metrics.get(M.STEP, 0))
    return float(max_steps * (1.0 + max(loss, 0.0) / max(target_loss, 1e-12)))


class TuneSession:
    """Session of the in-process path: the loop reports straight to Tune, checkpoints are Tune checkpoints."""

    rank, world_size = 0, 1

    def __init__(
        self,
        use_gpu: bool,
        target_loss: float | None,
        max_steps: int,
        signal: str | None = None,
        trial_id: str | None = None,
    ):
        # torch: deferred, importing tune_trainable loads no torch
        import torch

        self.device = torch.device("cuda" if use_gpu else "cpu")
        self._target, self._max_steps = target_loss, max_steps
        self.sweep_ended = SignalReader(signal, trial_id)  # end at the goal / stopped behind (trainables.sweep_signal)

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        metrics = {**metrics, OBJECTIVE: objective(metrics, self._target, self._max_steps)}
        ckpt = tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        tune.report(metrics, checkpoint=ckpt)

    def restore(self):
        return opened(tune.get_checkpoint())


def objective_report_callback(target_loss: float | None, max_steps: int):
    """A ``TuneReportCallback`` that adds `OBJECTIVE` to rank 0's metrics (built lazily: it needs a Tune session)."""

    class ObjectiveReportCallback(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            first = {**metrics[0], OBJECTIVE: objective(metrics[0], target_loss, max_steps)}
            super().after_report(run_context, [first, *metrics[1:]], checkpoint)

    return ObjectiveReportCallback()


def make_trainable(
    workload: str, sweep_dir: str, worker_failures: int = 3, verbose: bool = False, signal: str | None = None
) -> Callable[[dict], None]:
    """The function Tune runs per trial; its Ray Train runs go to ``<sweep_dir>/train`` (``sweep_dir``: the
    sweep's storage, a directory or a URI). ``config["trial"]`` is the full trial-config dict; ``workload`` names it
    (`trainables.workloads.get_workload`, resolved in the worker: an unknown name fails, never runs the DiT). Not
    ``verbose``: the trial's INFO logs (a line per checkpoint, Train's worker-group set-up) stay out of the driver's
    output. ``signal``: the name of the sweep's `trainables.sweep_signal.GoalSignal`, which its trials ask at each
    evaluation whether to end (``goal.running: end``) or stop alone (``stopping.behind``); None: they never ask."""
    uri = is_uri(sweep_dir)
    train_storage = join(sweep_dir, TRAIN_DIR) if uri else os.path.join(os.path.abspath(sweep_dir), TRAIN_DIR)

    def bcrit_trial(config: dict) -> None:
        quiet_exit.install()  # ended by Ray's SIGTERM inside a finalizer: no traceback (trainables.quiet_exit)
        if not verbose:  # "Checkpoint successfully created at: ..." per Tune checkpoint of an in-process trial
            logging.getLogger("ray.train._internal.storage").setLevel(logging.WARNING)

        w = get_workload(workload)
        cfg = w.config_cls.from_dict(config["trial"])
        target, budget = cfg.target_loss, cfg.max_steps
        trial_id = tune.get_context().get_trial_id()
        if cfg.num_workers == 0:
            # torch: deferred, importing tune_trainable loads no torch
            from trainables.trial import gpu_share

            session = TuneSession(cfg.use_gpu, target, budget, signal, trial_id)
            with gpu_share(cfg.gpus_per_worker, session.device):  # packed on a GPU: capped at its share of memory
                w.loop(cfg, session)
            return
        cb = objective_report_callback(target, budget)
        # torch: deferred, importing tune_trainable loads no torch
        from trainables.trial import build_trainer

        trainer = build_trainer(
            cfg,
            name=trial_id,
            storage_path=train_storage,
            callbacks=[cb],
            max_failures=worker_failures,
            train_loop=w.train_func,
            log_level="INFO" if verbose else "WARNING",
            signal=signal,
            trial_id=trial_id,
        )
        trainer.fit()
        # else Ray 2.60 can deadlock on the run's last report (orchestrator.execution.tune_handoff)
        hand_off_pending_results()

    return bcrit_trial
