"""Branched critical batch size (bcrit branch) against the full-grid B_crit (bcrit sweep) at one target loss, and
what each cost in training examples.

    .venv/bin/bcrit sweep examples/tiny.yaml && .venv/bin/bcrit branch examples/branched-tiny.yaml
    .venv/bin/python benchmarks/bench_branched_vs_grid.py --grid runs/tiny --branched runs/branched-tiny

The branch point compared is the one whose reference loss is nearest the target (``--target``, default: that
point's loss, so the grid is read exactly where the branches started). Besides the study's tolerances it reports
the branched answer at ``ε* = L_1(Δ/2) / L_1(Δ) - 1`` (from the k = 1 branches): the loss excess of training with
half the examples, i.e. McCandlish's definition of B_crit (twice the examples of the small-batch limit) put in
the branched rule's terms, and the grid's own *local* answer over the stretch the branches train through: the band
``B_crit`` between the point's loss and the ``k = 1`` branches' loss after ``Δ`` (analysis.fits.band; the grid's trials
must run that far down: set its ``stopping.target_loss`` below it). Both sets of runs must share the held-out set
(same dataset, eval_size, eval_repeats, timestep_bins)."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from analysis.core import metrics as m
from analysis.fits import branched as br
from analysis.fits.band import band_b_crit
from analysis.fits.pareto import TooFewBatchSizesError
from analysis.fits.sweep_fit import analyze_metric
from analysis.reporting.branch_report import settings
from analysis.sources.loaders import load_sweep_dir


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def examples_of(runs) -> float:
    """Examples trained by every trial of a sweep (last eval step x batch size)."""
    s = runs.series(m.EVAL_LOSS)
    ends = np.flatnonzero(np.append(s.trial[1:] != s.trial[:-1], True))
    return float((s.step[ends] * runs.batch_size[s.trial[ends]]).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", required=True, help="sweep directory (bcrit sweep)")
    p.add_argument("--branched", required=True, help="branched study directory (bcrit branch)")
    p.add_argument("--target", type=float, default=None, help="target eval/loss (default: the point's loss)")
    p.add_argument("--bootstrap", type=int, default=1000)
    args = p.parse_args()

    runs_b = load_sweep_dir(args.branched)
    kw = settings(runs_b)
    res = br.analyze(runs_b, bootstrap=args.bootstrap, **kw)
    pts = [q for q in res["points"] if q["loss_at_point"] is not None]
    if args.target is None:  # default: the middle branch point, the grid read at its loss
        pick = pts[len(pts) // 2]
        target = pick["loss_at_point"]
    else:
        pick = min(pts, key=lambda q: abs(q["loss_at_point"] - args.target))
        target = args.target
    runs_g = load_sweep_dir(args.grid)
    g = analyze_metric(runs_g, m.EVAL_LOSS, [target], bootstrap=args.bootstrap)[0]
    study = br.study_of(runs_b, kw.get("delta"))
    j = int(np.searchsorted(study.points, pick["branch_step"]))
    one = int(np.flatnonzero(np.isclose(study.ks, 1.0))[0])
    at_delta = br.end_losses(runs_b, study, m.EVAL_LOSS, 0.0)[j, one]  # (S,) k = 1, evaluation at Δ
    at_half = br.end_losses(runs_b, dataclasses.replace(study, delta=study.delta // 2), m.EVAL_LOSS, 0.0)[j, one]
    if np.isnan(at_half).all():
        raise SystemExit("the branches have no evaluation at Δ/2 (branches.evals odd); eps* needs one")
    eps_star = float(np.nanmean(at_half) / np.nanmean(at_delta) - 1)
    full = br.end_losses(runs_b, study, m.EVAL_LOSS, kw.get("window", 0.0))[j]  # (K, S) as the study smooths
    star = br.critical_k(study.ks, full, eps_star, kw.get("compare", "reference"), args.bootstrap)
    point_cost = int(pick["branch_step"]) * study.b0 + int((study.rows[j] >= 0).sum()) * study.delta
    grid_cost = examples_of(runs_g)
    print(f"target eval/loss {target:.4g} (reference loss at step {pick['branch_step']}: {pick['loss_at_point']:.4g})")
    lo, hi = g["b_crit_ci"]
    print(f"grid      B_crit = {g['b_crit']:.3g}  90% CI [{lo:.3g}, {hi:.3g}]   cost {grid_cost:.0f} examples")
    for a in pick["by_epsilon"]:
        lo, hi = a["b_crit_ci"]
        print(
            f"branched  eps={a['epsilon']:<6g} B_crit = {a['b_crit']:.3g}{' (lower bound)' * (a['bound'] == 'lower')}"
            f"  CI [{_f(lo)}, {_f(hi)}]"
        )
    lo, hi = (None if v is None else v * study.b0 for v in star["k_ci"])
    b_star = star["k"] * study.b0
    print(f"branched  eps*={eps_star:.4f} (half the examples) B_crit = {b_star:.3g}  CI [{_f(lo)}, {_f(hi)}]")
    band_hi, band_lo = float(pick["loss_at_point"]), float(np.nanmean(at_delta))
    try:  # the grid's own local answer over the stretch the branches train through (analysis.fits.band)
        bd = band_b_crit(runs_g, m.EVAL_LOSS, band_hi, band_lo, bootstrap=args.bootstrap)
        lo, hi = bd["b_crit_ci"]
        ends = analyze_metric(runs_g, m.EVAL_LOSS, [band_hi, band_lo], bootstrap=0)  # the trust checks of both ends
        names = set(bd["flags"]).union(*(e["flags"] for e in ends))
        flags = f"  flags {', '.join(sorted(names))}" if names else ""
        print(
            f"grid band {band_hi:.4g} -> {band_lo:.4g} (the branches' stretch): B_crit = {bd['b_crit']:.3g}  "
            f"CI [{_f(lo)}, {_f(hi)}]{flags}"
        )
    except TooFewBatchSizesError as e:
        print(f"grid band {band_hi:.4g} -> {band_lo:.4g} (the branches' stretch): not resolved by the grid ({e})")
    print(
        f"cost of this branch point: {point_cost} examples (reference to the point + its branches) = "
        f"{point_cost / grid_cost:.0%} of the grid; whole study {res['cost']['total_examples']} = "
        f"{res['cost']['total_examples'] / grid_cost:.0%}"
    )


if __name__ == "__main__":
    main()
