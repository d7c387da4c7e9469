"""The adaptive sweep under its own stopping rule on the synthetic simulator shapes: coverage and saving (issue 30).

The noisy quadratic model (benchmarks/bench_adaptive.py) gives conservative intervals (the grid's hold the truth
30/30), so it cannot show an optional-stopping bias. The shapes of ``tests/oracles/synth_shapes.py`` give
near-nominal calibrated intervals (benchmarks/RESULTS.md), with a known B_crit globally and in four timestep bins.

Per sweep (seed ``--first-seed + d``): the shape's full grid is drawn (``synth_sweeps.simulate``: every trial is
independent of the others, so a subset of the grid is what a sweep of those trials would have measured), then

- **grid**: the full grid analysed as ``bcrit analyze`` does (``analyze_metric``, calibrated, ``--bootstrap``), at
  automatic targets; the **goal targets** are its two outermost trusted global targets (one if only one is);
- **adaptive**: ``analysis.decisions.next_trials`` chooses ``--concurrency`` trials per refit (a batch-synchronous
  sweep with that many trials in flight; ``--rolling``: that many kept in flight, the oldest finishing first and a
  refit after each, as Tune runs it, the ones still running at a goal met waited for and counted in;
  ``--end-running``: ended and left out of the answer, ``goal.running: end``; ``--no-hold``: trials chosen also
  while the running ones are expected to meet the goal, ``goal.hold: false``), revealed from
  the drawn grid, goal ``rel_ci`` = the grid's own widest
  relative half-width at the goal targets (the width the grid reaches), ``min_seeds`` 2, budget the grid's trial
  count; its finished trials are analysed as the grid's, globally at the goal targets and per bin at the bins'
  automatic targets.

Printed per shape: coverage of the 90% intervals at trusted targets (truth inside), grid vs adaptive, globally and
per bin, over all sweeps and over the sweeps that stopped on ``goal_met``; the adaptive/grid examples and trials
ratios (median, range) and width ratio; the stop reasons.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_adaptive_shapes.py --shapes issue --sweeps 30 [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np

from analysis.core import metrics as m
from analysis.decisions import next_trials as nt
from analysis.fits.sweep_fit import analyze_metric
from analysis.sources.loaders import Runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analysis"))
from benchmarks.bench_adaptive_bins import grid_index, subset, trial_id  # noqa: E402  (the grid revealed trial by trial)
from tests.oracles.synth_shapes import SHAPES  # noqa: E402
from tests.oracles.synth_sweeps import simulate, truth  # noqa: E402


def _hits(runs: Runs, sw, metric: str, targets, bootstrap: int, seed: int) -> list[dict]:
    out = []
    fits = analyze_metric(runs, metric, targets, bootstrap=bootstrap, seed=seed, strict=False, notes=[])
    for f in fits:
        lo, hi = f["b_crit_ci"]
        ok = lo is not None and hi is not None and not f["flags"]
        tr = truth(sw, metric, f["target"])
        out.append({
            "target": f["target"], "trusted": ok, "covered": bool(ok and lo <= tr <= hi),
            "width": (hi - lo) / (2 * f["b_crit"]) if ok else float("inf"),
        })  # fmt: skip
    return out


def _choose(full, space, goal, budget, index, concurrency: int, dec_boot: int, seed: int, rolling: bool,
            end: bool = False, hold: bool = True):  # fmt: skip
    """The trials the rule runs, in order, and those it ended. Batch-synchronous: ``concurrency`` chosen per refit,
    all finished before the next. ``rolling``: ``concurrency`` in flight, the oldest finishing first, a refit after
    each (as Tune runs it); a goal met with trials running waits for them (no new trial starting) and counts them
    in (``goal.running: wait``); with ``end`` the sweep stops and they are ended, left out of the answer
    (``goal.running: end``). At any other stop the ones running finish and are counted."""
    chosen: list[str] = []
    flight: list = []
    while True:
        runs = subset(full, chosen) if chosen else None
        n = concurrency - len(flight) if rolling else concurrency
        dec = nt.next_trials(runs, space, goal, budget, pending=flight, n=n, bootstrap=dec_boot, seed=seed,
                             end_pending=rolling and end, hold=hold)  # fmt: skip
        if not rolling:
            if dec.stop is not None or not dec.choices:
                return chosen, [], dec
            chosen += [trial_id(index, c.trial) for c in dec.choices]
            continue
        flight += [c.trial for c in dec.choices]
        if dec.stop == nt.GOAL_MET and end:
            return chosen, [trial_id(index, t) for t in flight], dec
        if dec.stop is not None or not flight:
            return chosen + [trial_id(index, t) for t in flight], [], dec
        chosen.append(trial_id(index, flight.pop(0)))


def one_sweep(shape: str, seed: int, bootstrap: int, dec_boot: int, concurrency: int, rolling: bool = False,
              end: bool = False, hold: bool = True):  # fmt: skip
    sw = SHAPES[shape]
    full = simulate(np.random.default_rng(seed), sw)
    grid = _hits(full, sw, m.EVAL_LOSS, None, bootstrap, seed)
    trusted = [g for g in grid if g["trusted"]]
    if not trusted:
        return None
    pick = [trusted[0], trusted[-1]] if len(trusted) > 1 else trusted
    targets = [g["target"] for g in pick]
    goal = nt.Goal(tuple(targets), rel_ci=max(g["width"] for g in pick))
    index = grid_index(full)
    space = nt.Space(sw.batch_sizes, sorted({k[1] for k in index}), sw.seeds)
    budget = nt.Budget(trials=len(full.trial_ids))
    chosen, ended, dec = _choose(full, space, goal, budget, index, concurrency, dec_boot, seed, rolling, end, hold)
    runs = subset(full, chosen)
    ada = _hits(runs, sw, m.EVAL_LOSS, targets, bootstrap, seed)
    bins = {"grid": [], "adaptive": []}
    for k in range(len(sw.bins)):
        name = m.per_bin(m.EVAL_LOSS_BIN, k)
        bins["grid"] += _hits(full, sw, name, None, bootstrap, seed)
        bins["adaptive"] += _hits(runs, sw, name, None, bootstrap, seed)
    # an ended trial counted at half its examples (the oldest-first order has no clock; the tiny-DiT replay has one)
    part = 0.5 * float(nt.spent_examples(subset(full, ended)).sum()) if ended else 0.0
    spent = (float(nt.spent_examples(runs).sum()) + part) / float(nt.spent_examples(full).sum())
    g_goal = [g for g in grid if g["target"] in targets]
    return {
        "seed": seed, "stop": dec.stop or nt.EXHAUSTED, "examples_ratio": spent,
        "trials_ratio": (len(chosen) + len(ended)) / len(full.trial_ids), "ended": len(ended),
        "goal_rel_ci": goal.rel_ci,
        "grid": g_goal, "adaptive": ada, "bins": bins,
    }  # fmt: skip


def _cov(rows: list[dict]) -> str:
    t = [r for r in rows if r["trusted"]]
    if not t:
        return "- (0 trusted)"
    c = sum(r["covered"] for r in t)
    return f"{c / len(t):.3f} ({c}/{len(t)}; {len(rows) - len(t)} untrusted)"


def report(shape: str, rows: list[dict], seconds: float) -> None:
    if not rows:
        print(f"### shape {shape}: no sweep had a trusted global target ({seconds:.0f} s): nothing to compare")
        return
    goal = [r for r in rows if r["stop"] == nt.GOAL_MET]
    ratio = np.array([r["examples_ratio"] for r in rows])
    widths = [a["width"] / g["width"] for r in rows for a, g in zip(r["adaptive"], r["grid"], strict=True)
              if a["trusted"] and g["trusted"]]  # fmt: skip
    flat = lambda rs, k: [x for r in rs for x in r[k]]  # noqa: E731
    flatb = lambda rs, k: [x for r in rs for x in r["bins"][k]]  # noqa: E731
    print(f"### shape {shape}: {len(rows)} sweeps ({seconds:.0f} s)")
    print("| scope | sweeps | grid coverage | adaptive coverage |")
    print("|---|---:|---:|---:|")
    print(f"| global, all sweeps | {len(rows)} | {_cov(flat(rows, 'grid'))} | {_cov(flat(rows, 'adaptive'))} |")
    print(
        f"| global, stopped on goal_met | {len(goal)} | {_cov(flat(goal, 'grid'))} | {_cov(flat(goal, 'adaptive'))} |"
    )
    print(f"| per bin, all sweeps | {len(rows)} | {_cov(flatb(rows, 'grid'))} | {_cov(flatb(rows, 'adaptive'))} |")
    print(f"| per bin, stopped on goal_met | {len(goal)} | {_cov(flatb(goal, 'grid'))} | "
          f"{_cov(flatb(goal, 'adaptive'))} |")  # fmt: skip
    tr = np.array([r["trials_ratio"] for r in rows])
    print(f"examples adaptive/grid: median {np.median(ratio):.3f} (range {ratio.min():.3f}-{ratio.max():.3f}); "
          f"trials: median {np.median(tr):.3f}; adaptive/grid width at the goal targets: median "
          f"{np.median(widths):.3f}; goal rel_ci median {np.median([r['goal_rel_ci'] for r in rows]):.3f}; "
          f"stops {dict(collections.Counter(r['stop'] for r in rows))}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["issue"], choices=sorted(SHAPES))
    ap.add_argument("--sweeps", type=int, default=30)
    ap.add_argument("--first-seed", type=int, default=3000)
    ap.add_argument("--bootstrap", type=int, default=400, help="replicates of the final analyses")
    ap.add_argument("--decision-bootstrap", type=int, default=nt.CONFIRM_BOOTSTRAP, help="replicates of each refit")
    ap.add_argument("--concurrency", type=int, default=4, help="trials chosen per refit (in flight with --rolling)")
    ap.add_argument("--rolling", action="store_true", help="keep --concurrency trials in flight, oldest first")
    ap.add_argument("--end-running", action="store_true", help="with --rolling: goal.running: end (end the trials "
                    "running at a goal met, left out of the answer) instead of waiting for them")  # fmt: skip
    ap.add_argument("--no-hold", action="store_true", help="keep choosing trials while the running ones are "
                    "expected to meet the goal (next_trials(hold=False))")  # fmt: skip
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {}
    for shape in a.shapes:
        t0 = time.perf_counter()
        rows = []
        for d in range(a.sweeps):
            r = one_sweep(shape, a.first_seed + d, a.bootstrap, a.decision_bootstrap, a.concurrency, a.rolling,
                          a.end_running, not a.no_hold)  # fmt: skip
            if r is not None:
                rows.append(r)
            print(f"  {shape} sweep {d}: {r and (r['stop'], round(r['examples_ratio'], 3))}", flush=True)
        report(shape, rows, time.perf_counter() - t0)
        out[shape] = rows
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
