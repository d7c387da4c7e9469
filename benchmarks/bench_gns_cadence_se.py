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

``--accum 2`` measures mode ``micro-batches`` instead (W = 1, A = 2: two micro-batches of B/2, small = each
micro-batch's gradient), the default's cadence k = 4 among ``--k``. Several ``--seeds`` run one reference trial
each; then the pooled rows put every phase of every seed together, each centred on its own seed's every-step
value: SD / RMS SE there is the SE's honesty over ``seeds x (k - 1)`` degrees of freedom, and "seeds" compares the
spread of the seeds' every-step values (estimation noise plus the trajectories' own differences) with their SE.
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


def reference_series(
    steps: int, batch: int, lr: float, seed: int, accum: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(step, |G|^2, tr Sigma)`` per step of a tiny trial measuring global GNS at every step (``halves`` at
    ``accum`` 1, ``micro-batches`` of ``batch / accum`` above)."""
    cfg = TrialConfig(
        preset="tiny", batch_size=batch, micro_batch_size=batch // accum, grad_accum=accum, lr=lr, seed=seed,
        max_steps=steps,
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


def _row(window: int, k: int, n: int, vals: np.ndarray, ses: np.ndarray, base_se: float | None, bad: int) -> str:
    rms = float(np.sqrt(np.mean(ses**2))) if len(vals) else math.nan
    sd = float(vals.std(ddof=1)) if len(vals) > 1 else math.nan
    ratio = rms / base_se if base_se else math.nan
    mean = float(vals.mean()) if len(vals) else math.nan
    return (
        f"{window:6d} {k:3d} {n:4d} {mean:26.3f} {sd:7.3f} {rms:7.3f} {sd / rms:6.2f} {ratio:10.2f} "
        f"{rms / mean:7.1%} {bad:6d}"
    )


HEAD = (
    f"{'window':>6s} {'k':>3s} {'n':>4s} {'B_simple (mean of phases)':>26s} {'SD':>7s} {'RMS SE':>7s} "
    f"{'SD/SE':>6s} {'SE/SE(k=1)':>10s} {'rel SE':>7s} {'not ok':>6s}"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--accum", type=int, default=1, help="1: halves; >= 2: micro-batches of batch / accum")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--k", type=int, nargs="+", default=[1, 5, 10, 20, 40])
    p.add_argument("--windows", type=int, nargs="+", default=[100, 320, 800])
    args = p.parse_args()
    mode = "halves" if args.accum == 1 else f"micro-batches of {args.batch // args.accum}"
    series = {}
    for seed in args.seeds:
        t0 = time.perf_counter()
        series[seed] = reference_series(args.steps, args.batch, args.lr, seed, args.accum)
        step = series[seed][0]
        print(
            f"tiny, digits, B = {args.batch} ({mode}), lr {args.lr:g}, seed {seed}: {len(step)} steps measured in "
            f"{time.perf_counter() - t0:.0f} s; window ending at step {int(step[-1])}",
            flush=True,
        )
    pooled: dict = {}
    for seed, (step, g2, tr) in series.items():
        print(f"seed {seed}\n{HEAD}")
        for window in args.windows:
            base_se, centre = None, None
            for k in args.k:
                est = phases(step, g2, tr, k, window)
                ok = [e for e in est if e.ok]
                vals, ses = np.array([e.value for e in ok]), np.array([e.se for e in ok])
                if k == 1 and ok:
                    base_se, centre = float(ses[0]), float(vals[0])
                    pooled.setdefault((window, "seeds"), []).append((centre, base_se))
                print(_row(window, k, est[0].n, vals, ses, base_se, len(est) - len(ok)))
                if k > 1 and centre is not None:
                    pooled.setdefault((window, k), []).extend((v - centre, e) for v, e in zip(vals, ses, strict=True))
    if len(series) > 1:
        print("pooled over seeds: each phase's deviation from its seed's every-step value (SD over seeds x k values, "
              "ddof = seeds); 'seeds': the seeds' every-step values and SEs")  # fmt: skip
        print(f"{'window':>6s} {'k':>5s} {'values':>6s} {'SD':>7s} {'RMS SE':>7s} {'SD/SE':>6s}")
        for (window, k), pairs in sorted(pooled.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            v, e = np.array(pairs).T
            rms = float(np.sqrt(np.mean(e**2)))
            if k == "seeds":
                sd = float(v.std(ddof=1))
            else:  # deviations from each seed's centre, which is ~ its phases' mean: seeds x (k - 1) dof
                sd = float(np.sqrt(np.sum(v**2) / (len(v) - len(series))))
            print(f"{window:6d} {k!s:>5s} {len(v):6d} {sd:7.3f} {rms:7.3f} {sd / rms:6.2f}")


if __name__ == "__main__":
    main()
