"""Stop rules shared by every workload's loop: a trial ends itself, so ``trainer.fit()`` returns normally (when Tune
stops a trial, its Train worker group's placement group is not released and the next trial can hang: docs/design.md)."""

from __future__ import annotations

import math
from collections.abc import Callable

from analysis.core import metrics as M


def status_after_step(step: int, eval_every: int, max_steps: int, evaluate: Callable[[], str]) -> str:
    """Status after optimizer step ``step``: evaluate on the cadence and at the budget (``evaluate`` returns
    ``running``, ``reached_target`` or ``diverged``); a trial still running at ``max_steps`` has spent its budget."""
    status = evaluate() if step % eval_every == 0 or step >= max_steps else M.STATUS_RUNNING
    if status == M.STATUS_RUNNING and step >= max_steps:
        status = M.STATUS_BUDGET_SPENT
    return status


def eval_status(loss: float, first_eval: float, divergence_factor: float, target_loss: float | None) -> str:
    """Verdict of one held-out evaluation: diverged (non-finite, or above ``divergence_factor`` x the first
    evaluation), reached the target (``loss <= target_loss``), or still running."""
    if not math.isfinite(loss) or loss > divergence_factor * first_eval:
        return M.STATUS_DIVERGED
    if target_loss is not None and loss <= target_loss:
        return M.STATUS_REACHED_TARGET
    return M.STATUS_RUNNING
