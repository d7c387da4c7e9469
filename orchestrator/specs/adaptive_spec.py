"""The ``nuisance`` keys of ``search: adaptive`` (orchestrator.features.adaptive.adaptive_search; every key:
docs/sweeps.md, "Adaptive search"; an example: examples/adaptive-tiny.yaml).

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
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from orchestrator.errors import UserError
from orchestrator.specs.models import SpecModel, field, rule, validate

RUNNING = ("wait", "end")
RUNNING_DEFAULT, HOLD_DEFAULT, MIN_SEEDS_DEFAULT = "wait", True, 2  # pinned in the saved spec (sweep_spec._saved)
AUTO = "auto"


class Goal(SpecModel):
    """nuisance.goal: when an adaptive sweep has its answer."""

    # validated with context n_seeds (of fixed.seeds) and target_loss (stopping.target_loss, or None)

    rel_ci: Annotated[float, Field(gt=0, lt=1)] = field(fix="must be a number in (0, 1) (e.g. 0.15 for +-15%)")
    targets: Literal["auto"] | float | Annotated[list[float], Field(min_length=1)] = field(
        AUTO, fix="must be 'auto' or a non-empty list of losses"
    )
    bins: bool = field(False, fix="must be true or false (per-timestep-bin goals)")
    min_seeds: Annotated[int, Field(ge=1)] = field(MIN_SEEDS_DEFAULT, fix="must be an integer >= 1")
    running: Literal["wait", "end"] = field(
        RUNNING_DEFAULT, fix="must be wait or end (the trials running when the goal is met)"
    )
    hold: bool = field(
        HOLD_DEFAULT,
        fix="must be true or false (start no trial while the running ones are expected to meet the goal)",
    )

    @model_validator(mode="after")
    def _against_seeds_and_stopping(self, info: ValidationInfo) -> Goal:
        ctx = info.context or {}
        n_seeds, stop = ctx.get("n_seeds"), ctx.get("target_loss")
        if n_seeds is not None and self.min_seeds > n_seeds:
            raise rule(
                f"nuisance.goal.min_seeds {self.min_seeds} exceeds the {n_seeds} seed(s) of fixed.seeds; list more "
                "seeds there or lower min_seeds"
            )
        if "target_loss" not in ctx:  # the section alone (orchestrator.specs.sweep_models.Nuisance)
            return self
        if self.targets == AUTO and not _number(stop):
            raise rule("nuisance.goal.targets: auto needs stopping.target_loss; set it or list the targets")
        if _number(stop) and any(t < stop for t in self.losses(stop)):
            raise rule(
                f"nuisance.goal.targets: {min(self.losses(stop)):g} is below stopping.target_loss {stop:g}, where "
                "trials stop, so no trial reaches it; use targets >= the stopping target"
            )
        return self

    def losses(self, target_loss: float | None) -> tuple[float, ...]:
        """The target losses (``auto``: the stopping target)."""
        t = self.targets
        return (float(target_loss),) if t == AUTO else tuple(float(x) for x in (t if isinstance(t, list) else [t]))


class Budget(SpecModel):
    """nuisance.budget: the most an adaptive sweep may spend."""

    examples: Annotated[float, Field(gt=0)] | None = field(None, fix="must be a number > 0 (training examples)")
    trials: Annotated[int, Field(ge=1)] | None = field(None, fix="must be an integer >= 1")


GOAL_KEYS = tuple(Goal.model_fields)
BUDGET_KEYS = tuple(Budget.model_fields)


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
    stop = stopping.get("target_loss")
    defaults = {"min_seeds": MIN_SEEDS_DEFAULT, "running": RUNNING_DEFAULT, "hold": HOLD_DEFAULT}  # read now
    g = validate(Goal, defaults | goal, "nuisance.goal", n_seeds=n_seeds, target_loss=stop)
    if not isinstance(budget, dict) or not budget:
        raise UserError("search: adaptive needs nuisance.budget, e.g. budget: {trials: 40} or {examples: 2.0e+6}")
    b = validate(Budget, budget, "nuisance.budget")
    return Adaptive(float(g.rel_ci), g.losses(stop), g.min_seeds, g.bins,
                    None if b.examples is None else float(b.examples), b.trials,
                    end_running=g.running == "end", hold=g.hold)  # fmt: skip
