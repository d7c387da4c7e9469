"""Where the low bias in B_crit came from (issue 45), and what the local crossing fit changed: simulated sweeps with a
known answer, analysed with the first passage (the crossing interpolated linearly after the first evaluation at or
below the target) and with the local quadratic fit (:mod:`analysis.fits.crossing`), on the same sweeps.

Per simulator shape (``tests/oracles/synth_shapes.py``; ``evals10`` is issue 45's description: an evaluation every
10 steps at every batch size, 0.4% noise on the loss, trials stopped at the first evaluation at or below a global
target) and per crossing: at the trusted targets the coverage of the (calibrated) 90% interval, the misses by side
(the truth below the interval / above it), the mean and median signed error of B_crit in log; and per batch size the
mean signed error of the fitted points' steps against the exact steps ``tau(y)·(1 + B_crit/B)`` in log, with the
evaluations to the crossing.

    PYTHONPATH=.:tests/analysis .venv/bin/python benchmarks/bench_crossing_bias.py --shapes evals10 --draws 40
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analysis"))

from analysis.core import metrics as m  # noqa: E402
from analysis.fits import steps as steps_mod  # noqa: E402
from analysis.fits import sweep_fit  # noqa: E402


def records(shape: str, draws: int, bootstrap: int, first_seed: int, local: bool, calibrate: bool) -> dict:
    """Per analysed target: scope, trusted, log error, miss side; per fitted point: batch size, log error, evals."""
    from tests.oracles.synth_shapes import SHAPES
    from tests.oracles.synth_sweeps import simulate, truth

    sw = SHAPES[shape]
    tgt, pts = [], []
    patched = functools.partial(steps_mod.steps_to_target, local=local)
    with mock.patch.object(sweep_fit, "steps_to_target", patched):
        for d in range(draws):
            runs = simulate(np.random.default_rng(first_seed + d), sw)
            spacing = {}
            for k in range(len(sw.bins) + 1):
                metric = m.EVAL_LOSS if k == 0 else m.per_bin(m.EVAL_LOSS_BIN, k - 1)
                curve = sw.curve if k == 0 else sw.bins[k - 1]
                res = sweep_fit.analyze_metric(runs, metric, None, bootstrap=bootstrap, seed=d, strict=False,
                                               notes=[], calibrate=calibrate)  # fmt: skip
                if not spacing:
                    _, sp = steps_mod.trial_extent(runs.series(m.EVAL_LOSS), len(runs.trial_ids))
                    spacing = dict(zip(runs.trial_ids, sp, strict=True))
                for r in res:
                    tr = truth(sw, metric, r["target"])
                    lo, hi = (np.nan if c is None else c for c in r["b_crit_ci"])
                    tgt.append((k > 0, not r["flags"], np.log(r["b_crit"] / tr), tr < lo, tr > hi))
                    u = curve.progress(r["target"])
                    for p in r["points"]:
                        exact = curve.s0 * u + curve.e0 * u**curve.q / p["batch_size"]
                        pts.append((k > 0, p["batch_size"], np.log(p["steps"] / exact),
                                    p["steps"] / spacing[p["trial_id"]]))  # fmt: skip
    return {"targets": np.array(tgt, dtype=float), "points": np.array(pts, dtype=float)}


def report(shape: str, rec: dict[str, dict]) -> None:
    print(f"\n### {shape}")
    print("| crossing | scope | trusted targets | coverage | truth below / above the interval | mean / median "
          "signed error (log) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    for name, r in rec.items():
        t = r["targets"]
        for scope in (0, 1):
            sel = (t[:, 0] == scope) & (t[:, 1] == 1)
            if not sel.any():
                continue
            below, above = t[sel, 3].mean(), t[sel, 4].mean()
            print(f"| {name} | {'bins' if scope else 'global'} | {int(sel.sum())} | {1 - below - above:.3f} | "
                  f"{below:.3f} / {above:.3f} ({int(t[sel, 3].sum())} / {int(t[sel, 4].sum())}) | "
                  f"{t[sel, 2].mean():+.4f} / {np.median(t[sel, 2]):+.4f} |")  # fmt: skip
    bs = np.unique(next(iter(rec.values()))["points"][:, 1])
    print("\n| crossing | scope | " + " | ".join(f"B={int(b)}" for b in bs) + " |")
    for name, r in rec.items():
        p = r["points"]
        bs = np.unique(p[:, 1])
        for scope in (0, 1):
            cells = []
            for b in bs:
                sel = (p[:, 0] == scope) & (p[:, 1] == b)
                cells.append(f"{p[sel, 2].mean():+.4f} ({np.median(p[sel, 3]):.0f})" if sel.any() else "-")
            print(f"| {name} | {'bins' if scope else 'global'} | " + " | ".join(cells) + " |")
    print("(per batch size: mean signed log error of the fitted points' steps (median evaluations to the crossing))")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["evals10"])
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--bootstrap", type=int, default=400)
    ap.add_argument("--first-seed", type=int, default=4500)
    ap.add_argument("--no-calibration", action="store_true")
    ap.add_argument("--crossings", nargs="+", default=["first", "local"], choices=["first", "local"])
    a = ap.parse_args()
    for shape in a.shapes:
        t0 = time.perf_counter()
        variants = [v for v in (("first passage", False), ("local fit", True)) if ("local" if v[1] else "first") in
                    a.crossings]  # fmt: skip
        rec = {name: records(shape, a.draws, a.bootstrap, a.first_seed, local, not a.no_calibration)
               for name, local in variants}  # fmt: skip
        report(shape, rec)
        took = time.perf_counter() - t0
        print(f"<!-- {shape}: {a.draws} sweeps, bootstrap {a.bootstrap}, {took:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
