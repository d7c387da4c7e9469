"""The adaptive sweep's decision rule: from the runs so far, which trials to run next, or why to stop.

A pure function of the runs, the candidate space, the pending trials, the goal and the budget (:func:`next_trials`;
docs/sweeps.md, "The decision rule"), called by the Tune searcher and the tests' offline NQM loop
(tests/oracles/nqm_adaptive.py); its pieces, one concern each, are in :mod:`analysis.features.adaptive`.
"""

from __future__ import annotations

import numpy as np

from analysis.core import metrics as m
from analysis.features.adaptive.bin_goals import bin_intervals, rel_width
from analysis.features.adaptive.candidates import _best_candidate, initial_design
from analysis.features.adaptive.decision import (
    BUDGET_EXAMPLES,
    BUDGET_TRIALS,
    EXHAUSTED,
    GOAL_MET,
    Budget,
    Choice,
    Decision,
    Goal,
    Space,
    Trial,
    flagged_text,
)
from analysis.features.adaptive.goal_checks import _bins_met, _goal_met, _pending_meet_goal
from analysis.features.adaptive.ledger import _Cost, _not_ended, _tried, spent_examples
from analysis.features.adaptive.narrowing import SIGMA2_FLOOR, p_better
from analysis.fits import pareto
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs

__all__ = [
    "BUDGET_EXAMPLES",
    "BUDGET_TRIALS",
    "CONFIRM_BOOTSTRAP",
    "EXHAUSTED",
    "GOAL_MET",
    "SIGMA2_FLOOR",
    "Budget",
    "Choice",
    "Decision",
    "Goal",
    "Space",
    "Trial",
    "flagged_text",
    "initial_design",
    "next_trials",
    "p_better",
    "rel_width",
    "spent_examples",
]

CONFIRM_BOOTSTRAP = 1000  # resamples of the refit that confirms a stop on the goal (bcrit analyze's default)


def next_trials(
    runs: Runs | None,
    space: Space,
    goal: Goal,
    budget: Budget,
    pending: tuple[Trial, ...] | list[Trial] = (),
    n: int = 1,
    bootstrap: int = CONFIRM_BOOTSTRAP,
    seed: int = 0,
    end_pending: bool = False,
    hold: bool = True,
) -> Decision:
    """Refit the runs at the goal targets and choose up to ``n`` next trials, or say why the sweep stops.

    The refits are of ``eval/loss``. ``bootstrap``: the resamples of each refit; when that refit meets the goal with
    no trial pending, the goal is checked again on a refit with `CONFIRM_BOOTSTRAP` (``bcrit analyze``'s default);
    the sweep stops only if it holds there too, else it goes on from the confirming refit (docs/sweeps.md, "The
    decision rule").
    ``end_pending``: the caller ends the pending trials at a stop on the goal (their status ``ended_at_goal``), so a
    goal met on the finished trials is confirmed and taken with trials pending, instead of waiting for them. Trials
    of ``runs`` with that status count as spent (examples and trials) and are otherwise left out. ``hold``: choose
    nothing while the pending trials are expected to meet the goal (docs/sweeps.md, "The decision rule")."""
    pending = list(pending)
    spent_all = spent_examples(runs) if runs is not None else np.zeros(0)
    # trials a stop on the goal ended part-way: spent, but neither fitted nor tried
    runs, spent = _not_ended(runs, spent_all)
    done = _tried(runs, [])  # the finished trials (ended ones left out)
    tried = pending + done
    cost = _Cost(runs, spent, space)
    n_done = len(spent_all)
    dec = Decision(None, [], {float(t): np.inf for t in goal.targets}, [], float(spent_all.sum()), n_done)
    if runs is not None and len(spent):
        _refit(dec, runs, goal, m.EVAL_LOSS, bootstrap, seed)
    fits = dec.fits
    committed = dec.examples_spent + sum(cost.of(t.batch_size, fits) for t in pending)
    if budget.trials is not None and n_done + len(pending) >= budget.trials:
        dec.stop = BUDGET_TRIALS if n_done >= budget.trials else None
        return dec
    if budget.examples is not None and committed >= budget.examples:
        dec.stop = BUDGET_EXAMPLES if dec.examples_spent >= budget.examples else None
        return dec
    if budget.trials is not None:  # never more trials than the budget, pending and chosen ones included
        n = min(n, budget.trials - n_done - len(pending))
    design = [t for t in initial_design(space) if t not in tried]
    if design:
        dec.choices = [Choice(t, "design", np.inf, cost.of(t.batch_size, fits), "initial design") for t in design[:n]]
        _within_examples(dec, budget, committed)
        return dec
    # with end_pending the pending trials end at a stop: the goal cannot count them as having passed an lr edge
    judged = done if end_pending else tried
    if _goal_met(fits, goal, space, judged) and _bins_met(dec.bins, goal):
        if pending and not end_pending:  # met on the finished trials; pending ones may change the fit: wait
            return dec
        if CONFIRM_BOOTSTRAP > bootstrap:  # the stop is taken on a refit as large as bcrit analyze's
            _refit(dec, runs, goal, m.EVAL_LOSS, CONFIRM_BOOTSTRAP, seed)
            dec.confirmed, fits = CONFIRM_BOOTSTRAP, dec.fits
        if _goal_met(fits, goal, space, judged) and _bins_met(dec.bins, goal):
            dec.stop = GOAL_MET
            return dec
    if hold and _pending_meet_goal(goal, fits, dec.bins, space, pending, tried, cost):
        dec.holding = True  # another trial now would be waited for, or ended, by the stop they are expected to bring
        return dec
    for _ in range(n):
        c = _best_candidate(runs, space, goal, fits, tried, cost, m.EVAL_LOSS, dec.bins)
        if c is None:
            break
        dec.choices.append(c)
        tried.append(c.trial)
    _within_examples(dec, budget, committed)
    if not dec.choices and not pending:
        dec.stop = EXHAUSTED
    return dec


def _refit(dec: Decision, runs: Runs, goal: Goal, metric: str, bootstrap: int, seed: int) -> None:
    """Refit with ``bootstrap`` resamples: the decision's fits, widths (inf: a target without a fit) and, with
    ``Goal.bins``, bin intervals become the refit's."""
    dec.fits = _fits(runs, goal, metric, bootstrap, seed)
    dec.widths = {float(t): np.inf for t in goal.targets} | {float(f["target"]): rel_width(f) for f in dec.fits}
    dec.bins = bin_intervals(runs, dec.fits, metric, bootstrap, seed, goal.level) if goal.bins and dec.fits else []


def _within_examples(dec: Decision, budget: Budget, committed: float) -> None:
    """Keep the choices that start while the examples committed (spent, pending, chosen before) are under the
    budget: several trials chosen at once spend it as they would one at a time (the first always starts)."""
    if budget.examples is None:
        return
    keep = []
    for c in dec.choices:
        if committed >= budget.examples:
            break
        keep.append(c)
        committed += c.examples
    dec.choices = keep


def _fits(runs: Runs, goal: Goal, metric: str, bootstrap: int, seed: int) -> list[dict]:
    notes: list[str] = []
    try:
        return analyze_metric(runs, metric, list(goal.targets), bootstrap, seed, goal.level, strict=False, notes=notes)
    except pareto.TooFewBatchSizesError:
        return []
