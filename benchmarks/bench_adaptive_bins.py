"""Coverage of the adaptive sweep's per-bin intervals under its own stopping rule (``goal.bins: true``).

The noisy quadratic model has no per-bin losses, so this runs on the independent simulator with four timestep bins
(``tests/oracles/synth_sweeps.py``, ``Sweep()`` defaults: 7 batch sizes 32-2048, 5 learning rates, up to 3 seeds,
bins with B_crit about 64, 160, 420 and 1100, trials stopped at a global target). Per repeat (a sweep seed) the
whole grid is drawn once and each trial the decision rule chooses is revealed from it (trials are independent
draws given the sweep's own draw of where the grid falls, so this is the same as drawing them on demand). The rule
(``analysis.decisions.next_trials``, one trial at a time, 1000 bootstrap resamples per refit since 2026-11-27,
200 before; calibrated level) runs with the goal ``rel_ci`` at the global target (at progress ``--progress``)
with ``bins: true`` until it stops.

For the sweeps that stopped on their own goal (``goal_met``) it counts, at the stopping refit, whether each 90%
interval holds the truth: the global one (``Curve.b_crit`` at the target) and every bin interval the goal counted
(``Curve.b_crit`` of the bin at its matched target); untrusted bins are counted apart. The intervals are the
refit's own (what the sweep stopped on; ``bcrit analyze`` then re-fits with 1000 resamples).

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_adaptive_bins.py --repeats 32 --jobs 16 [--rel-ci 0.25]
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np

from analysis.core import metrics as m
from analysis.decisions import next_trials as nt
from analysis.sources.loaders import runs_subset
from tests.oracles.synth_sweeps import Sweep, simulate


def subset(grid, ids: list[str]):
    """The revealed trials of the pre-drawn grid as ``Runs`` (also benchmarks/bench_adaptive_shapes.py)."""
    return runs_subset(grid, ids, source="synth_sweeps (revealed)")


def grid_index(grid) -> dict[tuple[int, float, int], str]:
    """``(batch size, lr rounded to 12 digits, seed) -> trial id`` of every trial of the pre-drawn grid."""
    lr = grid.trials.column("lr").to_numpy()
    seed = grid.trials.column("seed").to_numpy()
    return {(int(b), round(float(x), 12), int(s)): t for b, x, s, t in zip(grid.batch_size, lr, seed, grid.trial_ids,
                                                                         strict=True)}  # fmt: skip


def trial_id(index: dict, t: nt.Trial) -> str:
    """The grid's trial the decision rule chose."""
    return index[(t.batch_size, round(t.lr, 12), t.seed)]


def one_sweep(rep: int, rel_ci: float, progress: float, first_seed: int) -> dict:
    """One adaptive sweep with per-bin goals; its stop and, per interval at the stop, truth, bounds, counted."""
    sw = Sweep()
    grid = simulate(np.random.default_rng(first_seed + rep), sw)
    index = grid_index(grid)
    space = nt.Space(sw.batch_sizes, tuple(sorted({k[1] for k in index})), max_seeds=sw.seeds)
    target = float(sw.curve.loss(progress))
    goal = nt.Goal((target,), rel_ci, bins=True)
    budget = nt.Budget(trials=len(grid.trial_ids))
    ids: list[str] = []
    while True:
        runs = subset(grid, ids) if ids else None
        dec = nt.next_trials(runs, space, goal, budget, n=1, bootstrap=nt.CONFIRM_BOOTSTRAP, seed=rep)
        if dec.stop is not None or not dec.choices:
            break
        ids.append(trial_id(index, dec.choices[0].trial))
    out = {"rep": rep, "stop": dec.stop, "trials": len(ids), "intervals": []}
    for f in dec.fits:
        out["intervals"].append({"what": "global", "truth": sw.curve.b_crit(f["target"]), "ci": f["b_crit_ci"],
                                 "width": nt.rel_width(f), "counted": True, "flags": f["flags"]})  # fmt: skip
    for b in dec.bins:
        truth = sw.bins[b.bin].b_crit(b.bin_target) if b.bin_target is not None else None
        out["intervals"].append({"what": f"bin{b.bin}", "truth": truth, "ci": None if b.fit is None else
                                 b.fit["b_crit_ci"], "width": b.width if np.isfinite(b.width) else None,
                                 "counted": b.counted, "flags": list(b.flags)})  # fmt: skip
    return out


def _covers(iv: dict) -> bool:
    lo, hi = iv["ci"]
    return lo is not None and hi is not None and lo <= iv["truth"] <= hi


def summarize(results: list[dict]) -> dict:
    stops: dict[str, int] = {}
    for r in results:
        stops[str(r["stop"])] = stops.get(str(r["stop"]), 0) + 1
    met = [r for r in results if r["stop"] == nt.GOAL_MET]
    summary = {"sweeps": len(results), "stops": stops, "goal_met": len(met),
               "median_trials_goal_met": float(np.median([r["trials"] for r in met])) if met else None}  # fmt: skip
    for scope in ("global", "bins counted", "bins untrusted (with an interval)"):
        ivs = [iv for r in met for iv in r["intervals"] if
               (iv["what"] == "global" if scope == "global" else iv["what"] != "global" and iv["ci"] is not None
                and iv["counted"] == (scope == "bins counted"))]  # fmt: skip
        cov = [_covers(iv) for iv in ivs]
        summary[scope] = {"intervals": len(ivs), "coverage": float(np.mean(cov)) if cov else None}
    per_bin = {}
    for k in range(4):
        ivs = [iv for r in met for iv in r["intervals"] if iv["what"] == f"bin{k}" and iv["counted"]]
        per_bin[f"bin{k}"] = {"intervals": len(ivs), "coverage": float(np.mean([_covers(iv) for iv in ivs]))
                              if ivs else None}  # fmt: skip
    summary["per bin (counted)"] = per_bin
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=32)
    ap.add_argument("--rel-ci", type=float, default=0.25)
    ap.add_argument("--progress", type=float, default=3.0, help="the goal target: eval/loss at this progress")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    args = [(r, a.rel_ci, a.progress, a.first_seed) for r in range(a.repeats)]
    results = []
    with ProcessPoolExecutor(a.jobs) as ex:
        for fut in as_completed([ex.submit(one_sweep, *x) for x in args]):
            results.append(fut.result())
            r = results[-1]
            print(f"sweep {r['rep']}: {r['stop']} after {r['trials']} trials", flush=True)
    summary = summarize(sorted(results, key=lambda r: r["rep"]))
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "results": results, "args": vars(a), "metric": m.EVAL_LOSS}, f, indent=1)


if __name__ == "__main__":
    main()
