"""Where an adaptive sweep's examples go on the tiny DiT, and what stopping the learning-rate neighbours early could
save: the ceiling of issue 44's last lever, measured on recorded trials (benchmarks/RESULTS.md, "replayed").

The adaptive sweep (``bench_adaptive_tiny_replay.replay``: 2 trials in flight, the goal the grid's width at its
trusted targets) spends its examples on three kinds of trial, split here at its stop by the answer's best learning
rates at the goal targets:

- **best**: the best lr's seeds (what the fit reads);
- **neighbour**: one octave from a best lr (what brackets it: ``lr_at_edge``; one seed each);
- **other**: further out (the search's way there).

``stopping.behind`` stops a trial only once it is past every bootstrap replicate of its batch size's best steps, so
a neighbour that is nearly as fast as the best (the tiny DiT's are: 1.1-1.2x) runs to the best's length anyway; a
saving on the neighbours needs a stop *before* the best's steps, on the loss curves. Measured here, and not a rule
of the product:

- **curve stop** ``(f, m)``: a trial stops at its first evaluation at or past ``f`` times the comparator's mean
  steps to the lowest goal target where its loss is above ``(1 + m)`` times every comparator seed's loss at that
  step (linear between evaluations) and above the highest goal target;
- **its saving, optimistic**: each neighbour in the replay stopped so against the final best setting with the seeds
  the sweep ran there (in a live sweep the neighbours often run before the best has its seeds, so less is saved);
  the examples ratio to the grid's with the stopped part of each neighbour removed;
- **no neighbour at the inner batch sizes** (the ceiling of bracketing an inner batch size's best lr by its
  neighbouring batch sizes' instead, were the best lr monotone in B): the examples with the neighbours of every
  batch size but the smallest and the largest removed;
- **whether the grid's best lr is monotone in B** (what bracketing an inner batch size by its neighbours needs),
  per disjoint seed triplet and goal target, with the runner-up lr's steps over the best's;
- **its wrong calls**: over every ordered pair of settings of one batch size in the recordings (each triplet's
  seeds), how often the rule stops a seed of a setting whose seed-mean steps (geometric, as the analysis's) are
  lower than the comparator's at a goal target: a stop the analysis would have to trust, and that would hide a
  faster learning rate.

Steps to a target are the analysis's own (``steps_to_target``, the local crossing fit).

Run (the recordings of bench_adaptive_tiny_replay.py; seeds 6-8 are left out where their grid is not recorded):
    PYTHONPATH=. .venv/bin/python benchmarks/bench_neighbour_share.py --dirs runs/tiny G1 FILL \\
        --triplets 0,1,2 3,4,5 0,3,4 1,4,5 0,2,5 1,2,3 0,4,5 2,3,5
"""

from __future__ import annotations

import argparse

import bench_adaptive_tiny_replay as replay_mod
import numpy as np
import pyarrow.compute as pc

from analysis.core import metrics as m
from analysis.fits.steps import steps_to_target
from analysis.sources.loaders import Series

RULES = ((0.0, 0.05), (0.3, 0.05), (0.5, 0.05), (0.7, 0.05))  # (f, m) of the curve stop


def loss_curves(pool: replay_mod.Pool) -> dict[tuple[int, float, int], np.ndarray]:
    """Every recorded trial's ``eval/loss`` as an (evaluations, 2) array of (step, loss), by (B, lr, seed)."""
    mt = pool.metrics.filter(pc.equal(pool.metrics.column("metric"), m.EVAL_LOSS))
    tid, step, val = (mt.column(c).to_numpy(zero_copy_only=False) for c in ("trial_id", "step", "value"))
    by_id = {t: k for k, t in pool.index.items()}
    out = {}
    for t in np.unique(tid):
        rows = tid == t
        order = np.argsort(step[rows], kind="stable")
        out[by_id[t]] = np.stack([step[rows][order].astype(np.float64), val[rows][order]], axis=1)
    return out


def crossing(c: np.ndarray, y: float) -> float:
    """The curve's steps to ``y`` (``inf``: never) as the analysis takes them: ``steps_to_target``."""
    return float(steps_to_target(Series(np.zeros(len(c), np.int64), c[:, 0], c[:, 1]), 1, [y])[0, 0])


