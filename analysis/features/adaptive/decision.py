"""The decision rule's vocabulary: the space, goal and budget it is given, the trials it chooses, its decision."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analysis.features.adaptive.bin_goals import BinInterval, untrusted_text

GOAL_MET, BUDGET_EXAMPLES, BUDGET_TRIALS, EXHAUSTED = "goal_met", "budget_examples", "budget_trials", "space_exhausted"


@dataclass(frozen=True)
class Space:
    """What may be run: batch sizes, one learning-rate grid shared by them (ascending), seeds per setting."""

    batch_sizes: tuple[int, ...]
    lrs: tuple[float, ...]
    max_seeds: int = 3

    def __post_init__(self):
        if len(self.batch_sizes) < 3 or len(self.lrs) < 1 or self.max_seeds < 1:
            raise ValueError("the adaptive space needs >= 3 batch sizes, >= 1 learning rate and max_seeds >= 1")
        object.__setattr__(self, "batch_sizes", tuple(sorted(int(b) for b in self.batch_sizes)))
        object.__setattr__(self, "lrs", tuple(sorted(float(x) for x in self.lrs)))


@dataclass(frozen=True)
class Goal:
    """Stop when every target's relative half-width <= ``rel_ci`` (with ``min_seeds`` at every fitted point);
    ``bins``: and every trusted timestep bin's at every target (analysis.features.adaptive.bin_goals)."""

    targets: tuple[float, ...]
    rel_ci: float = 0.15
    min_seeds: int = 2
    level: float = 0.9
    bins: bool = False


@dataclass(frozen=True)
class Budget:
    """Stop when the examples spent (finished + pending estimates) or the trials reach these (None: no limit)."""

    examples: float | None = None
    trials: int | None = None


@dataclass(frozen=True)
class Trial:
    batch_size: int
    lr: float
    seed: int


def _same_lr(a: float, b: float) -> bool:
    """Two learning rates are one setting within a relative 1e-9 (grid values read back from float columns)."""
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


@dataclass(frozen=True)
class Choice:
    trial: Trial
    kind: str  # seed | lr_edge | lr_refine | batch_size | bracket | design
    score: float  # expected narrowing (sum over unmet targets of relative half-width) per example; inf: first
    examples: float  # expected examples of the trial
    reason: str


@dataclass
class Decision:
    stop: str | None  # GOAL_MET | BUDGET_EXAMPLES | BUDGET_TRIALS | EXHAUSTED | None (go on)
    choices: list[Choice]
    widths: dict[float, float]  # goal target -> relative half-width of the B_crit interval (inf: no fit)
    fits: list[dict] = field(default_factory=list)  # analyze_metric's entries at the goal targets
    examples_spent: float = 0.0
    trials_spent: int = 0
    bins: list[BinInterval] = field(default_factory=list)  # Goal.bins: every bin at every fitted goal target
    confirmed: int | None = None  # resamples of the refit that re-checked a goal met (its fits, widths, bins)
    holding: bool = False  # no trial chosen: the pending ones are expected to meet the goal (_pending_meet_goal)

    def widest(self) -> tuple[str, float]:
        """The interval the goal waits for: ``(label, relative half-width)`` of the widest of the global targets
        and the counted (trusted) bins, e.g. ``("bin t=750-999 at 0.3", 0.23)`` (inf: a target without a fit)."""
        cands = [(f"B_crit at {t:g}", w) for t, w in self.widths.items()]
        cands += [(b.label(), b.width) for b in self.bins if b.counted]
        return max(cands, key=lambda c: c[1]) if cands else ("B_crit", np.inf)

    def summary(self) -> str:
        w = ", ".join(f"{t:g}: +-{v:.0%}" if np.isfinite(v) else f"{t:g}: no fit" for t, v in self.widths.items())
        nxt = "; ".join(f"{c.kind} B={c.trial.batch_size} lr={c.trial.lr:g} seed={c.trial.seed}" for c in self.choices)
        if self.bins:
            label, width = self.widest()
            w += f"; widest {label}: " + (f"+-{width:.0%}" if np.isfinite(width) else "no fit")
            bad = untrusted_text(self.bins)
            w += f"; untrusted bins: {bad}" if bad else ""
        if self.confirmed:
            w += f" ({self.confirmed} resamples: " + ("goal confirmed)" if self.stop == GOAL_MET else "goal not met)")
        if self.holding:
            nxt = "none, the running trials are expected to meet the goal"
        return f"B_crit at {w}" + (f" -> stop: {self.stop}{self.flagged()}" if self.stop else f"; next: {nxt or '-'}")

    def flagged(self) -> str:
        """At a stop, the goal targets whose answer the analysis flags (:func:`flagged_text`)."""
        return flagged_text({f"{f['target']:g}": f["flags"] for f in self.fits})


def flagged_text(flags: dict[str, list[str]]) -> str:
    """``"; FLAGGED: near_floor at 0.18 (bcrit analyze says why)"`` for the goal targets (``"0.18"``) with flags, or
    ``""``: the goal checks widths, seeds, ``lr_at_edge`` and ``lr_at_divergence`` where the grid can still resolve
    them, not the analysis's other flags (Decision.summary, the adaptive sweep's progress line)."""
    bad = [f"{','.join(v)} at {t}" for t, v in flags.items() if v]
    return "; FLAGGED: " + "; ".join(bad) + " (bcrit analyze says why)" if bad else ""
