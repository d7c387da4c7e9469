"""The adaptive sweep's decision rule: from the runs so far, which trials to run next, or why to stop.

A pure function of the runs (analysis ``Runs``), the candidate space, the pending trials, the goal and the budget
(:func:`next_trials`); the Tune searcher and the offline NQM loop (analysis.decisions.nqm_adaptive) both call it.

**The fit is the analysis's own**: every decision refits with :func:`analysis.fits.sweep_fit.analyze_metric`
(bootstrap included) at the goal's targets; the *goal* is met when, at every goal target, the relative half-width
``(hi - lo) / (2 B_crit)`` of the B_crit interval is at most ``rel_ci``, the best setting of every fitted batch size
has at least ``min_seeds`` seeds (the minimum design; it guards the interval against stopping on a lucky draw; every
seed the space allows where the point is ``near_floor``, a flag judged on the median over its seeds), and
no fitted point has its best learning rate at an edge of what was tried while the grid goes further there, or
is flagged ``lr_at_divergence`` while the grid has an untried learning rate between its best and a tried neighbour
(the ``lr_refine`` candidate, which then goes there).
With ``Goal.bins`` every timestep bin is also fitted at every goal target (:mod:`analysis.decisions.bin_goals`: the
analysis's per-bin answer, same estimator and bootstrap settings), and the goal further needs every bin the analysis
trusts (no flags) within ``rel_ci`` with ``min_seeds`` at the bin's own best settings; untrusted bins are listed in
the decision (``Decision.bins``, ``summary()``) and not counted. ``Decision.widest()`` names the interval the goal
waits for (the widest of the global targets and the counted bins).

**Stopping.** A refit's interval comes from ``bootstrap`` resamples: 1000 by default, what ``bcrit analyze``
reports, so the goal looks at the width the user will be given (a refit costs about the same at 1000 as at 200: the
calibration dominates). With fewer (the default was 200 until 2026-11-27) the width moves by several points from
one refit to the next (on 14 replayed tiny-DiT sweeps the 200-resample refits ran past the first prefix whose
answer met the goal: median 0.75 of the grid's examples at the stop against 0.61 with 1000); a stop on the goal is
then not taken on one: when such a refit meets the goal with no trial pending, the goal is checked again on a
refit with ``confirm_bootstrap`` resamples (1000), and the sweep stops only if it holds there too; otherwise the
trials are chosen from the confirming refit. The stopped answer is the one ``bcrit analyze`` gives at the same
seed. With trials pending, a goal met on the finished trials waits for them (no new trial starts) and is checked
again with them in: they can move the width back over the goal, or flag the answer (a neighbour's seed that makes
it the best at an edge). Stopping there instead, the running trials joining the answer after the stop, was
measured and rejected (benchmarks/RESULTS.md, "resampled the learning rates"): with 4 in flight it cost 0.48 of
the grid's examples against 0.73 on 14 replayed tiny-DiT sweeps, but left 14 of 32 global answers flagged on the
``t3`` simulator (0 of 32 batch-synchronous) and widths up to 24% above the goal. What the Tune searcher does
instead (``end_pending``, orchestrator.search.adaptive_search): the goal met on the finished trials is confirmed and
taken
with trials pending (judged on the finished trials alone: a running trial past an lr edge does not resolve it, as
it will be ended), and the pending trials are *ended* (trainables.sweep_signal; status ``ended_at_goal``): the
answer is the confirmed one, the ended trials' examples count as spent and their rows are kept, but the analysis
leaves them out (a trial stopped part-way by a decision taken without it measures nothing about its setting).

**Holding.** With trials pending and nothing the goal waits for left untried, when the pending seeds at the fitted
points' best settings are expected (the linearized model below) to bring every global interval within ``rel_ci``,
no trial is chosen (``Decision.holding``): it would be waited for (``wait``) or ended part-way (``end``) by the
stop the pending ones are expected to bring, its examples spent for nothing. The sweep runs below its concurrency
until they finish; if the goal is then not met, the rule chooses again. This trades wall-clock time for examples
(benchmarks/RESULTS.md, "ninth round").

**Expected narrowing (the documented proxy).** In log space the fit ``log S(B) = log(S_min + E_min/B)`` is, near
its optimum, linear in ``p = (log S_min, log E_min)`` with the row ``g(B) = (S_min, E_min/B) / S(B)`` per point;
``log B_crit = a·p`` with ``a = (-1, 1)``. A point holding ``k`` seeds of per-seed log-variance ``σ²`` has weight
``k/σ²``, so ``Var log B_crit ≈ v = a' F⁻¹ a`` with ``F = Σ w g g'``. A candidate trial adds a row (rank one):
``v' = v - (a'F⁻¹g)² / (σ² + g'F⁻¹g)``, and its expected narrowing at one target is ``w_now (1 - sqrt(v'/v))``,
where ``w_now`` is the bootstrap interval's measured relative half-width (the linearization only scales it).
``σ²`` is the pooled seed-to-seed variance of log steps over the settings with two or more seeds (else the fit's
mean squared log residual), floored at ``SIGMA2_FLOOR``. A candidate's score is its narrowing summed over the
intervals the goal still waits for (the goal targets not yet met; with ``Goal.bins`` also the counted bins too wide
or short of seeds, each bin its own linearized fit and ``σ²`` of its own loss), divided by its expected examples
(an estimate from the trials at that batch size, or ``B · S(B)`` from the fit scaled by the measured ratio of
examples spent to ``B · S(B)``). A sum, not the widest interval's narrowing alone: the sweep stops only when every
open interval is met, so a trial that narrows several is worth more than one that narrows the widest a little
more; the widest alone would ignore the others until it is met, and which interval is widest changes from refit
to refit with the bootstrap's noise. Intervals already met add nothing (the goal no longer looks at them), unless
all are and the goal waits for seeds or a learning-rate edge: then every interval counts. Whatever the widths,
what the goal waits for at a fitted point (a best setting short of ``min_seeds``, a best lr at an edge the grid can
pass, an untried lr towards a diverged neighbour; a counted bin's point short of seeds) is ranked first like
brackets (:func:`_goal_blockers`): the goal cannot be met without those trials, and a one-seed point inflates the
interval the others are scored against.

Candidates, and their rows:

- ``seed``: another seed of a batch size's best setting (up to ``Space.max_seeds``): the row ``g(B)``. Then of the
  tried settings next to it (the bootstrap re-takes the best setting, so a close neighbour can be it): the row
  ``g(B)``, its narrowing in each interval's model weighted by the probability that the neighbour is the best
  there, ``P = Φ((m_best - m_nbr) / sqrt(σ² (1/k_best + 1/k_nbr)))`` (:func:`p_better`: a normal approximation
  to the difference of the two settings' mean log steps to that model's target over their ``k`` finished seeds,
  ``σ²`` the model's pooled per-seed variance); ``P = 1`` where the neighbour is that model's best (another
  target's or bin's), ``0`` where one of its seeds has not reached the target (diverged, or stopped above it),
  none has finished, or the model has no point at that batch size. A far-worse neighbour's seed is then worth
  about nothing, and a near-tie's about half a seed at the best.
- ``lr_edge``: the next grid learning rate beyond the tried edge where the point is ``lr_at_edge``: until it is
  tried the point may be biased, so its value is the point's whole weight (the narrowing from its row).
- ``lr_refine``: an untried grid learning rate between the best and its tried neighbour: the row ``g(B)``.
- ``batch_size``: an untried batch size of the space (between the fitted ones, or beyond them: most valuable where
  the answer is ``extrapolated``), at the grid lr nearest the log-log interpolation of its neighbours' best lrs:
  the row ``g(B)``, costed as ``NEW_B_TRIALS`` trials (a new batch size needs its learning rate bracketed).
- ``bracket``: a batch size without a fitted point (its finished trials reached no target): the next untried lr,
  below the tried ones if all diverged, above otherwise. Ranked before every scored candidate (the fit needs the
  point). Not while a trial at that batch size is still running: a new batch size's first trial, pending, has no
  point yet, and bracketing it then spent a second trial there before the first had said anything.

Pending trials are counted as done (their rows added to ``F``) before candidates are scored, and several trials
are chosen greedily, each added as pending before the next is picked, so concurrency stays full.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import special

from analysis.core import metrics as m
from analysis.decisions.bin_goals import BinInterval, bin_intervals, rel_width, untrusted_text
from analysis.fits import flags as fl
from analysis.fits import pareto
from analysis.fits.steps import final_losses, steps_to_target
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs, runs_subset

SIGMA2_FLOOR = 1e-4  # per-seed variance of log steps never taken below (1% sd): no candidate is worth nothing
DESIGN_BATCH_SIZES = 4  # the initial design spans the space with this many batch sizes
NEW_B_TRIALS = 3  # a new batch size is costed as this many trials (its lr bracketed)
CONFIRM_BOOTSTRAP = 1000  # resamples of the refit that confirms a stop on the goal (bcrit analyze's default)
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
    ``bins``: and every trusted timestep bin's at every target (analysis.decisions.bin_goals)."""

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


