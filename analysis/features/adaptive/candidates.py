"""The trials to choose from: the initial design, brackets, and the candidates scored by narrowing per example."""

from __future__ import annotations

import numpy as np

from analysis.features.adaptive.bin_goals import rel_width
from analysis.features.adaptive.decision import Choice, Space, Trial
from analysis.features.adaptive.goal_checks import _goal_blockers, _open_bin
from analysis.features.adaptive.ledger import _next_seed, _seeds_at, _tried
from analysis.features.adaptive.lr_moves import _beyond_edge, _bracket_lr, _lr_for_new_b, _lrs_at, _neighbours, _refine
from analysis.features.adaptive.narrowing import _Model, _p_best, _sigma2, _target_steps
from analysis.fits import flags as fl

DESIGN_BATCH_SIZES = 4  # the initial design spans the space with this many batch sizes
NEW_B_TRIALS = 3  # a new batch size is costed as this many trials (its lr bracketed)


def initial_design(space: Space) -> list[Trial]:
    """Seed 0 at the three middle learning rates of the grid (fewer if it is smaller), at ``DESIGN_BATCH_SIZES``
    batch sizes spanning the space (its smallest, its largest, evenly spaced between them by index)."""
    mid = len(space.lrs) // 2
    lrs = space.lrs[max(mid - 1, 0) : mid + 2]
    n = len(space.batch_sizes)
    idx = np.unique(np.round(np.linspace(0, n - 1, min(n, DESIGN_BATCH_SIZES))).astype(int))
    return [Trial(space.batch_sizes[i], lr, 0) for i in idx for lr in lrs]


def _best_candidate(runs, space, goal, fits, tried, cost, metric, bins=()) -> Choice | None:
    """The highest-scoring candidate; None when nothing is left to try. On a tie of scores a seed first, except
    among the trials the goal waits for (score inf): there the learning rates first, a seed last (an lr past the
    edge may move the best setting, and the seed would then have gone to a setting no longer the best)."""
    out = _candidates(runs, space, goal, fits, tried, cost, metric, bins)
    return max(out, key=lambda c: (c.score, (c.kind == "seed") != np.isinf(c.score))) if out else None


def _candidates(runs, space, goal, fits, tried, cost, metric, bins=()) -> list[Choice]:  # long: five kinds
    """Every candidate with its score (docs/sweeps.md, "The decision rule"); only the brackets while a batch size
    has no point."""
    out: list[Choice] = []
    fitted = {p["batch_size"] for f in fits for p in f["points"]}
    done = set(_tried(runs, []))
    pending = [t for t in tried if t not in done]
    for b in space.batch_sizes:  # bracket: a batch size whose finished trials give no fitted point
        if b in fitted or not _lrs_at(list(done), b) or any(t.batch_size == b for t in pending):
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
        for t in pending:
            if t.batch_size in fitted:
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
            k = p["seeds"] + len(_seeds_at(pending, b, lr))
            gain = sum(mdl.narrowing(b) for mdl in models)
            if k < space.max_seeds and (b, lr, "s") not in seen:
                seen.add((b, lr, "s"))
                s = _next_seed(tried, b, lr)
                out.append(Choice(Trial(b, lr, s), "seed", gain / e, e, f"{k} seed(s) at the best setting"))
            for x in _neighbours(tried, b, lr) if k >= space.max_seeds else []:
                kn = len(_seeds_at(tried, b, x))
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
