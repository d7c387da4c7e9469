"""Training throughput of the trial inside Ray Train vs a bare PyTorch loop, side by side in one run.

Same model (preset), batch, threads (1) and steps. The bare loop is the textbook one: a fixed digits batch,
`torch.randn` noise, uniform timesteps, AdamW. The trial runs as a `TorchTrainer` with one worker actor, GNS off,
one evaluation at the end (evaluation time is excluded from the trial's `train_seconds`). The ratio is
examples/s (trial) / examples/s (bare), start-up excluded; start-up seconds are reported separately
(`fit()` wall time minus training time). Repetitions are interleaved; medians are reported.

    python benchmarks/bench_trial_throughput.py --preset tiny --batch 64 --steps 150 --reps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from trainables.config import TrialConfig
from trainables.data import load_dataset
from trainables.diffusion import make_scheduler, per_example_loss
from trainables.presets import build_dit
from trainables.trial import build_trainer, ensure_ray


def bare_loop(preset: str, batch: int, steps: int) -> float:
    """examples/s of a plain PyTorch loop."""
    torch.set_num_threads(1)
    data = load_dataset("digits", 297)
    info = data.info
    torch.manual_seed(0)
    model = build_dit(preset, sample_size=info.image_size, in_channels=info.channels, num_classes=info.num_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = make_scheduler()
    x, y = data.get(torch.arange(batch).numpy())
    t0 = time.perf_counter()
    for _ in range(steps):
        t = torch.randint(0, 1000, (batch,))
        noise = torch.randn_like(x)
        loss = per_example_loss(model, sched, x, y, t, noise).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return batch * steps / (time.perf_counter() - t0)


def ray_trial(preset: str, batch: int, steps: int, storage: str) -> tuple[float, float]:
    """(examples/s excluding start-up, start-up seconds) of the trial in a 1-worker TorchTrainer."""
    cfg = TrialConfig(
        preset=preset, batch_size=batch, micro_batch_size=batch, num_workers=1, max_steps=steps,
        eval_every=steps, report_every=steps, eval_repeats=1, gns=False, threads_per_worker=1,
    )  # fmt: skip
    t0 = time.perf_counter()
    result = build_trainer(cfg, name=f"bench-{time.time_ns()}", storage_path=storage).fit()
    wall = time.perf_counter() - t0
    s = result.return_value
    return s["examples"] / s["train_seconds"], wall - s["train_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    ensure_ray()
    bare, trial, startup = [], [], []
    with tempfile.TemporaryDirectory() as storage:
        for r in range(args.reps):
            bare.append(bare_loop(args.preset, args.batch, args.steps))
            thr, up = ray_trial(args.preset, args.batch, args.steps, storage)
            trial.append(thr)
            startup.append(up)
            print(f"rep {r}: bare {bare[-1]:.0f} ex/s   ray trial {thr:.0f} ex/s   start-up {up:.1f} s", flush=True)
    b, t = statistics.median(bare), statistics.median(trial)
    print(
        f"preset {args.preset} batch {args.batch} steps {args.steps}: bare {b:.0f} ex/s, ray trial {t:.0f} ex/s, "
        f"ratio {t / b:.3f} (target >= 0.95); trial start-up {statistics.median(startup):.1f} s (median)"
    )


if __name__ == "__main__":
    main()
