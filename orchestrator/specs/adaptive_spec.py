"""The ``nuisance`` keys of ``search: adaptive`` (orchestrator.search.adaptive_search; every key: docs/sweeps.md,
"Adaptive search"; an example: examples/adaptive-tiny.yaml).

``lr``: the learning-rate grid the design may draw from. ``goal``: ``rel_ci`` (stop when the relative half-width
``(hi - lo) / (2 B_crit)`` of the 90% interval is at most this at every target), ``targets`` (loss values, or ``auto``:
the sweep's ``stopping.target_loss``), ``bins`` (also every trusted timestep bin's B_crit; the workload must report
>= 2 per-bin eval losses, checked before launch by orchestrator.execution.preflight.check_bins), ``min_seeds``
(default 2: seeds of every fitted batch size's best setting before the goal counts), ``running`` (``wait``, the
default, for the running trials; or ``end`` them at the goal: status ``ended_at_goal``, trainables.sweep_signal),
``hold`` (default ``true``: start no trial while the running ones are expected to meet the goal; ``false`` keeps every
place busy). ``budget``: the most ``trials`` and/or ``examples``. The seeds of ``fixed.seeds`` are the seeds a setting
may get. Each mistake is one UserError line, raised before any compute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UserError

GOAL_KEYS = ("rel_ci", "targets", "bins", "min_seeds", "running", "hold")
RUNNING = ("wait", "end")
RUNNING_DEFAULT, HOLD_DEFAULT, MIN_SEEDS_DEFAULT = "wait", True, 2  # pinned in the saved spec (sweep_spec._saved)
BUDGET_KEYS = ("examples", "trials")
AUTO = "auto"


@dataclass(frozen=True)
class Adaptive:
    """The goal and budget of an adaptive sweep (targets resolved: ``auto`` is the stopping target)."""

    rel_ci: float
    targets: tuple[float, ...]
    min_seeds: int
    bins: bool
    budget_examples: float | None
    budget_trials: int | None
    end_running: bool = False  # goal.running: end (else wait)
    hold: bool = True  # goal.hold: no new trial while the running ones are expected to meet the goal


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_adaptive(nui: dict, stopping: dict, n_seeds: int) -> Adaptive:
    """The goal and budget of ``nuisance`` (``search: adaptive``), or one UserError line."""
    goal, budget = nui.get("goal"), nui.get("budget")
    if not isinstance(goal, dict):
        raise UserError("search: adaptive needs nuisance.goal, e.g. goal: {rel_ci: 0.15, targets: auto}")
    unknown = [k for k in goal if k not in GOAL_KEYS]
    if unknown:
        raise UserError(f"unknown key nuisance.goal.{unknown[0]}; valid keys: {list(GOAL_KEYS)}")
    rel = goal.get("rel_ci")
    if not _number(rel) or not 0 < rel < 1:
        raise UserError(f"nuisance.goal.rel_ci must be a number in (0, 1) (e.g. 0.15 for +-15%), got {rel!r}")
    bins = goal.get("bins", False)
    if not isinstance(bins, bool):
        raise UserError(f"nuisance.goal.bins must be true or false (per-timestep-bin goals), got {bins!r}")
    min_seeds = goal.get("min_seeds", MIN_SEEDS_DEFAULT)
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 1:
        raise UserError(f"nuisance.goal.min_seeds must be an integer >= 1, got {min_seeds!r}")
    if min_seeds > n_seeds:
        raise UserError(
            f"nuisance.goal.min_seeds {min_seeds} exceeds the {n_seeds} seed(s) of fixed.seeds; list more seeds "
            "there or lower min_seeds"
        )
    stop_target = stopping.get("target_loss")
    targets = goal.get("targets", AUTO)
    if targets == AUTO:
        if not _number(stop_target):
            raise UserError("nuisance.goal.targets: auto needs stopping.target_loss; set it or list the targets")
        targets = [stop_target]
    targets = [targets] if _number(targets) else targets
    if not isinstance(targets, list) or not targets or not all(_number(t) for t in targets):
        raise UserError(f"nuisance.goal.targets must be 'auto' or a non-empty list of losses, got {targets!r}")
    if _number(stop_target) and any(t < stop_target for t in targets):
        low = min(targets)
        raise UserError(
            f"nuisance.goal.targets: {low:g} is below stopping.target_loss {stop_target:g}, where trials stop, so "
            "no trial reaches it; use targets >= the stopping target"
        )
    running = goal.get("running", RUNNING_DEFAULT)
    if running not in RUNNING:
        raise UserError(f"nuisance.goal.running must be wait or end (the trials running when the goal is met), got "
                        f"{running!r}")  # fmt: skip
    hold = goal.get("hold", HOLD_DEFAULT)
    if not isinstance(hold, bool):
        raise UserError(f"nuisance.goal.hold must be true or false (start no trial while the running ones are "
                        f"expected to meet the goal), got {hold!r}")  # fmt: skip
    return Adaptive(float(rel), tuple(float(t) for t in targets), min_seeds, bins, *_budget(budget),
                    end_running=running == "end", hold=hold)  # fmt: skip


def _budget(budget: Any) -> tuple[float | None, int | None]:
    if not isinstance(budget, dict) or not budget:
        raise UserError("search: adaptive needs nuisance.budget, e.g. budget: {trials: 40} or {examples: 2.0e+6}")
    unknown = [k for k in budget if k not in BUDGET_KEYS]
    if unknown:
        raise UserError(f"unknown key nuisance.budget.{unknown[0]}; valid keys: {list(BUDGET_KEYS)}")
    ex, tr = budget.get("examples"), budget.get("trials")
    if ex is not None and (not _number(ex) or ex <= 0):
        raise UserError(f"nuisance.budget.examples must be a number > 0 (training examples), got {ex!r}")
    if tr is not None and (isinstance(tr, bool) or not isinstance(tr, int) or tr < 1):
        raise UserError(f"nuisance.budget.trials must be an integer >= 1, got {tr!r}")
    return (None if ex is None else float(ex)), tr
