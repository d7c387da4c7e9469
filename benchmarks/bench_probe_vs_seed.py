"""Cost and standard error of one per-bin GNS estimate: ``bcrit probe`` vs the seed repo's default procedure.

Both on the same checkpoint (a tiny DiT trained ``--train-steps`` steps on the shipped digits) and the same bins,
examples drawn by the same bin-restricted sampler (``trainables.gns_bins.draw_examples``), so only the estimator
differs. The seed's procedure (REFERENCE.md mistakes 1-3; seed 004, defaults ``b=50, B=5000, reps=2``), kept
*here only* for the comparison:

- each repetition draws a fresh "true" gradient of ``B`` examples and a small one of ``b`` examples, each computed
  as sub-batches of 32 plus a remainder whose mean gradients are averaged with **equal weights**;
- ``|G|^2 ~ (B |G_B|^2 - b |G_b|) / (B - b)`` with the small-batch norm **unsquared**;
- ``tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)`` from that single draw, ``GNS = tr / |G|^2`` per repetition,
  repetitions with ``|G|^2 <= 0`` **dropped**, the rest averaged; no error bar. Its spread is measured here by
  running the whole procedure ``--seed-runs`` times with independent draws.

Ours: ``trainables.probe.probe`` (unbiased two-batch estimators of McCandlish et al. 2018, arXiv 1812.06162,
App. A.1; ``B_simple = mean(tr) / mean(|G|^2)`` over repetitions with a delta-method SE). A long run of ours
(``--ref-reps``) gives the reference value both are compared with.

    .venv/bin/python benchmarks/bench_probe_vs_seed.py --bins 4 --probe-bins 0 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

import numpy as np
import torch

from analysis.core.bins import timestep_bins
from analysis.core.gns import b_simple_with_se, g2_unbiased, trace_unbiased
from trainables.config import TrialConfig
from trainables.diffusion import make_scheduler, per_example_loss
from trainables.gns_bins import draw_examples, sub_batch_sq_norms
from trainables.probe import load_model
from trainables.randomness import mix
from trainables.trial import run_local

SEED_CHUNK = 32  # the seed repo's sub-batch size


def seed_gradient(model, params, sched, batch, chunk: int = SEED_CHUNK) -> torch.Tensor:
    """The seed's batch gradient: chunks of 32 (+ remainder), chunk mean gradients averaged with equal weights."""
    x, y, t, noise = batch
    grads = []
    for s in range(0, len(t), chunk):
        sl = slice(s, s + chunk)
        loss = per_example_loss(model, sched, x[sl], y[sl], t[sl], noise[sl]).mean()
        grads.append(torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, params)]))
    return torch.stack(grads).mean(0)  # equal weights: a remainder chunk counts as much as a full one


def seed_estimate(model, params, sched, data, lo, hi, p_drop, b, B, reps, key) -> tuple[float, int]:
    """One run of the seed procedure for one bin: ``(GNS, per-example gradients spent)``."""
    kept, spent = [], 0
    for r in range(reps):
        big = seed_gradient(model, params, sched, draw_examples(data, mix(key, r, 0), B, lo, hi, p_drop))
        small = seed_gradient(model, params, sched, draw_examples(data, mix(key, r, 1), b, lo, hi, p_drop))
        spent += B + b
        g2_big, g_small = float(big @ big), float(small.norm())
        g2 = (B * g2_big - b * g_small) / (B - b)  # mistake 1: |G_b| unsquared
        tr = (g_small**2 - g2_big) / (1 / b - 1 / B)
        if g2 > 0:  # mistake 3: negative draws dropped
            kept.append(tr / g2)
    return (statistics.fmean(kept) if kept else math.nan), spent


def ours(model, params, sched, data, lo, hi, p_drop, b, B, reps, key) -> tuple[float, float, int]:
    """The probe's estimate for one bin: ``(B_simple, SE, per-example gradients spent)``."""
    g2s, trs = [], []
    for r in range(reps):
        small, big = sub_batch_sq_norms(
            model, params, sched, draw_examples(data, mix(key, r), B, lo, hi, p_drop), b, torch.device("cpu")
        )
        g2s.append(float(g2_unbiased(small, big, b, B)))
        trs.append(float(trace_unbiased(small, big, b, B)))
    bs, se = b_simple_with_se(g2s, trs)
    return bs, se, reps * B


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-steps", type=int, default=100)
    p.add_argument("--bins", type=int, default=4)
    p.add_argument("--probe-bins", type=int, nargs="+", default=[0, 3])
    p.add_argument("--b", type=int, default=16)
    p.add_argument("--B", type=int, default=64)
    p.add_argument("--reps", type=int, default=16)
    p.add_argument("--seed-b", type=int, default=50)
    p.add_argument("--seed-B", type=int, default=5000)
    p.add_argument("--seed-reps", type=int, default=2)
    p.add_argument("--seed-runs", type=int, default=4, help="independent runs of the seed procedure (its spread)")
    p.add_argument("--ours-runs", type=int, default=4, help="independent runs of ours (spread vs reported SE)")
    p.add_argument("--ref-reps", type=int, default=200, help="repetitions of ours for the reference value")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        cfg = TrialConfig(preset="tiny", batch_size=32, micro_batch_size=32, max_steps=args.train_steps, lr=2e-3)
        cfg = cfg.replace(eval_every=args.train_steps, eval_repeats=1, timestep_bins=args.bins, gns_every=0)
        ckpt = run_local(cfg, checkpoint_root=root).checkpoints[-1]
        cfg, model, data, step = load_model(ckpt)
    sched, params = make_scheduler(), [q for q in model.parameters() if q.requires_grad]
    print(f"checkpoint: tiny DiT on digits after {step} steps (B=32, lr 2e-3); {args.bins} bins; 1 thread")
    print(f"ours: b={args.b} B={args.B} reps={args.reps}   seed: b={args.seed_b} B={args.seed_B} reps={args.seed_reps}")
    bins = timestep_bins(args.bins)
    for k in args.probe_bins:
        lo, hi = bins[k]
        ref, ref_se, _ = ours(model, params, sched, data, lo, hi, cfg.class_dropout, args.b, args.B, args.ref_reps, 999)
        rows = []
        for run in range(args.ours_runs):
            t0 = time.perf_counter()
            bs, se, n = ours(model, params, sched, data, lo, hi, cfg.class_dropout, args.b, args.B, args.reps, run)
            rows.append(("ours", bs, se, n, time.perf_counter() - t0))
        for run in range(args.seed_runs):
            t0 = time.perf_counter()
            gns, n = seed_estimate(
                model, params, sched, data, lo, hi, cfg.class_dropout, args.seed_b, args.seed_B, args.seed_reps, run
            )
            rows.append(("seed", gns, math.nan, n, time.perf_counter() - t0))
        print(f"\nbin {k} (t {lo}..{hi}): reference B_simple {ref:.3f} ± {ref_se:.3f} (ours, {args.ref_reps} reps)")
        for name in ("ours", "seed"):
            sel = [r for r in rows if r[0] == name]
            vals = np.array([r[1] for r in sel])
            se_txt = f"reported SE {statistics.fmean(r[2] for r in sel):.3f}, " if name == "ours" else "no SE, "
            print(
                f"  {name}: estimates {', '.join(f'{v:.3f}' for v in vals)}  mean {vals.mean():.3f}  "
                f"({se_txt}spread SD {vals.std(ddof=1):.3f})  per-example gradients {sel[0][3]}  "
                f"seconds {statistics.median(r[4] for r in sel):.1f} (median)"
            )


if __name__ == "__main__":
    main()