def initial_design(space: Space) -> list[Trial]:
    """Seed 0 at the three middle learning rates of the grid (fewer if it is smaller), at ``DESIGN_BATCH_SIZES``
    batch sizes spanning the space (its smallest, its largest, evenly spaced between them by index)."""
    mid = len(space.lrs) // 2
    lrs = space.lrs[max(mid - 1, 0) : mid + 2]
    n = len(space.batch_sizes)
    idx = np.unique(np.round(np.linspace(0, n - 1, min(n, DESIGN_BATCH_SIZES))).astype(int))
    return [Trial(space.batch_sizes[i], lr, 0) for i in idx for lr in lrs]


def spent_examples(runs: Runs) -> np.ndarray:
    """Examples each trial of ``runs`` processed (its largest reported ``examples``; 0 without rows)."""
    out = np.zeros(len(runs.trial_ids))
    if runs.metrics.num_rows == 0:
        return out
    g = runs.metrics.group_by("trial_id").aggregate([("examples", "max")])
    row = {t: i for i, t in enumerate(runs.trial_ids)}
    for t, e in zip(g.column("trial_id").to_pylist(), g.column("examples_max").to_pylist(), strict=True):
        if t in row and e is not None:
            out[row[t]] = float(e)
    return out


def _not_ended(runs: Runs | None, spent: np.ndarray) -> tuple[Runs | None, np.ndarray]:
    """``runs`` without the trials a stop on the goal ended (``ended_at_goal``; None when none is left), and
    ``spent`` (:func:`spent_examples` of ``runs``) of the trials kept."""
    if runs is None:
        return None, spent
    keep = runs.status != m.STATUS_ENDED
    if keep.all():
        return runs, spent
    if not keep.any():
        return None, spent[keep]
    return runs_subset(runs, [t for t, k in zip(runs.trial_ids, keep, strict=True) if k]), spent[keep]


