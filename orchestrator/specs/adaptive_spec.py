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

from pydantic import Field

from orchestrator.specs.models import SpecModel, field, rule

RUNNING = ("wait", "end")
RUNNING_DEFAULT, HOLD_DEFAULT, MIN_SEEDS_DEFAULT = "wait", True, 2  # pinned in the saved spec (sweep_spec._saved)
AUTO = "auto"


class Goal(SpecModel):
    """nuisance.goal: when an adaptive sweep has its answer (its rules against fixed.seeds and stopping.target_loss:
    `adaptive`, from the sweep model's validator)."""

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

    def given(self, key: str, default: Any) -> Any:
        """The goal's ``key``, or ``default`` (read when the spec is, not when this module was) where not given."""
        return getattr(self, key) if key in self.model_fields_set else default

    def losses(self, target_loss: float | None) -> tuple[float, ...]:
        """The target losses (``auto``: the stopping target)."""
        t = self.targets
        return (float(target_loss),) if t == AUTO else tuple(float(x) for x in (t if isinstance(t, list) else [t]))


class Budget(SpecModel):
    """nuisance.budget: the most an adaptive sweep may spend."""

    examples: Annotated[float, Field(gt=0)] | None = field(None, fix="must be a number > 0 (training examples)")
    trials: Annotated[int, Field(ge=1)] | None = field(None, fix="must be an integer >= 1")


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


def adaptive(goal: Goal, budget: Budget, n_seeds: int, target_loss: Any) -> Adaptive:
    """The adaptive sweep of ``goal`` and ``budget`` against ``n_seeds`` seeds of fixed.seeds and the stopping
    target; a broken rule is raised as `rule` (called from the sweep model's validator)."""
    min_seeds = goal.given("min_seeds", MIN_SEEDS_DEFAULT)
    if min_seeds > n_seeds:
        raise rule(
            f"nuisance.goal.min_seeds {min_seeds} exceeds the {n_seeds} seed(s) of fixed.seeds; list more "
            "seeds there or lower min_seeds"
        )
    stop = target_loss if isinstance(target_loss, (int, float)) and not isinstance(target_loss, bool) else None
    if goal.targets == AUTO and stop is None:
        raise rule("nuisance.goal.targets: auto needs stopping.target_loss; set it or list the targets")
    if stop is not None and any(t < stop for t in goal.losses(stop)):
        raise rule(
            f"nuisance.goal.targets: {min(goal.losses(stop)):g} is below stopping.target_loss {stop:g}, where "
            "trials stop, so no trial reaches it; use targets >= the stopping target"
        )
    return Adaptive(float(goal.rel_ci), goal.losses(stop), min_seeds, goal.bins,
                    None if budget.examples is None else float(budget.examples), budget.trials,
                    end_running=goal.given("running", RUNNING_DEFAULT) == "end",
                    hold=goal.given("hold", HOLD_DEFAULT))  # fmt: skip
