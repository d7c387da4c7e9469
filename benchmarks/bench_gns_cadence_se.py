"""What the sparse global-GNS schedule costs in precision (issue 43): the window's B_simple ± SE at every k-th step.

Gradient noise scale: McCandlish et al. 2018 (arXiv 1812.06162, App. A.1). One reference trial measures global GNS at
every step (``gns_global_every: 1``, mode ``halves``: W = A = 1); a trial at cadence ``k`` would log the same kind of
measurement at every k-th step only (its trajectory differs by float rounding: the skipped steps run one backward
instead of two halves). So each of the ``k`` phases ``p`` (the steps ``s`` with ``(s + 1 - p) % k == 0``) of the
reference is one sparse trial's measurements, and the ``k`` phases are disjoint sets of independent draws along one
trajectory. For a window of ``W`` steps ending at the last step (the live rule, ``analysis.core.gns.window_estimate``):

- ``n``: measurements in the window; ``B_simple``: mean over the phases of each phase's window value (the spread of
  the phases around the every-step value is the estimation noise a sparse trial adds);
- ``SD``: the spread of the phases' values; ``RMS SE``: of the SEs the phases report. An honest SE has SD / RMS SE
  near 1 (within the ~1/sqrt(2k) uncertainty of an SD over k phases);
- ``SE / SE(k=1)``: the precision price, ~sqrt(k) at a fixed window.

    .venv/bin/python benchmarks/bench_gns_cadence_se.py --steps 1600 --windows 100 320 800
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from analysis.core import metrics as M
from analysis.core.gns import g2_unbiased, trace_unbiased, window_estimate
from trainables.config import TrialConfig
from trainables.trial import run_local


def reference_series(steps: int, batch: int, lr: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(step, |G|^2, tr Sigma)`` per step of a tiny trial measuring global GNS (halves) at every step."""
    cfg = TrialConfig(
        preset="tiny", batch_size=batch, micro_batch_size=batch, lr=lr, seed=seed, max_steps=steps,
        eval_every=steps, eval_repeats=1, gns_every=0, gns_global_every=1, timestep_bins=4,
    )  # fmt: skip
    rows = [r for rep in run_local(cfg).reports for r in rep["rows"]]
    cols = {}
    for name in (M.GNS_G2_SMALL, M.GNS_G2_BIG, M.GNS_B_SMALL, M.GNS_B_BIG):
        cols[name] = dict((int(r[0]), r[3]) for r in rows if r[2] == name)
    step = np.array(sorted(cols[M.GNS_G2_SMALL]))
    small, big, b, B = (np.array([cols[n][s] for s in step]) for n in cols)
    return step, g2_unbiased(small, big, b, B), trace_unbiased(small, big, b, B)


def phases(step: np.ndarray, g2: np.ndarray, tr: np.ndarray, k: int, window: int) -> list:
    """The window estimate at the last step of each of the ``k`` phases' measurements."""
    last = int(step[-1])
    inside = step > last - window
    out = []
    for p in range(k):
        keep = inside & ((step - p) % k == 0)  # logged step s (from 1) = 0-based step s - 1: (s - 1 + 1 - p) % k
        out.append(window_estimate(g2[keep], tr[keep]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, nargs="+", default=[1, 5, 10, 20, 40])
    p.add_argument("--windows", type=int, nargs="+", default=[100, 320, 800])
    args = p.parse_args()
    t0 = time.perf_counter()
    step, g2, tr = reference_series(args.steps, args.batch, args.lr, args.seed)
    print(
        f"tiny, digits, B = {args.batch} (halves of {args.batch // 2}), lr {args.lr:g}, seed {args.seed}: {len(step)} "
        f"steps measured in {time.perf_counter() - t0:.0f} s; window ending at step {int(step[-1])}"
    )
    print(f"{'window':>6s} {'k':>3s} {'n':>4s} {'B_simple (mean of phases)':>26s} {'SD':>7s} {'RMS SE':>7s} "
          f"{'SD/SE':>6s} {'SE/SE(k=1)':>10s} {'rel SE':>7s} {'not ok':>6s}")  # fmt: skip
    for window in args.windows:
        base_se = None
        for k in args.k:
            est = phases(step, g2, tr, k, window)
            ok = [e for e in est if e.ok]
            vals = np.array([e.value for e in ok])
            ses = np.array([e.se for e in ok])
            rms = float(np.sqrt(np.mean(ses**2))) if ok else math.nan
            sd = float(vals.std(ddof=1)) if len(ok) > 1 else math.nan
            base_se = rms if k == 1 else base_se
            ratio = rms / base_se if base_se else math.nan
            mean = float(vals.mean()) if ok else math.nan
            print(
                f"{window:6d} {k:3d} {est[0].n:4d} {mean:26.3f} {sd:7.3f} {rms:7.3f} {sd / rms:6.2f} {ratio:10.2f} "
                f"{rms / mean:7.1%} {len(est) - len(ok):6d}"
            )


if __name__ == "__main__":
    main()