def _tried(runs: Runs | None, pending: list[Trial]) -> list[Trial]:
    out = list(pending)
    if runs is not None and len(runs.trial_ids):
        lr = runs.trials.column("lr").to_numpy().astype(float)
        seed = pc.cast(runs.trials.column("seed"), pa.int64()).to_numpy()
        out += [Trial(int(b), float(x), int(s)) for b, x, s in zip(runs.batch_size, lr, seed, strict=True)]
    return out


def _same_lr(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _next_seed(tried: list[Trial], b: int, lr: float) -> int:
    used = {t.seed for t in tried if t.batch_size == b and _same_lr(t.lr, lr)}
    return next(s for s in range(len(used) + 1) if s not in used)


class _Model:
    """The linearized fit of one target (module docstring): rows, weights, ``Var log B_crit``."""

    def __init__(self, fit: dict, sigma2: float):
        self.s_min, self.e_min, self.sigma2 = fit["s_min"], fit["e_min"], sigma2
        self.width = rel_width(fit)
        self.F = np.zeros((2, 2))
        for p in fit["points"]:
            self.add(p["batch_size"], p["seeds"])

    def row(self, b: float) -> np.ndarray:
        return np.array([self.s_min, self.e_min / b]) / (self.s_min + self.e_min / b)

    def add(self, b: float, k: float = 1.0) -> None:
        g = self.row(b)
        self.F += k / self.sigma2 * np.outer(g, g)

    def var(self, F: np.ndarray | None = None) -> float:
        F = self.F if F is None else F
        a = np.array([-1.0, 1.0])
        if np.linalg.det(F) < 1e-12 * max(float(np.trace(F)) ** 2, 1e-300):
            return np.inf  # singular, or not positive definite (more seeds removed at a B than this fit holds)
        return float(a @ np.linalg.solve(F, a))

    def narrowing(self, b: float, k: float = 1.0, remove: bool = False) -> float:
        """Expected drop of the relative half-width from adding (or, ``remove``: the value of) ``k`` seeds at b."""
        g = self.row(b)
        dF = k / self.sigma2 * np.outer(g, g)
        v = self.var()
        if remove:  # the point's value: the width with it vs without it
            v_without = self.var(self.F - dF)
            return self.width if not np.isfinite(v_without) else self.width * (1 - np.sqrt(v / v_without))
        if not np.isfinite(v):
            return self.width if np.isfinite(self.width) else 1.0
        return self.width * (1 - np.sqrt(self.var(self.F + dF) / v))


def _target_steps(runs: Runs, fit: dict, metric: str) -> np.ndarray:
    """Every trial's steps to the fit's target on ``metric`` (inf: not reached)."""
    return steps_to_target(runs.series(metric), len(runs.trial_ids), [fit["target"]])[0]


def p_better(mean_a: float, k_a: int, mean_b: float, k_b: int, sigma2: float) -> float:
    """P(setting a's true mean log steps < setting b's) under a normal approximation: ``Φ((mean_b - mean_a) /
    sqrt(σ² (1/k_a + 1/k_b)))`` from the measured means of log steps over ``k_a`` and ``k_b`` seeds."""
    z = (mean_b - mean_a) / np.sqrt(sigma2 * (1.0 / k_a + 1.0 / k_b))
    return float(0.5 * special.erfc(-z / np.sqrt(2.0)))


def _p_best(runs: Runs, steps: np.ndarray, fit: dict, b: int, lr: float, sigma2: float) -> float:
    """P that the tried setting (b, lr) is the best at b in this fit (module docstring, ``seed``): 1 at the fit's
    best lr; against it, :func:`p_better` on the finished seeds; 0 where a seed of (b, lr) has not reached the
    target (diverged, or stopped above it), where none has finished, or where the fit has no point at b."""
    best = next((p for p in fit["points"] if p["batch_size"] == b), None)
    if best is None:
        return 0.0
    if _same_lr(best["lr"], lr):
        return 1.0
    lrs = runs.trials.column("lr").to_numpy().astype(float)
    mine = [i for i in range(len(runs.trial_ids)) if runs.batch_size[i] == b and _same_lr(lrs[i], lr)]
    x = steps[mine]
    y = steps[[runs.trial_ids.index(t) for t in best["trial_ids"]]]
    if not len(x) or not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
        return 0.0
    return p_better(float(np.log(x).mean()), len(x), float(np.log(y).mean()), len(y), sigma2)


def _sigma2(runs: Runs, fit: dict, metric: str, steps: np.ndarray | None = None) -> float:
    """Pooled per-seed variance of log steps at this target over settings with >= 2 seeds (else the fit's mean
    squared log residual), floored at SIGMA2_FLOOR."""
    steps = _target_steps(runs, fit, metric) if steps is None else steps
    ss, dof = 0.0, 0
    for p in fit["points"]:
        rows = [runs.trial_ids.index(t) for t in p["trial_ids"]]
        x = np.log(steps[rows])
        if len(x) >= 2 and np.all(np.isfinite(x)):
            ss, dof = ss + float(((x - x.mean()) ** 2).sum()), dof + len(x) - 1
    if dof == 0:
        b = np.array([p["batch_size"] for p in fit["points"]], float)
        s = np.array([p["steps"] for p in fit["points"]], float)
        r = np.log(s) - np.log(fit["s_min"] + fit["e_min"] / b)
        return max(float(np.mean(r**2)) * len(r) / max(len(r) - 2, 1), SIGMA2_FLOOR)
    return max(ss / dof, SIGMA2_FLOOR)


def next_trials(
    runs: Runs | None,
    space: Space,
    goal: Goal,
    budget: Budget,
    pending: tuple[Trial, ...] | list[Trial] = (),
    n: int = 1,
    metric: str = m.EVAL_LOSS,
    bootstrap: int = CONFIRM_BOOTSTRAP,
    seed: int = 0,
    confirm_bootstrap: int = CONFIRM_BOOTSTRAP,
    end_pending: bool = False,
    hold: bool = True,
) -> Decision:
    """Refit the runs at the goal targets and choose up to ``n`` next trials, or say why the sweep stops.

    ``bootstrap``: the resamples of each refit. ``confirm_bootstrap``: when that refit meets the goal with no trial
    pending, the goal is checked again on a refit with this many (``bcrit analyze``'s default); the sweep stops only
    if it holds there too, else it goes on from the confirming refit (module docstring, "Stopping").
    ``end_pending``: the caller ends the pending trials at a stop on the goal (their status ``ended_at_goal``), so a
    goal met on the finished trials is confirmed and taken with trials pending, instead of waiting for them. Trials
    of ``runs`` with that status count as spent (examples and trials) and are otherwise left out. ``hold``: choose
    nothing while the pending trials are expected to meet the goal (module docstring, "Holding")."""
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
        _refit(dec, runs, goal, metric, bootstrap, seed)
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
        if confirm_bootstrap > bootstrap:  # the stop is taken on a refit as large as bcrit analyze's
            _refit(dec, runs, goal, metric, confirm_bootstrap, seed)
            dec.confirmed, fits = confirm_bootstrap, dec.fits
        if _goal_met(fits, goal, space, judged) and _bins_met(dec.bins, goal):
            dec.stop = GOAL_MET
            return dec
    if hold and _pending_meet_goal(goal, fits, dec.bins, space, pending, tried, cost):
        dec.holding = True  # another trial now would be waited for, or ended, by the stop they are expected to bring
        return dec
    for _ in range(n):
        c = _best_candidate(runs, space, goal, fits, tried, cost, metric, dec.bins)
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


def _pending_meet_goal(goal: Goal, fits: list[dict], bins: list[BinInterval], space: Space, pending: list[Trial],
                       tried: list[Trial], cost: _Cost) -> bool:  # fmt: skip
    """Whether the trials running are expected to meet the goal without another one ("Holding", module docstring):
    every goal target fitted, nothing the goal waits for left untried (:func:`_goal_blockers`, the pending trials
    counted as tried: they finish while the sweep holds), the counted bins met (``Goal.bins``; their narrowing is not
    predicted), and every global interval still too wide expected within ``rel_ci`` once the pending seeds at its
    points' best settings join it: ``w_now sqrt(v'/v)`` in its linearized model. Pending trials at other settings,
    or at batch sizes without a point, are expected to add nothing (so the rule holds less often, not more)."""
    if not pending or len(fits) < len(goal.targets) or not _bins_met(bins, goal):
        return False
    if _goal_blockers(fits, [b.fit for b in bins if b.counted], goal, space, tried, cost):
        return False
    for f in fits:
        w = rel_width(f)
        if w <= goal.rel_ci:
            continue
        mdl = _Model(f, 1.0)  # every row has the same per-seed variance, which cancels in v'/v
        v = mdl.var()
        best = {p["batch_size"]: p["lr"] for p in f["points"]}
        for t in pending:
            if t.batch_size in best and _same_lr(t.lr, best[t.batch_size]):
                mdl.add(t.batch_size)
        if not (np.isfinite(w) and np.isfinite(v)) or w * np.sqrt(mdl.var() / v) > goal.rel_ci:
            return False
    return True


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


class _Cost:
    """Expected examples of a trial at batch size b (module docstring)."""

    def __init__(self, runs: Runs | None, spent: np.ndarray, space: Space):
        self.by_b: dict[int, float] = {}
        self.mean = float(np.mean(spent[spent > 0])) if np.any(spent > 0) else 1.0
        self.runs, self.spent = runs, spent
        if runs is not None:
            for b in np.unique(runs.batch_size):
                e = spent[(runs.batch_size == b) & (spent > 0)]
                if len(e):
                    self.by_b[int(b)] = float(np.mean(e))

    def of(self, b: int, fits: list[dict]) -> float:
        if b in self.by_b:
            return self.by_b[b]
        if not fits:
            return self.mean
        f = max(fits, key=lambda f: f["s_min"] + f["e_min"] / b)  # the hardest target sets the trial's length
        ratio = [self.by_b[p["batch_size"]] / (p["batch_size"] * p["steps"]) for p in f["points"]
                 if p["batch_size"] in self.by_b]  # fmt: skip
        return float(b * (f["s_min"] + f["e_min"] / b) * (np.median(ratio) if ratio else 1.0))


def _goal_met(fits: list[dict], goal: Goal, space: Space, tried: list[Trial]) -> bool:
    if len(fits) < len(goal.targets):
        return False
    for f in fits:
        if not rel_width(f) <= goal.rel_ci:
            return False
        for p in f["points"]:
            short, edge, between = _point_waits(p, goal, space, tried)
            if short or edge is not None or between:
                return False
    return True


def _point_waits(p: dict, goal: Goal, space: Space, tried: list[Trial]) -> tuple[bool, float | None, list[float]]:
    """What the goal waits for at one fitted point: ``(fewer seeds than it needs (:func:`_seeds_needed`), the grid lr
    past its edge where it is lr_at_edge and the grid goes further, the untried grid lrs between its best and a tried
    neighbour where it is lr_at_divergence: the optimum lies towards a diverged lr)``. ``tried``: the trials that
    count as tried (the pending ones included, unless a stop ends them)."""
    b, lr = p["batch_size"], p["lr"]
    edge = _beyond_edge(space, tried, b, lr) if fl.LR_AT_EDGE in p["flags"] else None
    between = _refine(space, tried, b, lr) if fl.LR_AT_DIVERGENCE in p["flags"] else []
    return p["seeds"] < _seeds_needed(p, goal, space), edge, between


def _seeds_needed(p: dict, goal: Goal, space: Space) -> int:
    """Seeds the goal needs at a fitted point's best setting: ``min_seeds``; ``max_seeds`` where the point is
    ``near_floor``. That flag is judged on the median over the point's seeds of their crossing jitter
    (analysis.fits.trust): with two seeds the mean of two, which flags points the grid's three seeds do not (on 83
    replayed tiny-DiT sweeps, 9 to 14 of 132 answers flagged ``near_floor`` at the stop where the grid's were not);
    another seed settles it as the grid's would."""
    if fl.NEAR_FLOOR in p["flags"]:
        return max(goal.min_seeds, space.max_seeds)
    return goal.min_seeds


def _bins_met(bins: list[BinInterval], goal: Goal) -> bool:
    """Goal.bins: bins were reported, and every counted bin is within ``rel_ci`` with ``min_seeds`` at its
    points (its best settings may differ from the global ones). Untrusted bins are not counted (bin_goals)."""
    if not goal.bins:
        return True
    if not bins:
        return False  # asked for per-bin goals, but the trials reported no per-bin eval loss: nothing to check
    return all(not _open_bin(b, goal) for b in bins if b.counted)


def _open_bin(b: BinInterval, goal: Goal) -> bool:
    """A counted bin the goal still waits for: too wide, or too few seeds at one of its points."""
    return not b.width <= goal.rel_ci or any(p["seeds"] < goal.min_seeds for p in b.fit["points"])


def _lrs_at(tried: list[Trial], b: int) -> list[float]:
    return sorted({t.lr for t in tried if t.batch_size == b})


def _beyond_edge(space: Space, tried: list[Trial], b: int, lr: float) -> float | None:
    """The next grid lr beyond the tried range at b on the side where ``lr`` sits; None if none is left, or if
    ``lr`` is no longer at an edge (a pending trial went past it: the flag is the finished trials')."""
    got = _lrs_at(tried, b)
    if _same_lr(lr, got[0]):
        below = [x for x in space.lrs if x < got[0] * (1 - 1e-9)]
        return below[-1] if below else None
    if not _same_lr(lr, got[-1]):
        return None
    above = [x for x in space.lrs if x > got[-1] * (1 + 1e-9)]
    return above[0] if above else None


def _neighbours(tried: list[Trial], b: int, lr: float) -> list[float]:
    """The tried lrs next to ``lr`` at b (the best may be either of them once seeds are averaged)."""
    got = _lrs_at(tried, b)
    i = next(k for k, x in enumerate(got) if _same_lr(x, lr))
    return got[max(i - 1, 0) : i] + got[i + 1 : i + 2]


def _refine(space: Space, tried: list[Trial], b: int, lr: float) -> list[float]:
    """Untried grid lrs between ``lr`` and its tried neighbours at b (the nearest on each side)."""
    got = _lrs_at(tried, b)
    i = next(k for k, x in enumerate(got) if _same_lr(x, lr))
    out = []
    if i > 0:
        mid = [x for x in space.lrs if got[i - 1] * (1 + 1e-9) < x < lr * (1 - 1e-9)]
        out += mid[-1:]
    if i + 1 < len(got):
        mid = [x for x in space.lrs if lr * (1 + 1e-9) < x < got[i + 1] * (1 - 1e-9)]
        out += mid[:1]
    return out


def _lr_for_new_b(space: Space, fit: dict, b: int) -> float:
    """The grid lr nearest the log-log interpolation (or extrapolation from the two nearest) of the fitted best lrs."""
    pb = np.array([p["batch_size"] for p in fit["points"]], float)
    plr = np.array([p["lr"] for p in fit["points"]], float)
    order = np.argsort(np.abs(np.log(pb / b)))[:2]
    x, y = np.log(pb[order]), np.log(plr[order])
    guess = y[0] if len(x) < 2 or x[0] == x[1] else y[0] + (y[1] - y[0]) / (x[1] - x[0]) * (np.log(b) - x[0])
    grid = np.array(space.lrs)
    return float(grid[int(np.argmin(np.abs(np.log(grid) - guess)))])


def _best_candidate(runs, space, goal, fits, tried, cost, metric, bins=()) -> Choice | None:
    """The highest-scoring candidate; None when nothing is left to try. On a tie of scores a seed first, except
    among the trials the goal waits for (score inf): there the learning rates first, a seed last (an lr past the
    edge may move the best setting, and the seed would then have gone to a setting no longer the best)."""
    out = _candidates(runs, space, goal, fits, tried, cost, metric, bins)
    return max(out, key=lambda c: (c.score, (c.kind == "seed") != np.isinf(c.score))) if out else None


def _candidates(runs, space, goal, fits, tried, cost, metric, bins=()) -> list[Choice]:  # long: five kinds
    """Every candidate with its score (module docstring); only the brackets while a batch size has no point."""
    out: list[Choice] = []
    fitted = {p["batch_size"] for f in fits for p in f["points"]}
    done = set(_tried(runs, []))
    for b in space.batch_sizes:  # bracket: a batch size whose finished trials give no fitted point
        if b in fitted or not _lrs_at(list(done), b) or any(t.batch_size == b and t not in done for t in tried):
            continue  # untried, or a trial there still running (it may give the point)
        lr = _bracket_lr(runs, space, tried, b, metric)
        if lr is not None:
            out.append(Choice(Trial(b, lr, 0), "bracket", np.inf, cost.of(b, fits), "no fitted point at this B"))
    if out:
        return [min(out, key=lambda c: c.examples)]
    # what the goal waits for at any fitted point, of a global target or a counted bin, wide or narrow: first
    out += _goal_blockers(fits, [b.fit for b in bins if b.counted], goal, space, tried, cost)
    # the intervals the goal waits for: global targets too wide, counted bins too wide or short of seeds
    unmet = [(f, metric) for f in fits if not rel_width(f) <= goal.rel_ci]
    unmet += [(b.fit, b.metric) for b in bins if b.counted and _open_bin(b, goal)]
    unmet = unmet or [(f, metric) for f in fits] + [(b.fit, b.metric) for b in bins if b.counted]
    steps = [_target_steps(runs, f, mt) for f, mt in unmet]
    models = [_Model(f, _sigma2(runs, f, mt, st)) for (f, mt), st in zip(unmet, steps, strict=True)]
    for mdl in models:  # pending trials count as done
        for t in tried:
            if t.batch_size in fitted and t not in done:
                mdl.add(t.batch_size)
    seen: set[tuple[int, float, str]] = set()
    for f, _ in unmet:
        for p in f["points"]:
            b, lr = p["batch_size"], p["lr"]
            e = cost.of(b, fits)
            if fl.LR_AT_EDGE in p["flags"]:
                x = _beyond_edge(space, tried, b, lr)
                if x is not None and (b, x, "e") not in seen:
                    seen.add((b, x, "e"))
                    gain = sum(mdl.narrowing(b, p["seeds"], remove=True) for mdl in models)
                    out.append(Choice(Trial(b, x, 0), "lr_edge", gain / e, e, f"best lr {lr:g} at the edge"))
            k = p["seeds"] + sum(1 for t in tried if t.batch_size == b and _same_lr(t.lr, lr) and t not in done)
            gain = sum(mdl.narrowing(b) for mdl in models)
            if k < space.max_seeds and (b, lr, "s") not in seen:
                seen.add((b, lr, "s"))
                s = _next_seed(tried, b, lr)
                out.append(Choice(Trial(b, lr, s), "seed", gain / e, e, f"{k} seed(s) at the best setting"))
            for x in _neighbours(tried, b, lr) if k >= space.max_seeds else []:
                kn = sum(1 for t in tried if t.batch_size == b and _same_lr(t.lr, x))
                if kn < space.max_seeds and (b, x, "s") not in seen:
                    seen.add((b, x, "s"))
                    s = _next_seed(tried, b, x)
                    pb = [
                        _p_best(runs, st, mdl_f, b, x, mdl.sigma2)
                        for (mdl_f, _), st, mdl in zip(unmet, steps, models, strict=True)
                    ]
                    g = sum(q * mdl.narrowing(b) for q, mdl in zip(pb, models, strict=True))
                    why = f"{kn} seed(s) at a neighbour of the best (P best {max(pb):.2f})"
                    out.append(Choice(Trial(b, x, s), "seed", g / e, e, why))
            for x in _refine(space, tried, b, lr):
                if (b, x, "r") not in seen:
                    seen.add((b, x, "r"))
                    out.append(Choice(Trial(b, x, 0), "lr_refine", gain / e, e, f"grid lr between {lr:g} and tried"))
    ref = max(fits, key=lambda f: len(f["points"])) if fits else None
    for b in space.batch_sizes:
        if ref is None or _lrs_at(tried, b):
            continue
        e = NEW_B_TRIALS * cost.of(b, fits)
        gain = sum(mdl.narrowing(b) for mdl in models)
        out.append(Choice(Trial(b, _lr_for_new_b(space, ref, b), 0), "batch_size", gain / e, e, "untried batch size"))
    return out


def _goal_blockers(fits: list[dict], bin_fits: list[dict], goal: Goal, space: Space, tried: list[Trial],
                   cost: _Cost) -> list[Choice]:  # fmt: skip
    """The trials the goal waits for whatever the widths (:func:`_goal_met`, :func:`_open_bin`), ranked first (score
    inf, as brackets are: the goal cannot be met without them). At every fitted point of a goal target
    (:func:`_point_waits`): a seed where its best setting has fewer than ``min_seeds``, the lr past an ``lr_at_edge``
    point's edge, the lr between an ``lr_at_divergence`` point's best and its tried neighbour; at every point of a
    counted bin (``bin_fits``): a seed short of ``min_seeds`` (what a bin's goal checks).

    Why first, and not by their expected narrowing: a target already narrow enough gives no candidates of its own,
    so without these the sweep could run out of candidates for the wide targets and stop ``space_exhausted`` with
    them never tried; and a fitted point with one seed gives the seed bootstrap nothing to resample there, so the
    calibrated level rises towards 1 and the interval the candidates are scored against is inflated until its
    second seed runs (on 14 replayed tiny-DiT sweeps, 2 in flight: median 0.43 of the grid's examples at the stop
    against 0.48 when only the narrow targets' points came first; benchmarks/RESULTS.md, "sixth round")."""
    out: list[Choice] = []
    for f, in_bin in [(f, False) for f in fits] + [(f, True) for f in bin_fits]:
        for p in f["points"]:
            b, lr = p["batch_size"], p["lr"]
            at = f"{'bin target' if in_bin else 'target'} {f['target']:g}"
            if in_bin:  # a bin's goal waits for its seeds only (_open_bin)
                short, edge, between = p["seeds"] < goal.min_seeds, None, []
            else:
                short, edge, between = _point_waits(p, goal, space, tried)
            k = sum(1 for t in tried if t.batch_size == b and _same_lr(t.lr, lr))  # pending seeds included
            e = cost.of(b, fits)
            need = goal.min_seeds if in_bin else _seeds_needed(p, goal, space)
            if short and k < min(need, space.max_seeds):
                floor = " (near_floor)" if need > goal.min_seeds else ""
                why = f"{p['seeds']} seed(s) at the best setting at {at}: the goal needs {need}{floor}"
                out.append(Choice(Trial(b, lr, _next_seed(tried, b, lr)), "seed", np.inf, e, why))
            if edge is not None:
                out.append(Choice(Trial(b, edge, 0), "lr_edge", np.inf, e, f"best lr {lr:g} at the edge at {at}"))
            for x in between:
                out.append(Choice(Trial(b, x, 0), "lr_refine", np.inf, e, f"optimum towards a diverged lr at {at}"))
    return list({(c.trial, c.kind): c for c in out}.values())


def _bracket_lr(runs: Runs | None, space: Space, tried: list[Trial], b: int, metric: str) -> float | None:
    """At a batch size without a fitted point: the untried grid lr next to the tried lr whose trial got lowest
    (diverged trials count as the worst), on the side away from the others (below the smallest or above the
    largest tried; an interior best: the nearer untried grid lr on either side); None when nothing is left."""
    got = _lrs_at(tried, b)
    low = _lowest_by_lr(runs, b, metric)
    best = min(low, key=low.get) if low else got[-1]
    below = [x for x in space.lrs if x < best * (1 - 1e-9) and not any(_same_lr(x, g) for g in got)]
    above = [x for x in space.lrs if x > best * (1 + 1e-9) and not any(_same_lr(x, g) for g in got)]
    if _same_lr(best, got[0]) and len(got) > 1:
        return below[-1] if below else None
    if _same_lr(best, got[-1]):
        return above[0] if above else (below[-1] if below else None)
    return (below[-1:] + above[:1] or [None])[0]


def _lowest_by_lr(runs: Runs | None, b: int, metric: str) -> dict[float, float]:
    """Per tried lr at b, the lowest evaluated loss of its finished trials (inf for diverged or unevaluated)."""
    if runs is None or not len(runs.trial_ids):
        return {}
    _, lowest = final_losses(runs.series(metric), len(runs.trial_ids))
    lr = runs.trials.column("lr").to_numpy().astype(float)
    out: dict[float, float] = {}
    for i in np.flatnonzero(runs.batch_size == b):
        v = np.inf if runs.status[i] == m.STATUS_DIVERGED or not np.isfinite(lowest[i]) else float(lowest[i])
        out[float(lr[i])] = min(out.get(float(lr[i]), np.inf), v)
    return out