def geomean(steps: list[float]) -> float:
    """The seeds' geometric-mean steps, as the analysis averages a setting's seeds (``inf`` if one never reached)."""
    return float(np.exp(np.mean(np.log(steps))))


def curve_stop(cand: np.ndarray, comp: list[np.ndarray], s_comp: float, f: float, margin: float, hi: float) -> float:
    """The step at which the curve stop ``(f, margin)`` stops ``cand`` against the comparator's seeds ``comp`` (mean
    steps ``s_comp`` to the lowest goal target; ``hi``: the highest goal target); ``inf``: never."""
    for s, loss in cand:
        if s < f * s_comp:
            continue
        ref = [np.interp(s, c[:, 0], c[:, 1]) if s <= c[-1, 0] else np.nan for c in comp]
        if np.isnan(ref).any():
            return float("inf")
        if loss > max(ref) * (1 + margin) and loss > hi:
            return float(s)
    return float("inf")


def split_examples(pool, curves, seeds, keys, ans, targets) -> dict:
    """One replay's examples by kind, and per curve rule what its neighbours would have spent stopped."""
    cost = {k: replay_mod.examples(pool.reveal([k], seeds)) for k in keys}
    out = {"best": 0.0, "neighbour": 0.0, "other": 0.0, "inner": 0.0} | {r: 0.0 for r in RULES}
    for (b, lr, s), ex in cost.items():
        best = [x for x in (ans[y]["best_lr"].get(b) for y in targets) if x]
        octaves = [abs(np.log2(lr / x)) for x in best]
        kind = "best" if min(octaves, default=9) < 1e-6 else "neighbour" if min(octaves, default=9) < 1.01 else "other"
        out[kind] += ex
        if kind != "neighbour":
            continue
        out["inner"] += ex if min(replay_mod.BATCH_SIZES) < b < max(replay_mod.BATCH_SIZES) else 0.0
        cand = curves[(b, replay_mod._lr(lr), seeds[s])]
        for f, mg in RULES:
            stop = 0.0
            for x in best:  # stopped once behind every best lr of the goal targets
                ran = [q for bb, xx, q in keys if bb == b and abs(xx - x) < 1e-12]
                comp = [curves[(b, replay_mod._lr(x), seeds[q])] for q in ran]
                s_comp = float(np.mean([crossing(c, min(targets)) for c in comp]))
                stop = max(stop, curve_stop(cand, comp, s_comp, f, mg, max(targets)))
            out[(f, mg)] += ex * (1 - stop / cand[-1, 0]) if stop < cand[-1, 0] else 0.0
    return out


def wrong_calls(curves, triplets) -> dict:
    """Per curve rule: (pairs, stops, stops of a setting faster than its comparator at a goal target), over the
    seed ``triplets`` (disjoint: each recorded trial once)."""
    out = {r: [0, 0, 0] for r in RULES}
    for seeds in triplets:
        for b in replay_mod.BATCH_SIZES:
            lrs = [x for x in replay_mod.LRS if all((b, replay_mod._lr(x), s) in curves for s in seeds)]
            c = {x: [curves[(b, replay_mod._lr(x), s)] for s in seeds] for x in lrs}
            mean = {(x, y): geomean([crossing(cc, y) for cc in c[x]]) for x in lrs for y in replay_mod.TARGETS}
            for a in lrs:
                s_comp = mean[(a, min(replay_mod.TARGETS))]
                if not np.isfinite(s_comp):
                    continue
                faster = {x: any(mean[(x, y)] < mean[(a, y)] for y in replay_mod.TARGETS) for x in lrs}
                for x in (x for x in lrs if x != a):
                    for cand in c[x]:
                        for r in RULES:
                            out[r][0] += 1
                            if curve_stop(cand, c[a], s_comp, *r, max(replay_mod.TARGETS)) < cand[-1, 0]:
                                out[r][1] += 1
                                out[r][2] += faster[x]
    return out


