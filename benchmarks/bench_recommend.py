"""Is `bcrit recommend` right? Leave-one-split-out on a sweep, and the recommendation beside Pollux's goodput optimum.

For every measured split (micro x A x W) of SWEEP_DIR: drop its trials, fit steps (S = S_min + E_min/B) and the
step-time model on the rest, predict its training seconds to TARGET, and compare with what its trials measured
(wall_time at the crossing, best lr, geometric mean over seeds). The same for Pollux's prediction (S ∝ 1 + φ/B,
φ = B_simple at the target). Then, over the measured splits: the one each method would pick and its measured time.

    python benchmarks/bench_recommend.py SWEEP_DIR [--target LOSS] [--bootstrap 400]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from analysis.features.recommend import recommend, throughput
from analysis.sources import loaders
from tests.oracles import recommend_check as ck


def name(s) -> str:
    return "x".join(str(int(v)) for v in s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep_dir")
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--metric", default="eval/loss")
    ap.add_argument("--bootstrap", type=int, default=400)
    a = ap.parse_args()
    runs = loaders.load_sweep_dir(a.sweep_dir)
    times = throughput.measured_splits(runs)
    meas = ck.measured_times(runs, a.metric, a.target)
    print(f"sweep {a.sweep_dir}, {a.metric} {a.target:g}: leave-one-split-out (training seconds to the target)")
    print("| held-out split | B | measured s | predicted s [90%] | in interval | pred/meas | Pollux s | Pollux/meas |")
    print("|:---:|---:|---:|---:|:---:|---:|---:|---:|")
    ours, theirs, inside = [], [], []
    for s in times.splits:
        row = ck.holdout(runs, a.metric, a.target, tuple(s), n_boot=a.bootstrap)
        m = (row.get("measured") or {}).get("seconds", float("nan"))
        if "error" in row:
            print(f"| {name(s)} | {int(np.prod(s))} | {m:.3g} | not predictable: {row['error'][:90]} | | | | |")
            continue
        lo, hi = row["predicted_ci"]
        ok = lo <= m <= hi
        inside.append(ok)
        ours.append(math.log(row["predicted_s"] / m))
        pol = row.get("pollux_s", float("nan"))
        theirs.append(math.log(pol / m))
        ext = " (extrap.)" if row["extrapolated"] else ""
        print(
            f"| {name(s)} | {int(np.prod(s))} | {m:.3g} | {row['predicted_s']:.3g} [{lo:.3g}, {hi:.3g}]{ext} | "
            f"{'yes' if ok else 'no'} | {row['predicted_s'] / m:.2f} | {pol:.3g} | {pol / m:.2f} |"
        )
    rms = lambda x: float(np.sqrt(np.mean(np.square(x)))) if x else float("nan")  # noqa: E731
    print(
        f"\nheld-out splits predicted: {len(ours)}; in the 90% interval: {sum(inside)} of {len(inside)}; "
        f"rms log error: bcrit {rms(ours):.3f}, Pollux {rms(theirs):.3f} (ratio {rms(theirs) / rms(ours):.2f})"
    )
    fit = recommend.fit_steps(runs, a.metric, a.target, a.bootstrap)
    p = recommend.plan(fit, times, times.splits, a.metric)
    bs = recommend.b_simple_at_target(runs, a.metric, a.target)
    j = recommend.pollux_choice(p, bs)
    best = min(meas, key=lambda k: meas[k]["seconds"])
    ours_s = meas[tuple(p.splits[p.fastest])]["seconds"]
    print(
        f"over the measured splits: bcrit picks {name(p.splits[p.fastest])} (measured {ours_s:.3g} s), "
        f"Pollux (B_simple {bs:.3g} vs B_crit {fit.e_min / fit.s_min:.3g}) picks {name(p.splits[j])} "
        f"(measured {meas[tuple(p.splits[j])]['seconds']:.3g} s); measured fastest: {name(best)} "
        f"({meas[best]['seconds']:.3g} s)"
    )
    ranking(runs, fit, times, meas, bs)


def ranking(runs, fit, times, meas: dict, b_simple: float) -> None:
    """Over the measured splits: how well each model's predicted times (from the whole sweep) order the measured
    ones (Spearman), and their rms log error against them."""
    from scipy.stats import spearmanr

    p = recommend.plan(fit, times, times.splits)
    keys = [tuple(s) for s in p.splits.tolist()]
    m = np.array([meas.get(k, {}).get("seconds", np.nan) for k in keys])
    pol = recommend.pollux_times(fit, b_simple, p.batch_size, p.step_s)
    ok = np.isfinite(m)
    for label, pred in (("bcrit", p.time_s), ("Pollux", pol)):
        rho = spearmanr(pred[ok], m[ok]).statistic
        err = float(np.sqrt(np.mean(np.log(pred[ok] / m[ok]) ** 2)))
        n = int(ok.sum())
        print(f"{label}: Spearman(predicted, measured) over {n} measured splits {rho:.2f}, rms log error {err:.3f}")


if __name__ == "__main__":
    main()
