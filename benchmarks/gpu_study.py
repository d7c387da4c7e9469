"""A short critical-batch-size study on one GPU where Ray and MLflow are not installed (the lent device's image):
the sweep's trials run one after another through `run_local` (the same `train_loop` a Tune trial runs), and their
rows go into a sweep directory through orchestrator.records.runs_tables (the files `bcrit sweep` writes), so that
``bcrit analyze DIR`` reads it like any sweep. What differs from `bcrit sweep`: no Tune scheduling (one trial at a
time), no MLflow run, no checkpoints.

The data are synthetic, learnable latents at fast-DiT's shape (4x32x32, ``--n`` of them, ``--classes`` classes):
each example is its class's smooth mean field plus ``--rank`` smooth fields with N(0, 1) weights plus 5% white
noise, scaled to unit variance. Smooth fields are 4x8x8 Gaussian draws upsampled to 32x32. The denoising loss has
structure to learn at every timestep, unlike white-noise latents.

Grid: every batch size of ``--batch-sizes`` at learning rates ``--lr`` x sqrt(B / 256) x each ``--lr-mults``, for
``--steps`` x sqrt(256 / B) steps (at least ``--min-steps``), trials ordered lr-multiplier-major so that a time budget
(``--budget-s``) cut short still leaves whole batch-size columns. The sweep directory is compacted after each trial.

    PYTHONPATH=. python benchmarks/gpu_study.py --out /tmp/gpu-study --device cuda --budget-s 240
    PYTHONPATH=. .venv/bin/python benchmarks/gpu_study.py --out /tmp/s --device cpu --preset tiny \
        --batch-sizes 8 16 32 --lr-mults 1 --steps 40 --n 512 --eval-size 64
    .venv/bin/bcrit analyze /tmp/gpu-study --no-mlflow
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np

from analysis.core import metrics as M
from orchestrator.records.runs_tables import RunsTables, trial_row
from trainables.config import TrialConfig
from trainables.data.latent_store import pack
from trainables.trial import run_local


def smooth(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` smooth 4x32x32 fields: 4x8x8 standard-normal draws, each value repeated over a 4x4 patch."""
    return np.repeat(np.repeat(rng.standard_normal((n, 4, 8, 8)), 4, axis=2), 4, axis=3)


def make_latents(root: str, n: int, classes: int, rank: int, seed: int = 0) -> None:
    """A fast-DiT latent folder of ``n`` examples (see the module docstring)."""
    rng = np.random.default_rng(seed)
    means, basis = smooth(rng, classes), smooth(rng, rank) / math.sqrt(rank)
    y = np.arange(n) % classes
    x = means[y] + np.einsum("nr,rchw->nchw", rng.standard_normal((n, rank)), basis)
    x += 0.05 * rng.standard_normal(x.shape)
    x = (x / x.std()).astype(np.float32)
    for d in ("imagenet256_features", "imagenet256_labels"):
        os.makedirs(os.path.join(root, d))
    for i in range(n):
        np.save(os.path.join(root, "imagenet256_features", f"{i}.npy"), x[i : i + 1])
        np.save(os.path.join(root, "imagenet256_labels", f"{i}.npy"), np.array([y[i]], np.int64))


def run(args) -> None:
    tables = RunsTables(args.out)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder, store = os.path.join(tmp, "lat"), os.path.join(tmp, "store")
        make_latents(folder, args.n, args.classes, args.rank)
        pack(folder, store, progress=False)
        print(f"data: {args.n} latents packed in {time.perf_counter() - t_start:.1f} s", flush=True)
        done = []
        for mult in args.lr_mults:
            for b in args.batch_sizes:
                if time.perf_counter() - t_start > args.budget_s:
                    break
                steps = max(args.min_steps, round(args.steps * math.sqrt(256 / b)))
                lr = args.lr * math.sqrt(b / 256) * mult
                cfg = TrialConfig(
                    preset=args.preset, dataset=store, eval_size=args.eval_size, eval_repeats=2, batch_size=b,
                    micro_batch_size=b, max_steps=steps, eval_every=max(1, steps // args.evals), lr=lr, seed=0,
                    warmup_steps=min(50, steps // 10), use_gpu=args.device == "cuda", gns_every=args.gns_every,
                    threads_per_worker=1,
                )  # fmt: skip
                t0 = time.perf_counter()
                session = run_local(cfg)
                tid = f"b{b}_lr{mult:g}"
                last = session.reports[-1]
                tables.write_trial(trial_row(tid, cfg.to_dict(), last["status"], last))
                tables.add_rows(tid, [r for rep in session.reports for r in rep["rows"]])
                tables.compact()
                done.append(tid)
                print(
                    f"{tid}: {steps} steps at lr {lr:.2e} in {time.perf_counter() - t0:.1f} s, "
                    f"eval loss {last[M.EVAL_LOSS]:.4f}, {last['status']}",
                    flush=True,
                )
    print(f"{len(done)} trials in {time.perf_counter() - t_start:.0f} s (budget {args.budget_s:.0f} s)", flush=True)
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump({**vars(args), "trials": done, "seconds": time.perf_counter() - t_start}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the sweep directory to write")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--preset", default="DiT-S/2")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    ap.add_argument("--lr", type=float, default=4e-4, help="learning rate at B = 256 (sqrt-scaled)")
    ap.add_argument("--lr-mults", type=float, nargs="+", default=[1.0, 2.0, 0.5])
    ap.add_argument("--steps", type=int, default=300, help="steps at B = 256 (sqrt-scaled)")
    ap.add_argument("--min-steps", type=int, default=100)
    ap.add_argument("--evals", type=int, default=20, help="held-out evaluations per trial")
    ap.add_argument("--eval-size", type=int, default=1024)
    ap.add_argument("--gns-every", type=int, default=100, help="per-bin GNS cadence in steps")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no trial after this many seconds")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
