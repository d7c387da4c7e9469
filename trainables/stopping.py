"""Stop rules shared by every workload's loop: a trial ends itself (REFERENCE.md, the placement-group leak when
Tune stops trials), so ``trainer.fit()`` returns normally."""

from __future__ import annotations

from collections.abc import Callable

from analysis import metrics as M


def status_after_step(step: int, eval_every: int, max_steps: int, evaluate: Callable[[], str]) -> str:
    """Status after optimizer step ``step``: evaluate on the cadence and at the budget (``evaluate`` returns
    ``running``, ``reached_target`` or ``diverged``); a trial still running at ``max_steps`` has spent its budget."""
    status = evaluate() if step % eval_every == 0 or step >= max_steps else M.STATUS_RUNNING
    if status == M.STATUS_RUNNING and step >= max_steps:
        status = M.STATUS_BUDGET_SPENT
    return status