def grid_best_lrs(curves, seeds) -> dict[float, list[tuple[int, float, float]]]:
    """Per goal target, per batch size of the demo grid at ``seeds``: (B, best lr on the seeds' geometric mean
    steps, the runner-up's steps over the best's)."""
    out = {}
    for y in replay_mod.TARGETS:
        row = []
        for b in replay_mod.BATCH_SIZES:
            lrs = replay_mod.GRID_LRS[b]
            mean = {x: geomean([crossing(curves[(b, replay_mod._lr(x), s)], y) for s in seeds]) for x in lrs}
            order = sorted(lrs, key=lambda x: mean[x])
            row.append((b, order[0], mean[order[1]] / mean[order[0]]))
        out[y] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dirs", nargs="+", required=True)
    ap.add_argument("--triplets", nargs="+", required=True)
    ap.add_argument("--concurrency", type=int, default=2)
    a = ap.parse_args()
    pool = replay_mod.Pool(a.dirs)
    curves = loss_curves(pool)
    triplets = [tuple(int(x) for x in t.split(",")) for t in a.triplets]
    head = ["seeds", "stop", "trials", "examples / grid", "best", "neighbour (inner B)", "other"]
    print("| " + " | ".join(head + [f"neighbours curve-stopped f={f}" for f, _ in RULES]) + " |")
    print("|" + "---|" * (len(head) + len(RULES)))
    ratios = []
    for seeds in triplets:
        grid = pool.reveal(replay_mod.grid_keys(), seeds)
        g_ans, g_ex = replay_mod.answer(grid), replay_mod.examples(grid)
        targets = [y for y in replay_mod.TARGETS if y in g_ans and not g_ans[y]["flags"]]
        if not targets:
            print(f"| {seeds} | skipped: the grid trusts neither target |")
            continue
        rep = replay_mod.replay(pool, seeds, targets, replay_mod.worst(g_ans, targets), 62, a.concurrency)
        ans = replay_mod.answer(pool.reveal(rep["keys"], seeds), targets)
        parts = split_examples(pool, curves, seeds, rep["keys"], ans, targets)
        total = parts["best"] + parts["neighbour"] + parts["other"]
        row = [total / g_ex] + [(total - parts[r]) / g_ex for r in RULES] + [(total - parts["inner"]) / g_ex]
        ratios.append(row)
        cells = [",".join(map(str, seeds)), rep["stop"], str(len(rep["keys"])), f"{row[0]:.3f}"]
        cells += [f"{parts['best'] / g_ex:.3f}", f"{parts['neighbour'] / g_ex:.3f} ({parts['inner'] / g_ex:.3f})"]
        cells += [f"{parts['other'] / g_ex:.3f}"] + [f"{x:.3f}" for x in row[1:-1]]
        print("| " + " | ".join(cells) + " |", flush=True)
    med = np.median(np.array(ratios), axis=0)
    stopped = "; ".join(f"neighbours curve-stopped f={f}: {x:.3f}" for (f, _), x in zip(RULES, med[1:-1], strict=True))
    print(f"\nmedian examples / grid's over {len(ratios)} draws: as run {med[0]:.3f}; {stopped}; "
          f"no neighbour at the inner batch sizes: {med[-1]:.3f}")  # fmt: skip
    print("\n| curve stop (f, m) | pairs x seeds | stopped before their end | of them faster than the comparator |")
    print("|---|---:|---:|---:|")
    disjoint = []  # each recorded trial counted once
    for t in triplets:
        if not any(set(t) & set(d) for d in disjoint):
            disjoint.append(t)
    for r, (n, stopped, wrong) in wrong_calls(curves, disjoint).items():
        print(f"| {r} | {n} | {stopped} | {wrong} |")
    print("\n| seeds | target | the grid's best lr per batch size (runner-up's steps / best's) | monotone in B |")
    print("|---|---:|---|---|")
    for seeds in disjoint:
        for y, row in grid_best_lrs(curves, seeds).items():
            lrs = [x for _, x, _ in row]
            cells = " ".join(f"{b}: {x:g} ({r:.2f})" for b, x, r in row)
            print(f"| {','.join(map(str, seeds))} | {y} | {cells} | {'yes' if lrs == sorted(lrs) else 'no'} |")


if __name__ == "__main__":
    main()
