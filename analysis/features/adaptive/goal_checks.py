"""What the goal waits for: whether it is met, the trials it needs whatever the widths, and holding for the pending."""

from __future__ import annotations

import numpy as np

from analysis.features.adaptive.bin_goals import BinInterval, rel_width
from analysis.features.adaptive.decision import Choice, Goal, Space, Trial, _same_lr
from analysis.features.adaptive.ledger import _Cost, _next_seed, _seeds_at
from analysis.features.adaptive.lr_moves import _beyond_edge, _refine
from analysis.features.adaptive.narrowing import _Model
from analysis.fits import flags as fl


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
    (analysis.fits.trust): with two seeds the mean of two, which flags points the grid's three seeds do not;
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
    second seed runs."""
    out: list[Choice] = []
    for f, in_bin in [(f, False) for f in fits] + [(f, True) for f in bin_fits]:
        for p in f["points"]:
            b, lr = p["batch_size"], p["lr"]
            at = f"{'bin target' if in_bin else 'target'} {f['target']:g}"
            if in_bin:  # a bin's goal waits for its seeds only (_open_bin)
                short, edge, between = p["seeds"] < goal.min_seeds, None, []
            else:
                short, edge, between = _point_waits(p, goal, space, tried)
            k = len(_seeds_at(tried, b, lr))  # pending seeds included
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


def _pending_meet_goal(goal: Goal, fits: list[dict], bins: list[BinInterval], space: Space, pending: list[Trial],
                       tried: list[Trial], cost: _Cost) -> bool:  # fmt: skip
    """Whether the trials running are expected to meet the goal without another one (holding; docs/sweeps.md, "The
    decision rule"): every goal target fitted, nothing the goal waits for left untried (:func:`_goal_blockers`, the
    pending trials counted as tried: they finish while the sweep holds), the counted bins met (``Goal.bins``; their
    narrowing is not predicted), and every global interval still too wide expected within ``rel_ci`` once the
    pending seeds at its points' best settings join it: ``w_now sqrt(v'/v)`` in its linearized model. Pending
    trials at other settings, or at batch sizes without a point, are expected to add nothing (so the rule holds
    less often, not more)."""
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
