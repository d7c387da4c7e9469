"""The adaptive sweep against the full grid on the noisy quadratic model, with the closed-form truth.

Problem (``examples/quadratic.yaml``'s): dim 1000, ``h_i = i^-0.5``, ``c = h``, ``theta0 = 1``, batch sizes
16/64/256/1024, the 9-point lr grid, 3 seeds, trials stopped at loss 0.3 (or 2000 steps, or diverged); B_crit at
the goal target (default 0.5), truth from ``tests.oracles.nqm.closed_form_b_crit`` on the same lr grid.

Per repeat (a sweep seed):

- **grid**: every (batch size, lr, seed) trial (``simulate_sweep``, 108 trials), analysed by ``analyze_metric``;
- **adaptive**: the decision rule of ``analysis.features.adaptive.next_trials`` choosing one trial at a time
  (``tests.oracles.nqm_adaptive``), goal ``rel_ci`` (default: the grid's median relative half-width over the
  repeats, measured first) at the target, budget the grid's trial count, ``--max-seeds`` per setting;
  the final interval is re-analysed with the grid's bootstrap size (the decisions use ``--decision-bootstrap``).

Printed: coverage of the 90% interval (truth inside), median relative half-width, median examples and trials,
the adaptive/grid examples ratio (per repeat, median), and the stop reasons.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_adaptive.py --repeats 30 [--rel-ci 0.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np

from analysis.core import metrics as m
from analysis.features.adaptive import next_trials as nt
from analysis.fits.sweep_fit import analyze_metric
from tests.oracles.nqm import closed_form_b_crit, simulate_sweep
from tests.oracles.nqm_adaptive import adaptive_sweep

H = np.arange(1, 1001.0) ** -0.5
THETA0 = np.ones(1000)
BATCH_SIZES = (16, 64, 256, 1024)
LRS = (0.2, 0.3, 0.5, 0.8, 1.2, 1.6, 1.85, 1.95, 2.1)
SEEDS = 3
STOP = dict(max_steps=2000, target_loss=0.3, eval_every=1, divergence_factor=10.0)


def _summary(fit: dict | None, truth: float, examples: float, trials: int, **extra) -> dict:
    if fit is None or fit["b_crit_ci"][0] is None:
        return {"covered": False, "width": float("inf"), "examples": examples, "trials": trials, **extra}
    lo, hi = fit["b_crit_ci"]
    return {
        "covered": bool(lo <= truth <= hi), "width": (hi - lo) / (2 * fit["b_crit"]), "b_crit": fit["b_crit"],
        "examples": examples, "trials": trials, "flags": fit["flags"], **extra,
    }  # fmt: skip


def grid(seed: int, target: float, bootstrap: int, truth: float) -> dict:
    runs = simulate_sweep(H, H, THETA0, BATCH_SIZES, LRS, seeds=SEEDS, seed=seed, **STOP)
    fits = analyze_metric(runs, m.EVAL_LOSS, [target], bootstrap, seed, strict=False)
    return _summary(fits[0] if fits else None, truth, float(nt.spent_examples(runs).sum()), len(runs.trial_ids))


def adaptive(seed: int, target: float, rel_ci: float, bootstrap: int, dec_boot: int, truth: float, seeds: int) -> dict:
    space = nt.Space(BATCH_SIZES, LRS, seeds)
    budget = nt.Budget(trials=len(BATCH_SIZES) * len(LRS) * SEEDS)
    runs, dec, _ = adaptive_sweep(H, H, THETA0, space, nt.Goal((target,), rel_ci), budget, seed, dec_boot, **STOP)
    fits = analyze_metric(runs, m.EVAL_LOSS, [target], bootstrap, seed, strict=False)
    ex = float(nt.spent_examples(runs).sum())
    return _summary(fits[0] if fits else None, truth, ex, len(runs.trial_ids), stop=dec.stop)


def _report(name: str, rows: list[dict]) -> None:
    cov = np.mean([r["covered"] for r in rows])
    w = np.median([r["width"] for r in rows])
    print(f"{name}: coverage {cov:.3f} ({sum(r['covered'] for r in rows)}/{len(rows)}), median rel half-width "
          f"{w:.3f}, median examples {np.median([r['examples'] for r in rows]):.4g}, median trials "
          f"{np.median([r['trials'] for r in rows]):g}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--rel-ci", type=float, default=None, help="the adaptive goal (default: the grid's median)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--decision-bootstrap", type=int, default=nt.CONFIRM_BOOTSTRAP)
    ap.add_argument("--max-seeds", type=int, default=SEEDS, help="the adaptive space's seeds per setting")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    truth = closed_form_b_crit(H, H, THETA0**2, a.target, np.array(BATCH_SIZES, float), lrs=np.array(LRS)).b_crit
    print(f"truth B_crit({a.target:g}) = {truth:.4g}")
    seeds = range(a.first_seed, a.first_seed + a.repeats)
    g = [grid(s, a.target, a.bootstrap, truth) for s in seeds]
    _report("grid", g)
    rel = a.rel_ci if a.rel_ci is not None else float(np.median([r["width"] for r in g]))
    ad = [adaptive(s, a.target, rel, a.bootstrap, a.decision_bootstrap, truth, a.max_seeds) for s in seeds]
    _report(f"adaptive (goal rel_ci {rel:.3f})", ad)
    ratio = [x["examples"] / y["examples"] for x, y in zip(ad, g, strict=True)]
    print(f"adaptive/grid examples: median {np.median(ratio):.3f} (range {min(ratio):.3f}-{max(ratio):.3f}); "
          f"stops {dict(collections.Counter(r['stop'] for r in ad))}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"truth": truth, "rel_ci": rel, "grid": g, "adaptive": ad}, f, indent=1)


if __name__ == "__main__":
    main()
